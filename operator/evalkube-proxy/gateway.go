package main

// `evalkube-proxy gateway`: the egress gateway of work-unit pods.
//
// NetworkPolicy is per pod, so a work-unit pod's untrusted grader container would inherit
// whatever egress its proxy sidecar is given. The pod is therefore allowed to reach only this
// gateway (and the operator's ingest port), with no DNS. The gateway is an HTTP forward proxy
// that lets a request through only with a grant (grant.go) signed by the operator, which only
// the proxy container mounts, and only to a host:port the grant names:
//
//   - CONNECT host:port (TLS stays end to end: the gateway never sees a provider key);
//   - absolute-form plain HTTP (POST http://host:port/path), for http:// providers such as
//     in-cluster fakes;
//
// with the grant in Proxy-Authorization (Basic base64("evalkube:" + grant), which Go's
// http.ProxyURL and aiohttp's proxy_auth send, or Bearer grant). 407: no, garbled, wrongly
// signed or expired grant. 403: a destination the grant does not name. The grant is checked
// before any name is resolved, so nothing without a grant makes the gateway look up a name.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const (
	// gatewayHeaderBytes bounds a client's request line and headers (a grant is < 8 KiB).
	gatewayHeaderBytes = 32 << 10
	// refusedHeader marks the gateway's own refusals, so a proxy tells them from a provider's
	// 403 on a forwarded plain-HTTP request.
	refusedHeader = "X-Evalkube-Egress"
	// sentHeader, on the 502 of a forwarded plain-HTTP call, says the call failed after it was
	// sent to the destination (a dropped or reset connection, no answer in time): the provider
	// may have read and billed it, so the proxy counts the attempt.
	sentHeader = "X-Evalkube-Egress-Sent"
	grantUser  = "evalkube"
)

// GatewayOptions are the gateway's flags.
type GatewayOptions struct {
	Listen        string
	MetricsListen string
	GrantKeyFile  string
	DialTimeout   time.Duration
	IdleTimeout   time.Duration
	MaxConns      int
	// MaxConnsPerClient bounds one client address (one pod): a hostile pod cannot take the
	// slots of every other run.
	MaxConnsPerClient int
	// DenyNets are destinations refused whatever the grant says, checked on the address
	// actually dialed (after name resolution): loopback and link-local (cloud metadata).
	DenyNets []*net.IPNet
}

// GatewayMetrics are the gateway's series (evalkube_egress_*), on a registry of their own.
// Labels are kinds and outcomes only: never hosts, runs or grants.
type GatewayMetrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	tunnels  prometheus.Gauge
}

func NewGatewayMetrics() *GatewayMetrics {
	m := &GatewayMetrics{registry: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "evalkube_egress_requests_total",
		Help: "Requests to the egress gateway by kind (connect, http) and outcome " +
			"(ok, unauthorized, forbidden, denied, bad_request, upstream_error, unavailable).",
	}, []string{"kind", "outcome"})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "evalkube_egress_bytes_total",
		Help: "Bytes relayed through CONNECT tunnels by direction (up: to the destination, down: back).",
	}, []string{"direction"})
	m.tunnels = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "evalkube_egress_open_tunnels",
		Help: "CONNECT tunnels open now.",
	})
	m.registry.MustRegister(m.requests, m.bytes, m.tunnels)
	return m
}

// Gateway is the forward proxy's handler.
type Gateway struct {
	Keys        *watchedFile
	DialTimeout time.Duration
	IdleTimeout time.Duration
	Metrics     *GatewayMetrics
	Now         func() time.Time
	forward     *httputil.ReverseProxy
	dialer      *net.Dialer
}

