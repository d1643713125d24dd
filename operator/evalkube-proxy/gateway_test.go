package main

// The egress gateway on real loopback sockets: a TLS tunnel and a forwarded plain-HTTP call
// through it to httptest servers, and every refusal (no, garbled, forged, expired grant: 407;
// a destination outside the grant: 403, never dialed; not a proxy request: 400).

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

const testKey = "gateway-test-key-0123456789-0123456789-0123456789"

type gatewayFixture struct {
	gateway *Gateway
	server  *httptest.Server
	keyFile string
}

func startGateway(t *testing.T) *gatewayFixture {
	t.Helper()
	keyFile := filepath.Join(t.TempDir(), "grant-key")
	if err := os.WriteFile(keyFile, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Nothing denied: the destinations of these tests are loopback servers.
	gateway := NewGateway(keyFile, 2*time.Second, 5*time.Second, NewGatewayMetrics(), nil)
	server := httptest.NewUnstartedServer(gateway)
	server.Config = newGatewayServer(gateway) // the real server's limits
	server.Start()
	t.Cleanup(server.Close)
	return &gatewayFixture{gateway, server, keyFile}
}

func mint(key string, hosts []string, expires time.Time) string {
	payload, _ := json.Marshal(map[string]any{
		"v": 1, "run": "ns/run", "uid": "uid-1", "hosts": hosts, "exp": expires.Unix(),
	})
	return signGrant([]byte(key), payload)
}

func basic(grant string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("evalkube:"+grant))
}

func authority(t *testing.T, rawURL string) string {
	t.Helper()
	parsed, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return parsed.Host
}

// connectStatus sends CONNECT authority with the given Proxy-Authorization and returns the
// gateway's status and the open connection.
func connectStatus(t *testing.T, gateway, target, proxyAuthorization string) (int, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", authority(t, gateway))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	request := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if proxyAuthorization != "" {
		request += "Proxy-Authorization: " + proxyAuthorization + "\r\n"
	}
	if _, err := io.WriteString(conn, request+"\r\n"); err != nil {
		t.Fatal(err)
	}
	reader := bufio.NewReader(conn)
	response, err := http.ReadResponse(reader, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return response.StatusCode, conn, reader
}

// countingListener is a destination that records whether anything ever connected to it.
func countingListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { listener.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	return listener.Addr().String(), &accepted
}

func TestGatewayTunnelsTLS(t *testing.T) {
	fixture := startGateway(t)
	var sawProxyAuth atomic.Bool
	provider := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawProxyAuth.Store(r.Header.Get("Proxy-Authorization") != "")
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"echo":%q}`, body)
	}))
	defer provider.Close()
	grant := mint(testKey, []string{authority(t, provider.URL)}, time.Now().Add(time.Hour))
	gatewayURL, _ := url.Parse(fixture.server.URL)
	gatewayURL.User = url.UserPassword("evalkube", grant) // what the proxy sidecar sends
	transport := provider.Client().Transport.(*http.Transport).Clone()
	transport.Proxy = http.ProxyURL(gatewayURL)
	client := &http.Client{Transport: transport, Timeout: 5 * time.Second}
	response, err := client.Post(provider.URL+"/v1/responses", "application/json", strings.NewReader("hello"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(response.Body)
	response.Body.Close()
	if response.StatusCode != 200 || string(body) != `{"echo":"hello"}` {
		t.Fatalf("through the tunnel: %d %s", response.StatusCode, body)
	}
	if sawProxyAuth.Load() {
		t.Fatal("the provider saw Proxy-Authorization")
	}
	transport.CloseIdleConnections()
	metrics := fixture.gateway.Metrics
	if got := value(metrics.requests.WithLabelValues("connect", "ok")); got != 1 {
		t.Fatalf("connect ok = %v", got)
	}
	deadline := time.Now().Add(2 * time.Second)
	for value(metrics.tunnels) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if open := value(metrics.tunnels); open != 0 {
		t.Fatalf("%v tunnels still open after the client closed", open)
	}
	if up := value(metrics.bytes.WithLabelValues("up")); up < 100 {
		t.Fatalf("only %v bytes counted up (a TLS handshake is more)", up)
	}
}

func TestGatewayForwardsPlainHTTP(t *testing.T) {
	fixture := startGateway(t)
	received := make(chan *http.Request, 1)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		received <- r.Clone(r.Context())
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"resp_1","body":`+string(body)+`}`)
	}))
	defer provider.Close()
	grant := mint(testKey, []string{authority(t, provider.URL)}, time.Now().Add(time.Hour))
	request, _ := http.NewRequest(http.MethodPost, provider.URL+"/v1/responses", strings.NewReader(`{"a":1}`))
	request.Header.Set("Proxy-Authorization", "Bearer "+grant)
	request.Header.Set("Authorization", "Bearer sk-provider-key")
	request.Header.Set("Connection", "X-Hop")
	request.Header.Set("X-Hop", "must not pass")
	request.Header.Set("X-Forwarded-For", "1.2.3.4")
	gatewayURL, _ := url.Parse(fixture.server.URL)
	// Header-level Proxy-Authorization with a ProxyURL without userinfo: Bearer, as sent.
	transport := &http.Transport{Proxy: http.ProxyURL(gatewayURL)}
	defer transport.CloseIdleConnections()
	response, err := (&http.Client{Transport: transport, Timeout: 5 * time.Second}).Do(request)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(response.Body)
	response.Body.Close()
	if response.StatusCode != 200 || string(body) != `{"id":"resp_1","body":{"a":1}}` {
		t.Fatalf("forwarded: %d %s", response.StatusCode, body)
	}
	seen := <-received
	if seen.Header.Get("Proxy-Authorization") != "" || seen.Header.Get("X-Hop") != "" ||
		seen.Header.Get("X-Forwarded-For") != "" {
		t.Fatalf("hop-by-hop or proxy headers reached the provider: %v", seen.Header)
	}
	if seen.Header.Get("Authorization") != "Bearer sk-provider-key" || seen.URL.Path != "/v1/responses" {
		t.Fatalf("the provider's own request was changed: %v %v", seen.URL, seen.Header)
	}
	if got := value(fixture.gateway.Metrics.requests.WithLabelValues("http", "ok")); got != 1 {
		t.Fatalf("http ok = %v", got)
	}
}

