package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeProvider answers Responses calls, holding each request while hold is set (as a
// provider still thinking); received counts the requests it read.
type fakeProvider struct {
	server   *httptest.Server
	received atomic.Int32
	hold     atomic.Bool
	holding  chan struct{} // a request is held
	release  chan struct{}
}

func newFakeProvider(t *testing.T) *fakeProvider {
	f := &fakeProvider{holding: make(chan struct{}, 16), release: make(chan struct{})}
	f.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.received.Add(1)
		if f.hold.Load() {
			f.holding <- struct{}{}
			<-f.release
			return // the connection is dropped: the answer never arrives
		}
		id := "resp_" + strconv.Itoa(int(f.received.Load()))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id": "` + id + `", "output": [], "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}`))
	}))
	t.Cleanup(func() {
		close(f.release)
		f.server.Close()
	})
	return f
}

// proxyProcess is one life of the proxy: a service over the state directory, as serve builds it.
type proxyProcess struct {
	service *Service
	control http.Handler
	grader  http.Handler
	report  ReplayReport
}

func startProxy(t *testing.T, dir string, provider *fakeProvider) *proxyProcess {
	t.Helper()
	planned := 0
	config := Config{MaxConnections: 4, Retries: 0, Providers: map[string]ProviderConfig{
		"p": {BaseURL: provider.server.URL, Timeout: 30},
	}}
	service := &Service{
		Upstream: NewUpstream(config), JudgeModel: "p:judge", Budgets: NewBudgets("default", 0, &planned),
		Metrics: NewMetrics(), Usage: NewUsageLedger(),
	}
	journal, report, err := OpenJournal(dir, service.Budgets, service.Usage)
	if err != nil {
		t.Fatal(err)
	}
	service.Journal = journal
	apps := &Apps{Service: service}
	return &proxyProcess{service, apps.ControlHandler(), apps.GraderHandler(), report}
}

// kill ends this life: nothing it does afterwards reaches the journal.
func (p *proxyProcess) kill() { p.service.Journal.Close() }

// drop lets the held call of a killed proxy end (the provider drops it, unanswered).
func (f *fakeProvider) drop(held *sync.WaitGroup) {
	f.release <- struct{}{}
	held.Wait()
}

func request(t *testing.T, handler http.Handler, method, path, body string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, r)
	return w
}

func (p *proxyProcess) judge(t *testing.T, token string) int {
	return request(t, p.grader, "POST", "/v1/responses", `{"input": "x"}`, executionHeader, token).Code
}

func (p *proxyProcess) take(t *testing.T, tokens ...string) map[string]*ExecutionUsage {
	raw, _ := json.Marshal(map[string][]string{"execution_ids": tokens})
	w := request(t, p.control, "POST", "/evalkube/v1/usage:take", string(raw))
	var taken map[string]*ExecutionUsage
	if err := json.Unmarshal(w.Body.Bytes(), &taken); err != nil {
		t.Fatal(w.Body.String())
	}
	return taken
}

func (p *proxyProcess) configure(t *testing.T, maxCalls, planned int, tokens ...string) {
	body := `{"unit_id": "unit-1", "max_calls_per_execution": ` + strconv.Itoa(maxCalls) +
		`, "planned_executions": ` + strconv.Itoa(planned) + `}`
	if w := request(t, p.control, "PUT", "/evalkube/v1/budget", body); w.Code != 200 {
		t.Fatal(w.Body.String())
	}
	raw, _ := json.Marshal(map[string][]string{"tokens": tokens})
	if w := request(t, p.control, "POST", "/evalkube/v1/executions:open", string(raw)); w.Code != 200 {
		t.Fatal(w.Body.String())
	}
}

// heldCall starts a grader call (or with key, the runner's) the provider holds; it returns
// once the provider has the request.
func heldCall(t *testing.T, p *proxyProcess, provider *fakeProvider, handler http.Handler, headers ...string) *sync.WaitGroup {
	provider.hold.Store(true)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		request(t, handler, "POST", "/v1/responses", `{"input": "held"}`, headers...)
	}()
	select {
	case <-provider.holding:
	case <-time.After(10 * time.Second):
		t.Fatal("the held call never reached the provider")
	}
	provider.hold.Store(false)
	return &wg
}

func TestJournalReplayRestoresBudgetsTokensAndUsage(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	first := startProxy(t, dir, provider)
	first.configure(t, 2, 3, "a", "b", "c")
	if code := first.judge(t, "a"); code != 200 {
		t.Fatalf("call: %d", code)
	}
	first.take(t, "c")
	if code := first.judge(t, "c"); code != 403 {
		t.Fatalf("a taken token was served: %d", code)
	}
	first.kill()

	second := startProxy(t, dir, provider)
	snapshot := second.service.Budgets.Snapshot()
	// refused calls are not journaled (they cost nothing, and a grader can send them
	// without limit): their count starts again
	if snapshot.UnitID != "unit-1" || snapshot.Used != 1 || snapshot.OpenExecutions != 2 || *snapshot.Total != 6 ||
		len(snapshot.Refused) != 0 {
		t.Fatalf("budget not restored: %+v", snapshot)
	}
	if code := second.judge(t, "c"); code != 403 {
		t.Fatalf("a token taken before the restart was served: %d", code)
	}
	// a's execution had one call of its two: one more is served, the third refused
	if code := second.judge(t, "a"); code != 200 {
		t.Fatalf("second call: %d", code)
	}
	if code := second.judge(t, "a"); code != 429 {
		t.Fatalf("the execution budget was forgotten: %d", code)
	}
	usage := second.take(t, "a")["a"]
	if usage == nil || usage.Calls != 2 || usage.Usage["total_tokens"] != 14 || len(usage.ResponseIDs) != 2 ||
		usage.Retries != 0 {
		t.Fatalf("usage not restored: %+v", usage)
	}
	if second.report.Lost != 0 {
		t.Fatalf("nothing was lost: %+v", second.report)
	}
}

func TestACallSentButNeverAnsweredIsARetryAndGivesItsSlotBack(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	first := startProxy(t, dir, provider)
	first.configure(t, 1, 1, "a")
	held := heldCall(t, first, provider, first.grader, executionHeader, "a")
	first.kill() // the provider holds the call: its answer never reaches the proxy
	provider.drop(held)

	second := startProxy(t, dir, provider)
	if second.report.Lost != 1 || second.report.Unattributed != 0 {
		t.Fatalf("replay: %+v", second.report)
	}
	if used := second.service.Budgets.Snapshot().Used; used != 0 {
		t.Fatalf("the unanswered call kept its budget slot: used %d", used)
	}
	// ctx sends the call again: served within the execution's budget of one call
	if code := second.judge(t, "a"); code != 200 {
		t.Fatalf("the call sent again: %d", code)
	}
	// a second restart counts the lost request once, not twice
	second.kill()
	third := startProxy(t, dir, provider)
	usage := third.take(t, "a")["a"]
	if usage == nil || usage.Calls != 1 || usage.Retries != 1 {
		t.Fatalf("usage: %+v", usage)
	}
	if received := int(provider.received.Load()); received != usage.Calls+usage.Retries {
		t.Fatalf("the provider received %d requests, the usage counts %d", received, usage.Calls+usage.Retries)
	}
}

func TestTheRunnersCallSentAgainClaimsTheRequestsOfTheKilledProcess(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	first := startProxy(t, dir, provider)
	held := heldCall(t, first, provider, first.control, purposeHeader, "candidate", callKeyHeader, "k1")
	first.kill()
	provider.drop(held)

	second := startProxy(t, dir, provider)
	candidate := func(p *proxyProcess, key string) string {
		w := request(t, p.control, "POST", "/v1/responses", `{"input": "held"}`, purposeHeader, "candidate", callKeyHeader, key)
		if w.Code != 200 {
			t.Fatalf("candidate call: %d %s", w.Code, w.Body.String())
		}
		return w.Header().Get(requestsHeader)
	}
	if got := candidate(second, "other"); got != "1" {
		t.Fatalf("another call claimed the lost request: %s", got)
	}
	if got := candidate(second, "k1"); got != "2" {
		t.Fatalf("the call sent again reports %s requests, want 2 (the lost one and its own)", got)
	}
	second.kill()
	third := startProxy(t, dir, provider)
	if got := candidate(third, "k1"); got != "1" {
		t.Fatalf("the lost request was claimed twice: %s", got)
	}
	if received := provider.received.Load(); received != 4 {
		t.Fatalf("the provider received %d requests, want 4", received)
	}
}

func TestACallKilledTwiceCountsBothLostRequests(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	first := startProxy(t, dir, provider)
	held1 := heldCall(t, first, provider, first.control, callKeyHeader, "k")
	first.kill()
	provider.drop(held1)
	second := startProxy(t, dir, provider)
	held2 := heldCall(t, second, provider, second.control, callKeyHeader, "k")
	second.kill()
	provider.drop(held2)
	third := startProxy(t, dir, provider)
	w := request(t, third.control, "POST", "/v1/responses", `{"input": "held"}`, callKeyHeader, "k")
	if got := w.Header().Get(requestsHeader); w.Code != 200 || got != "3" {
		t.Fatalf("%d: %s requests, want 3", w.Code, got)
	}
}

func TestNoStateDirectoryJournalsNothing(t *testing.T) {
	var journal *Journal
	journal.Sent(journal.NextCall(), "e", "")
	journal.Take(nil)
	if journal.Claim("k") != 0 {
		t.Fatal("a nil journal claimed requests")
	}
}

func journalSize(t *testing.T, dir string) int64 {
	t.Helper()
	info, err := os.Stat(filepath.Join(dir, journalFile))
	if err != nil {
		t.Fatal(err)
	}
	return info.Size()
}

func TestRefusedCallsAddNothingToTheJournal(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	p := startProxy(t, dir, provider)
	p.configure(t, 1, 1, "a")
	before := journalSize(t, dir)
	for range 1000 {
		if code := p.judge(t, "forged"); code != 403 {
			t.Fatalf("a forged token was served: %d", code)
		}
	}
	if after := journalSize(t, dir); after != before {
		t.Fatalf("1,000 refused calls grew the journal from %d to %d bytes", before, after)
	}
}

func TestTheJournalStopsBelowItsLimitAndTheProxyServesOn(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	p := startProxy(t, dir, provider)
	p.service.Journal.maxBytes = journalSize(t, dir) + 600 // a unit's records and a call or two
	p.configure(t, 50, 1, "a")
	for i := range 20 {
		if code := p.judge(t, "a"); code != 200 {
			t.Fatalf("call %d past the journal's limit: %d", i, code)
		}
	}
	if size := journalSize(t, dir); size > p.service.Journal.maxBytes {
		t.Fatalf("the journal grew to %d bytes past its limit of %d", size, p.service.Journal.maxBytes)
	}
	if !p.service.Journal.failed {
		t.Fatal("the journal did not give up at its limit")
	}
}

func TestALineCutShortByTheKillDoesNotSwallowTheNextLifesFirstRecord(t *testing.T) {
	dir, provider := t.TempDir(), newFakeProvider(t)
	first := startProxy(t, dir, provider)
	first.configure(t, 2, 1, "a")
	first.kill()
	// the killed process was writing a record when it died
	path := filepath.Join(dir, journalFile)
	file, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := file.WriteString(`{"t":"done","call":`); err != nil {
		t.Fatal(err)
	}
	file.Close()
	second := startProxy(t, dir, provider)
	second.kill()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	if got := lines[len(lines)-2:]; got[0] != `{"t":"done","call":` || got[1] != `{"t":"start"}` {
		t.Fatalf("the next life's start record is not a line of its own: %q", got)
	}
}