func NewGateway(keyFile string, dialTimeout, idleTimeout time.Duration, metrics *GatewayMetrics, deny []*net.IPNet) *Gateway {
	g := &Gateway{
		Keys:        &watchedFile{path: keyFile},
		DialTimeout: dialTimeout,
		IdleTimeout: idleTimeout,
		Metrics:     metrics,
		Now:         time.Now,
		dialer: &net.Dialer{
			Timeout:   dialTimeout,
			KeepAlive: 30 * time.Second,
			Control:   denyControl(deny),
		},
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           g.dialer.DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: idleTimeout,
		DisableCompression:    true,
	}
	g.forward = &httputil.ReverseProxy{
		// Rewrite (not Director): hop-by-hop headers, Proxy-Authorization among them, and any
		// X-Forwarded-* a client sent are removed from the outgoing request.
		Rewrite: func(r *httputil.ProxyRequest) {
			target := *r.In.URL
			target.User = nil
			r.Out.URL = &target
			r.Out.Host = ""
			r.Out.Header.Del("Proxy-Authorization")
		},
		Transport:     transport,
		FlushInterval: -1,
		ModifyResponse: func(*http.Response) error {
			g.Metrics.requests.WithLabelValues("http", "ok").Inc()
			return nil
		},
		ErrorLog: log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, errDenied) {
				g.Metrics.requests.WithLabelValues("http", "denied").Inc()
				g.refuse(w, http.StatusForbidden, "the destination resolves to a denied network")
				return
			}
			g.Metrics.requests.WithLabelValues("http", "upstream_error").Inc()
			if dialFailure(err) {
				g.refuse(w, http.StatusBadGateway, "the destination could not be reached")
				return
			}
			w.Header().Set(sentHeader, "1")
			g.refuse(w, http.StatusBadGateway, "the destination failed after the request was sent")
		},
	}
	return g
}

// dialFailure: err came before anything was sent to the destination (connecting failed).
func dialFailure(err error) bool {
	var opError *net.OpError
	var dnsError *net.DNSError
	return (errors.As(err, &opError) && opError.Op == "dial") || errors.As(err, &dnsError)
}

func (g *Gateway) refuse(w http.ResponseWriter, status int, message string) {
	header := w.Header()
	header.Set(refusedHeader, "refused")
	header.Set("Content-Type", "text/plain; charset=utf-8")
	header.Set("Connection", "close")
	if status == http.StatusProxyAuthRequired {
		header.Set("Proxy-Authenticate", `Basic realm="evalkube-egress"`)
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "evalkube egress gateway: "+message+"\n")
}

// grantToken is the grant a request carries in Proxy-Authorization, or "".
func grantToken(header string) string {
	scheme, value, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok {
		return ""
	}
	value = strings.TrimSpace(value)
	switch strings.ToLower(scheme) {
	case "bearer":
		return value
	case "basic":
		raw, err := base64.StdEncoding.DecodeString(value)
		if err != nil {
			return ""
		}
		user, password, ok := strings.Cut(string(raw), ":")
		if !ok || user != grantUser {
			return ""
		}
		return password
	}
	return ""
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind := "http"
	if r.Method == http.MethodConnect {
		kind = "connect"
	}
	// Where to: an explicit host:port for CONNECT; an absolute http:// URL otherwise.
	authority := ""
	if kind == "connect" {
		if host, port, err := net.SplitHostPort(r.RequestURI); err == nil {
			authority = normalAuthority(host, port)
		}
	} else if r.URL.IsAbs() && r.URL.Scheme == "http" && r.URL.User == nil {
		port := r.URL.Port()
		if port == "" {
			port = "80"
		}
		authority = normalAuthority(r.URL.Hostname(), port)
	}
	if authority == "" {
		g.Metrics.requests.WithLabelValues(kind, "bad_request").Inc()
		g.refuse(w, http.StatusBadRequest,
			"this is a forward proxy: send CONNECT host:port or an absolute http:// URL")
		return
	}
	keys, err := grantKeys(g.Keys)
	if err != nil {
		log.Printf("ERROR %v", err)
		g.Metrics.requests.WithLabelValues(kind, "unavailable").Inc()
		g.refuse(w, http.StatusServiceUnavailable, "the gateway has no usable grant key")
		return
	}
	grant, err := verifyGrant(keys, grantToken(r.Header.Get("Proxy-Authorization")), g.Now())
	if err != nil {
		g.Metrics.requests.WithLabelValues(kind, "unauthorized").Inc()
		log.Printf("INFO refused %s %s from %s: %v", kind, authority, r.RemoteAddr, err)
		g.refuse(w, http.StatusProxyAuthRequired, "a valid egress grant is required ("+err.Error()+")")
		return
	}
	if !grant.Allows(authority) {
		g.Metrics.requests.WithLabelValues(kind, "forbidden").Inc()
		log.Printf("INFO refused %s %s for run %s: not in its grant", kind, authority, grant.Run)
		g.refuse(w, http.StatusForbidden, authority+" is not granted to run "+grant.Run)
		return
	}
	if kind == "connect" {
		g.tunnel(w, r, authority)
		return
	}
	g.forward.ServeHTTP(w, r)
}