func TestGatewayRefusesWithoutAValidGrant(t *testing.T) {
	fixture := startGateway(t)
	target, accepted := countingListener(t)
	good := mint(testKey, []string{target}, time.Now().Add(time.Hour))
	signed, mac, _ := strings.Cut(good[len(grantPrefix):], ".")
	payload, _ := base64.RawURLEncoding.DecodeString(signed)
	widened := strings.Replace(string(payload), `"hosts":[`, `"hosts":["evil.example:443",`, 1)
	cases := map[string]string{
		"missing":          "",
		"garbled":          basic("not-a-grant"),
		"garbled base64":   "Basic !!!",
		"wrong user":       "Basic " + base64.StdEncoding.EncodeToString([]byte("grader:"+good)),
		"tampered payload": basic(grantPrefix + base64.RawURLEncoding.EncodeToString([]byte(widened)) + "." + mac),
		"another key":      basic(mint("some-other-key-0123456789-0123456789-01234", []string{target}, time.Now().Add(time.Hour))),
		"expired":          basic(mint(testKey, []string{target}, time.Now().Add(-time.Second))),
		"unknown scheme":   "Digest " + good,
	}
	for name, header := range cases {
		if status, _, _ := connectStatus(t, fixture.server.URL, target, header); status != http.StatusProxyAuthRequired {
			t.Errorf("CONNECT, %s grant: %d, want 407", name, status)
		}
		request, _ := http.NewRequest(http.MethodPost, "http://"+target+"/v1/responses", strings.NewReader("{}"))
		if header != "" {
			request.Header.Set("Proxy-Authorization", header)
		}
		response := forward(t, fixture, request)
		if response.StatusCode != http.StatusProxyAuthRequired || response.Header.Get("Proxy-Authenticate") == "" ||
			response.Header.Get(refusedHeader) == "" {
			t.Errorf("HTTP, %s grant: %d %v, want 407 with Proxy-Authenticate", name, response.StatusCode, response.Header)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the destination was dialed %d times for refused requests", n)
	}
	// Sanity: the same destination with the good grant is dialed.
	if status, _, _ := connectStatus(t, fixture.server.URL, target, basic(good)); status != 200 {
		t.Fatalf("the good grant was refused: %d", status)
	}
}

func forward(t *testing.T, fixture *gatewayFixture, request *http.Request) *http.Response {
	t.Helper()
	gatewayURL, _ := url.Parse(fixture.server.URL)
	transport := &http.Transport{Proxy: http.ProxyURL(gatewayURL)}
	defer transport.CloseIdleConnections()
	response, err := transport.RoundTrip(request)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, response.Body)
	response.Body.Close()
	return response
}

