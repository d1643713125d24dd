package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRetryAfterSecondsAndHTTPDates(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cases := map[string]float64{
		"":                              -1,
		"1.5":                           1.5,
		"-3":                            0,
		"soon":                          -1,
		"Wed, 02 Dec 2026 12:00:30 GMT": 30,
		"Wed, 02 Dec 2026 11:00:00 GMT": 0,
	}
	for value, want := range cases {
		if got := retryAfterSeconds(value, now); got != want {
			t.Errorf("retryAfterSeconds(%q) = %v, want %v", value, got, want)
		}
	}
}

func TestScrubRemovesTheKeyAndKeyShapes(t *testing.T) {
	got := scrub("bad key sk-live-0123456789 and Bearer abcdefghijkl and mine: s3cr3t-token", "s3cr3t-token")
	if strings.Contains(got, "0123456789") || strings.Contains(got, "abcdefghijkl") || strings.Contains(got, "s3cr3t") {
		t.Fatalf("not scrubbed: %q", got)
	}
}

func TestErrorMessageShapes(t *testing.T) {
	cases := []struct{ raw, reason, want string }{
		{`{"error": {"message": "slow down"}}`, "Too Many Requests", "slow down"},
		{`{"error": "plain"}`, "", "plain"},
		{`{"other": 1}`, "Bad Gateway", "Bad Gateway"},
		{`{"object": "error", "message": "context too long", "code": 400}`, "Bad Request", "context too long"},
		{`not json`, "Bad Gateway", "not json"},
		{``, "", "error"},
	}
	for _, c := range cases {
		if got := errorMessage([]byte(c.raw), c.reason); got != c.want {
			t.Errorf("errorMessage(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
	if got := errorMessage([]byte(strings.Repeat("é", 600)), ""); len([]rune(got)) != errorMessageChars {
		t.Errorf("not truncated to %d characters: %d", errorMessageChars, len([]rune(got)))
	}
}

func TestKeyFileWinsAndIsReReadWhenRotated(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key")
	os.WriteFile(path, []byte("sk-first\n"), 0o600)
	t.Setenv("EVALKUBE_GO_TEST_KEY", "sk-env")
	env, file := "EVALKUBE_GO_TEST_KEY", path
	provider := newProvider("p", ProviderConfig{BaseURL: "http://x", APIKeyEnv: &env, APIKeyFile: &file, Timeout: 1})
	if got := provider.APIKey(); got != "sk-first" {
		t.Fatalf("key %q", got)
	}
	replacement := filepath.Join(dir, "key.new")
	os.WriteFile(replacement, []byte("sk-second\n"), 0o600)
	os.Rename(replacement, path)
	if got := provider.APIKey(); got != "sk-second" {
		t.Fatalf("rotated key %q", got)
	}
	os.Remove(path)
	if got := provider.APIKey(); got != "sk-env" {
		t.Fatalf("fallback key %q", got)
	}
}

func TestRetriesHonourRetryAfterThenSucceed(t *testing.T) {
	calls := 0
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(429)
			return
		}
		w.Write([]byte(`{"id": "resp_1", "usage": {"input_tokens": 2}}`))
	}))
	defer server.Close()
	var reasons []string
	upstream := NewUpstream(Config{MaxConnections: 4, Retries: 2, BackoffMax: 30, Providers: map[string]ProviderConfig{
		"p": {BaseURL: server.URL, Timeout: 5},
	}})
	upstream.OnRetry = func(provider, reason string) { reasons = append(reasons, provider+":"+reason) }
	raw, answer, failure := upstream.Post("p", "/responses", []byte(`{}`))
	if failure != nil || string(answer.ID) != `"resp_1"` || len(raw) == 0 {
		t.Fatalf("post: %v %s", failure, answer.ID)
	}
	if calls != 2 || len(reasons) != 1 || reasons[0] != "p:429" {
		t.Fatalf("calls %d, retries %v", calls, reasons)
	}
}

func TestInvalidAnswersAreNotRetried(t *testing.T) {
	calls := 0
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Write([]byte(`[1, 2]`))
	}))
	defer server.Close()
	upstream := NewUpstream(Config{MaxConnections: 4, Retries: 3, Providers: map[string]ProviderConfig{
		"p": {BaseURL: server.URL, Timeout: 5},
	}})
	_, _, failure := upstream.Post("p", "/responses", []byte(`{}`))
	if failure == nil || failure.Kind != "invalid_response" || calls != 1 {
		t.Fatalf("failure %+v after %d calls", failure, calls)
	}
	if !strings.Contains(failure.Message, "non-object") {
		t.Fatalf("message %q", failure.Message)
	}
}

// Every attempt the provider received is counted (it may be billed), one that never left is not.
func TestRequestsCountWhatReachedTheProvider(t *testing.T) {
	calls := 0
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		switch calls {
		case 1:
			w.WriteHeader(503)
		case 2: // read, then the connection dropped unanswered
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		default:
			w.Write([]byte(`{"id": "resp_3"}`))
		}
	}))
	defer server.Close()
	upstream := NewUpstream(Config{MaxConnections: 4, Retries: 3, BackoffBase: 0.01, BackoffMax: 1, Providers: map[string]ProviderConfig{
		"p": {BaseURL: server.URL, Timeout: 5},
	}})
	_, answer, failure := upstream.Post("p", "/responses", []byte(`{}`))
	if failure != nil || answer.Requests != 3 || calls != 3 {
		t.Fatalf("failure %v, requests %d, calls %d", failure, answer.Requests, calls)
	}
	address := server.Listener.Addr().String()
	server.Close() // nothing listens there any more
	closed := NewUpstream(Config{MaxConnections: 4, Retries: 2, BackoffBase: 0.01, BackoffMax: 1, Providers: map[string]ProviderConfig{
		"p": {BaseURL: "http://" + address, Timeout: 5},
	}})
	_, _, failure = closed.Post("p", "/responses", []byte(`{}`))
	if failure == nil || failure.Kind != "unreachable" || failure.Requests != 0 {
		t.Fatalf("failure %+v", failure)
	}
}