// tunnel dials authority and relays bytes both ways until either side closes or the tunnel
// has been idle for IdleTimeout.
func (g *Gateway) tunnel(w http.ResponseWriter, r *http.Request, authority string) {
	hijacker, ok := w.(http.Hijacker)
	if !ok {
		g.refuse(w, http.StatusInternalServerError, "cannot tunnel on this connection")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.DialTimeout)
	upstream, err := g.dialer.DialContext(ctx, "tcp", authority)
	cancel()
	if errors.Is(err, errDenied) {
		g.Metrics.requests.WithLabelValues("connect", "denied").Inc()
		g.refuse(w, http.StatusForbidden, authority+" resolves to a denied network")
		return
	}
	if err != nil {
		g.Metrics.requests.WithLabelValues("connect", "upstream_error").Inc()
		g.refuse(w, http.StatusBadGateway, authority+" could not be reached")
		return
	}
	client, buffered, err := hijacker.Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	g.Metrics.requests.WithLabelValues("connect", "ok").Inc()
	g.Metrics.tunnels.Inc()
	defer g.Metrics.tunnels.Dec()
	// The server's read deadline outlives the hijack: tunnels have their own idle bound.
	_ = client.SetDeadline(time.Time{})
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		client.Close()
		upstream.Close()
		return
	}
	var relays sync.WaitGroup
	relay := func(dst, src net.Conn, reader io.Reader, direction string) {
		defer relays.Done()
		n, _ := io.Copy(&idleWriter{dst, g.IdleTimeout}, &idleReader{src, reader, g.IdleTimeout})
		g.Metrics.bytes.WithLabelValues(direction).Add(float64(n))
		// One side is done: end the other one too (no half-open tunnels to keep).
		client.Close()
		upstream.Close()
	}
	relays.Add(2)
	go relay(upstream, client, buffered.Reader, "up")
	go relay(client, upstream, upstream, "down")
	relays.Wait()
}

// errDenied: the destination resolved to a denied network.
var errDenied = errors.New("the destination is in a denied network")

// denyControl refuses, at connect time, addresses inside deny (a granted name that resolves
// to loopback or to the metadata service is refused too).
func denyControl(deny []*net.IPNet) func(network, address string, _ syscall.RawConn) error {
	return func(network, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip := net.ParseIP(host)
		for _, block := range deny {
			if ip == nil || block.Contains(ip) {
				return errDenied
			}
		}
		return nil
	}
}

// parseNets reads a comma-separated list of CIDRs ("" is none).
func parseNets(list string) ([]*net.IPNet, error) {
	var nets []*net.IPNet
	for _, item := range strings.Split(list, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		_, block, err := net.ParseCIDR(item)
		if err != nil {
			return nil, fmt.Errorf("--deny-cidrs: %w", err)
		}
		nets = append(nets, block)
	}
	return nets, nil
}

// idleReader reads through reader (which may hold bytes already buffered from conn), pushing
// conn's read deadline forward by idle before every read.
type idleReader struct {
	conn   net.Conn
	reader io.Reader
	idle   time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	_ = r.conn.SetReadDeadline(time.Now().Add(r.idle))
	return r.reader.Read(p)
}

type idleWriter struct {
	conn net.Conn
	idle time.Duration
}

func (w *idleWriter) Write(p []byte) (int, error) {
	_ = w.conn.SetWriteDeadline(time.Now().Add(w.idle))
	return w.conn.Write(p)
}

// limitListener accepts at most cap(slots) connections at a time (the next waits for one to
// close) and at most perClient from one address (more are closed at once).
type limitListener struct {
	net.Listener
	slots     chan struct{}
	perClient int
	mu        sync.Mutex
	clients   map[string]int
}

func newLimitListener(inner net.Listener, total, perClient int) *limitListener {
	return &limitListener{
		Listener:  inner,
		slots:     make(chan struct{}, total),
		perClient: perClient,
		clients:   map[string]int{},
	}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.slots <- struct{}{}
		conn, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		client, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		l.mu.Lock()
		admitted := l.clients[client] < l.perClient
		if admitted {
			l.clients[client]++
		}
		l.mu.Unlock()
		if !admitted {
			conn.Close()
			<-l.slots
			continue
		}
		return &limitedConn{Conn: conn, release: func() {
			l.mu.Lock()
			if l.clients[client]--; l.clients[client] <= 0 {
				delete(l.clients, client)
			}
			l.mu.Unlock()
			<-l.slots
		}}, nil
	}
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// newGatewayServer applies the limits every client meets before its grant is checked:
// header size and time, idle keep-alive.
func newGatewayServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    gatewayHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
}