func TestGatewayRefusesHostsOutsideTheGrant(t *testing.T) {
	fixture := startGateway(t)
	granted, _ := countingListener(t)
	other, accepted := countingListener(t)
	host, port, _ := net.SplitHostPort(granted)
	grant := basic(mint(testKey, []string{granted}, time.Now().Add(time.Hour)))
	for _, target := range []string{
		other,               // another port on the same host
		"localhost:" + port, // the same socket by another name
		"evil.example:443",  // elsewhere (never resolved: the check comes first)
		"127.0.0.2:" + port, // another loopback address
		strings.ToUpper(host) + "x:" + port,
	} {
		if status, _, _ := connectStatus(t, fixture.server.URL, target, grant); status != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d, want 403", target, status)
		}
	}
	request, _ := http.NewRequest(http.MethodGet, "http://"+other+"/", nil)
	request.Header.Set("Proxy-Authorization", grant)
	if response := forward(t, fixture, request); response.StatusCode != http.StatusForbidden {
		t.Errorf("HTTP to %s: %d, want 403", other, response.StatusCode)
	}
	// http://host/ means port 80, which is not granted either.
	request, _ = http.NewRequest(http.MethodGet, "http://"+host+"/", nil)
	request.Header.Set("Proxy-Authorization", grant)
	if response := forward(t, fixture, request); response.StatusCode != http.StatusForbidden {
		t.Errorf("HTTP to %s (port 80): %d, want 403", host, response.StatusCode)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("a destination outside the grant was dialed %d times", n)
	}
	if got := value(fixture.gateway.Metrics.requests.WithLabelValues("connect", "forbidden")); got != 5 {
		t.Fatalf("connect forbidden = %v", got)
	}
}

func TestGatewayRefusesNonProxyRequests(t *testing.T) {
	fixture := startGateway(t)
	target, _ := countingListener(t)
	grant := basic(mint(testKey, []string{target}, time.Now().Add(time.Hour)))
	host, _, _ := net.SplitHostPort(target)
	if status, _, _ := connectStatus(t, fixture.server.URL, host, grant); status != http.StatusBadRequest {
		t.Errorf("CONNECT without a port: %d, want 400", status)
	}
	// Origin-form (a request to the gateway itself) and https:// absolute-form.
	for _, raw := range []string{
		"GET /metrics HTTP/1.1\r\nHost: gateway\r\nProxy-Authorization: " + grant + "\r\n\r\n",
		"GET https://" + target + "/ HTTP/1.1\r\nHost: " + target + "\r\nProxy-Authorization: " + grant + "\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", authority(t, fixture.server.URL))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, raw)
		response, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || response.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %v %v, want 400", strings.SplitN(raw, "\r\n", 2)[0], response, err)
		}
	}
}

func TestGatewayFollowsKeyRotation(t *testing.T) {
	fixture := startGateway(t)
	target, _ := countingListener(t)
	newKey := "rotated-key-abcdefghijklmnopqrstuvwxyz-0123456789"
	oldGrant := basic(mint(testKey, []string{target}, time.Now().Add(time.Hour)))
	newGrant := basic(mint(newKey, []string{target}, time.Now().Add(time.Hour)))
	if status, _, _ := connectStatus(t, fixture.server.URL, target, newGrant); status != 407 {
		t.Fatalf("a grant of a key not yet installed: %d", status)
	}
	// Rotation: the new key first (the operator signs with it), the old one still accepted.
	os.WriteFile(fixture.keyFile, []byte(newKey+"\n"+testKey+"\n"), 0o600)
	for _, grant := range []string{oldGrant, newGrant} {
		if status, _, _ := connectStatus(t, fixture.server.URL, target, grant); status != 200 {
			t.Fatalf("during rotation: %d", status)
		}
	}
	os.WriteFile(fixture.keyFile, []byte(newKey+"\n"), 0o600)
	if status, _, _ := connectStatus(t, fixture.server.URL, target, oldGrant); status != 407 {
		t.Fatalf("a grant of a removed key: %d", status)
	}
}

