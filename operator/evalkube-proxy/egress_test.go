package main

// The proxy's upstream through a real gateway: calls pass with the grant file's grant, follow
// a rotated grant file, and fail as "unreachable" with the gateway's reason when refused.

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func egressUpstream(t *testing.T, provider, gateway, grantFile string) *Upstream {
	t.Helper()
	config := defaultConfig()
	config.Retries = 0
	config.EgressProxy = &gateway
	config.EgressGrantFile = &grantFile
	config.Providers = map[string]ProviderConfig{"fake": {BaseURL: provider + "/v1", Timeout: 5}}
	if err := checkEgress(config); err != nil {
		t.Fatal(err)
	}
	return NewUpstream(config)
}

func TestUpstreamThroughTheGateway(t *testing.T) {
	fixture := startGateway(t)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" {
			t.Error("the provider saw the grant")
		}
		io.WriteString(w, `{"id":"resp_1"}`)
	}))
	defer provider.Close()
	grantFile := filepath.Join(t.TempDir(), "grant")
	upstream := egressUpstream(t, provider.URL, fixture.server.URL, grantFile)

	// No grant file yet: the call fails naming it, and nothing is sent.
	_, _, failure := upstream.Post("fake", "/responses", []byte(`{}`))
	if failure == nil || failure.Kind != "unreachable" || !strings.Contains(failure.Message, "egress grant "+grantFile) {
		t.Fatalf("without a grant file: %+v", failure)
	}
	// A grant for another destination: the gateway's 403, told apart from a provider's.
	os.WriteFile(grantFile, []byte(mint(testKey, []string{"elsewhere:443"}, time.Now().Add(time.Hour))+"\n"), 0o600)
	_, _, failure = upstream.Post("fake", "/responses", []byte(`{}`))
	if failure == nil || failure.Kind != "unreachable" || !strings.Contains(failure.Message, "egress gateway refused: Forbidden") {
		t.Fatalf("with a grant for another host: %+v", failure)
	}
	// The Secret is updated in place: the next call uses the new grant.
	time.Sleep(10 * time.Millisecond) // a distinct modification time
	os.WriteFile(grantFile, []byte(mint(testKey, []string{authority(t, provider.URL)}, time.Now().Add(time.Hour))), 0o600)
	raw, answer, failure := upstream.Post("fake", "/responses", []byte(`{}`))
	if failure != nil || string(answer.ID) != `"resp_1"` || string(raw) != `{"id":"resp_1"}` {
		t.Fatalf("with the run's grant: %s %+v", raw, failure)
	}
}

func TestUpstreamTLSRefusedByTheGateway(t *testing.T) {
	fixture := startGateway(t)
	grantFile := filepath.Join(t.TempDir(), "grant")
	os.WriteFile(grantFile, []byte(mint(testKey, []string{"elsewhere:443"}, time.Now().Add(time.Hour))), 0o600)
	upstream := egressUpstream(t, "https://127.0.0.1:9", fixture.server.URL, grantFile)
	_, _, failure := upstream.Post("fake", "/responses", []byte(`{}`))
	want := "provider fake is unreachable at https://127.0.0.1:9: connection failed (egress gateway refused: Forbidden)"
	if failure == nil || failure.Message != want {
		t.Fatalf("got %+v, want %q", failure, want)
	}
}

func TestEgressConfiguration(t *testing.T) {
	for _, raw := range []string{
		`{"listen": "127.0.0.1:0", "egress_proxy": "http://gw:3128"}`,
		`{"listen": "127.0.0.1:0", "egress_grant_file": "/g"}`,
		`{"listen": "127.0.0.1:0", "egress_proxy": "https://gw:3128", "egress_grant_file": "/g"}`,
		`{"listen": "127.0.0.1:0", "egress_proxy": "http://u:p@gw:3128", "egress_grant_file": "/g"}`,
	} {
		if _, err := parseConfig([]byte(raw)); err == nil {
			t.Errorf("accepted %s", raw)
		}
	}
	if _, err := parseConfig([]byte(`{"listen": "127.0.0.1:0", "egress_proxy": "http://10.0.0.1:3128", "egress_grant_file": "/g"}`)); err != nil {
		t.Fatal(err)
	}
}