// parseGatewayFlags reads the gateway's command line.
func parseGatewayFlags(args []string) (GatewayOptions, error) {
	flags := flag.NewFlagSet("evalkube-proxy gateway", flag.ContinueOnError)
	options := GatewayOptions{}
	flags.StringVar(&options.Listen, "listen", "0.0.0.0:3128", "address of the forward proxy (host:port)")
	flags.StringVar(&options.MetricsListen, "metrics-listen", "", "address of /metrics and /healthz (host:port), none when empty")
	flags.StringVar(&options.GrantKeyFile, "grant-key-file", "", "file with the grant signing keys, one per line (re-read when it changes)")
	flags.DurationVar(&options.DialTimeout, "dial-timeout", 10*time.Second, "bound on connecting to a destination")
	flags.DurationVar(&options.IdleTimeout, "idle-timeout", 15*time.Minute, "a tunnel or forwarded call with no traffic for this long is closed")
	flags.IntVar(&options.MaxConns, "max-conns", 4096, "client connections (tunnels included) served at once")
	flags.IntVar(&options.MaxConnsPerClient, "max-conns-per-client", 512, "client connections from one address (one pod) at once")
	deny := flags.String("deny-cidrs", "127.0.0.0/8,::1/128,169.254.0.0/16,fe80::/10,0.0.0.0/32,::/128",
		"destinations refused whatever a grant says (checked on the resolved address); \"\" for none")
	if err := flags.Parse(args); err != nil {
		return options, err
	}
	if options.GrantKeyFile == "" {
		return options, errors.New("--grant-key-file is required")
	}
	if options.DialTimeout <= 0 || options.IdleTimeout <= 0 || options.MaxConns <= 0 || options.MaxConnsPerClient <= 0 {
		return options, errors.New("--dial-timeout, --idle-timeout, --max-conns and --max-conns-per-client must be positive")
	}
	nets, err := parseNets(*deny)
	options.DenyNets = nets
	return options, err
}

// gatewayMain runs the gateway until SIGTERM or SIGINT; its exit code.
func gatewayMain(args []string) int {
	options, err := parseGatewayFlags(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "evalkube-proxy gateway:", err)
		return 2
	}
	log.SetFlags(log.LstdFlags | log.LUTC)
	log.SetPrefix("evalkube-proxy gateway: ")
	if err := serveGateway(options); err != nil {
		fmt.Fprintln(os.Stderr, "evalkube-proxy gateway:", err)
		return 2
	}
	return 0
}

func serveGateway(options GatewayOptions) error {
	metrics := NewGatewayMetrics()
	gateway := NewGateway(options.GrantKeyFile, options.DialTimeout, options.IdleTimeout, metrics, options.DenyNets)
	if _, err := grantKeys(gateway.Keys); err != nil {
		return err
	}
	proxyListener, err := net.Listen("tcp", options.Listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", options.Listen, err)
	}
	servers := []*http.Server{newGatewayServer(gateway)}
	listeners := []net.Listener{newLimitListener(proxyListener, options.MaxConns, options.MaxConnsPerClient)}
	ready := map[string]string{"endpoint": proxyListener.Addr().String()}
	if options.MetricsListen != "" {
		metricsListener, err := net.Listen("tcp", options.MetricsListen)
		if err != nil {
			proxyListener.Close()
			return fmt.Errorf("cannot listen on %s: %w", options.MetricsListen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(metrics.registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
			if _, err := grantKeys(gateway.Keys); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, marshal(map[string]string{"status": "no usable grant key"}))
				return
			}
			writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
		})
		servers = append(servers, newServer(mux))
		listeners = append(listeners, metricsListener)
		ready["metrics_endpoint"] = metricsListener.Addr().String()
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	failed := make(chan error, len(servers))
	for i, server := range servers {
		go func() {
			if err := server.Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- err
			}
		}()
	}
	line, _ := json.Marshal(ready)
	fmt.Println(string(line))
	log.Printf("INFO egress gateway listening on %s", ready["endpoint"])
	var serveErr error
	select {
	case <-signals:
	case serveErr = <-failed:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, server := range servers {
		_ = server.Shutdown(ctx)
	}
	return serveErr
}