func TestGatewayTunnelRelaysBytesBothWays(t *testing.T) {
	fixture := startGateway(t)
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		conn, err := echo.Accept()
		if err == nil {
			io.Copy(conn, conn)
			conn.Close()
		}
	}()
	grant := basic(mint(testKey, []string{echo.Addr().String()}, time.Now().Add(time.Hour)))
	status, conn, reader := connectStatus(t, fixture.server.URL, echo.Addr().String(), grant)
	if status != 200 {
		t.Fatalf("CONNECT: %d", status)
	}
	message := strings.Repeat("ping", 10000)
	go io.WriteString(conn, message)
	got := make([]byte, len(message))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(reader, got); err != nil || string(got) != message {
		t.Fatalf("echo through the tunnel: %v", err)
	}
}

func TestGatewayFlags(t *testing.T) {
	if _, err := parseGatewayFlags([]string{"--listen", "127.0.0.1:0"}); err == nil {
		t.Fatal("no --grant-key-file was accepted")
	}
	options, err := parseGatewayFlags([]string{"--grant-key-file", "/k", "--dial-timeout", "3s"})
	if err != nil || options.DialTimeout != 3*time.Second || options.Listen != "0.0.0.0:3128" {
		t.Fatalf("%+v %v", options, err)
	}
}

// value reads a counter's or gauge's current value.
func value(collector prometheus.Collector) float64 {
	metrics := make(chan prometheus.Metric, 1)
	collector.Collect(metrics)
	var out dto.Metric
	if err := (<-metrics).Write(&out); err != nil {
		panic(err)
	}
	if out.Counter != nil {
		return out.Counter.GetValue()
	}
	return out.Gauge.GetValue()
}

func TestGatewayDeniesNetworksWhateverTheGrant(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "grant-key")
	os.WriteFile(keyFile, []byte(testKey), 0o600)
	deny, err := parseNets("127.0.0.0/8,::1/128,169.254.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	gateway := NewGateway(keyFile, 2*time.Second, 5*time.Second, NewGatewayMetrics(), deny)
	server := httptest.NewServer(gateway)
	defer server.Close()
	fixture := &gatewayFixture{gateway, server, keyFile}
	target, accepted := countingListener(t)
	_, port, _ := net.SplitHostPort(target)
	byName := "localhost:" + port // a granted name that resolves into a denied network
	grant := basic(mint(testKey, []string{target, byName}, time.Now().Add(time.Hour)))
	for _, authority := range []string{target, byName} {
		if status, _, _ := connectStatus(t, server.URL, authority, grant); status != http.StatusForbidden {
			t.Errorf("CONNECT %s: %d, want 403", authority, status)
		}
		request, _ := http.NewRequest(http.MethodGet, "http://"+authority+"/", nil)
		request.Header.Set("Proxy-Authorization", grant)
		if response := forward(t, fixture, request); response.StatusCode != http.StatusForbidden {
			t.Errorf("HTTP %s: %d, want 403", authority, response.StatusCode)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("a denied destination was dialed %d times", n)
	}
	if got := value(gateway.Metrics.requests.WithLabelValues("connect", "denied")); got != 2 {
		t.Fatalf("connect denied = %v", got)
	}
}

func TestGatewayLimitsConnectionsPerClient(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listener := newLimitListener(inner, 100, 2)
	defer listener.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			accepted <- conn
		}
	}()
	var clients []net.Conn
	for range 3 {
		conn, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, conn)
	}
	first, second := <-accepted, <-accepted
	// The third connection from the same address is closed by the listener.
	clients[2].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := clients[2].Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the third connection was not closed: %v", err)
	}
	select {
	case conn := <-accepted:
		t.Fatalf("a third connection was served: %v", conn.RemoteAddr())
	default:
	}
	// A slot frees when a served connection closes.
	first.Close()
	conn, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("no connection served after one closed")
	}
	second.Close()
}

func TestGatewayRefusesOversizedHeaders(t *testing.T) {
	fixture := startGateway(t)
	target, accepted := countingListener(t)
	huge := basic(strings.Repeat("x", gatewayHeaderBytes+1024))
	conn, err := net.Dial("tcp", authority(t, fixture.server.URL))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\nProxy-Authorization: "+huge+"\r\n\r\n")
	response, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || response.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized headers: %v %v, want 431", response, err)
	}
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the destination was dialed %d times", n)
	}
}
