// Command evalkube-proxy is the native data plane of evalkube's model bridge proxy: the same
// HTTP contract as the Python proxy (evalkube.proxy.server), compiled, for work-unit pods where
// one core must carry many model calls. `evalkube proxy` resolves the run's configuration and
// executes this binary with it on standard input; it is not meant to be started by hand.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"
)

var version = "dev"

func main() {
	// `evalkube-proxy gateway ...`: the egress gateway (gateway.go), a separate Deployment.
	if len(os.Args) > 1 && os.Args[1] == "gateway" {
		os.Exit(gatewayMain(os.Args[2:]))
	}
	configPath := flag.String("config", "-", "JSON configuration file, - for standard input")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("evalkube-proxy", version)
		return
	}
	// The heap is small and short-lived (one request and answer per call): collecting at 4x
	// instead of 2x its live size saves ~5% of CPU per call. GOGC and GOMEMLIMIT (the pod
	// sets it below the container's memory limit) still apply when given.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	log.SetFlags(log.LstdFlags | log.LUTC)
	log.SetPrefix("evalkube-proxy: ")
	config, err := loadConfig(*configPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "evalkube-proxy:", err)
		os.Exit(2)
	}
	// EVALKUBE_PROXY_CPUPROFILE=path writes a Go CPU profile of the whole run (diagnostics).
	if path := os.Getenv("EVALKUBE_PROXY_CPUPROFILE"); path != "" {
		if file, err := os.Create(path); err == nil && pprof.StartCPUProfile(file) == nil {
			defer pprof.StopCPUProfile()
		}
	}
	if err := serve(config); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "evalkube-proxy:", err)
		os.Exit(2)
	}
}

// serve runs both listeners until SIGTERM or SIGINT, then shuts down within two seconds.
func serve(config Config) error {
	level := strings.ToUpper(config.LogLevel)
	if level == "ERROR" || level == "CRITICAL" {
		log.SetOutput(io.Discard)
	}
	token := ""
	if config.ControlTokenFile != nil {
		raw, err := os.ReadFile(*config.ControlTokenFile)
		if err != nil {
			return fmt.Errorf("control token file: %w", err)
		}
		token = strings.TrimSpace(string(raw))
		if token == "" {
			return fmt.Errorf("control token file %s is empty", *config.ControlTokenFile)
		}
	}
	metrics := NewMetrics()
	upstream := NewUpstream(config)
	upstream.OnRetry = metrics.Retry
	service := &Service{
		Upstream:       upstream,
		JudgeModel:     deref(config.JudgeModel),
		EmbeddingModel: deref(config.EmbeddingModel),
		Budgets:        NewBudgets(config.UnitID, config.MaxCalls, config.PlannedExecutions),
		Metrics:        metrics,
		Usage:          NewUsageLedger(),
	}
	if config.StateDir != nil && *config.StateDir != "" {
		journal, replayed, err := OpenJournal(*config.StateDir, service.Budgets, service.Usage)
		if err != nil {
			return fmt.Errorf("state directory %s: %w", *config.StateDir, err)
		}
		defer journal.Close()
		service.Journal = journal
		if replayed.Records > 0 {
			log.Printf("INFO restarted: replayed %d journal records; %d requests sent by the previous process "+
				"never answered count as retries (%d of them attributable to no execution or call)",
				replayed.Records, replayed.Lost, replayed.Unattributed)
		}
	}
	apps := &Apps{Service: service, ControlToken: token}

	type bound struct {
		server   *http.Server
		listener net.Listener
		path     string
	}
	var servers []bound
	ready := map[string]*string{"endpoint": nil, "control_endpoint": nil}
	bind := func(address *string, mode os.FileMode, handler http.Handler, key string) error {
		if address == nil || *address == "" {
			return nil
		}
		ln, endpoint, err := listener(*address, mode)
		if err != nil {
			return fmt.Errorf("cannot listen on %s: %w", *address, err)
		}
		path := ""
		if strings.HasPrefix(endpoint, "unix:") {
			path = strings.TrimPrefix(endpoint, "unix:")
		}
		servers = append(servers, bound{newServer(handler), ln, path})
		ready[key] = &endpoint
		return nil
	}
	cleanup := func() {
		for _, s := range servers {
			s.listener.Close()
			if s.path != "" {
				_ = os.Remove(s.path)
			}
		}
	}
	if err := bind(config.Listen, 0o666, apps.GraderHandler(), "endpoint"); err != nil {
		cleanup()
		return err
	}
	if err := bind(config.ControlListen, 0o600, apps.ControlHandler(), "control_endpoint"); err != nil {
		cleanup()
		return err
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	failed := make(chan error, len(servers))
	var running sync.WaitGroup
	for _, s := range servers {
		running.Add(1)
		go func() {
			defer running.Done()
			if err := s.server.Serve(s.listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
				failed <- err
			}
		}()
	}
	// The ready line: whoever started us learns the endpoints (ports chosen by the kernel).
	line, _ := json.Marshal(ready)
	fmt.Println(string(line))
	log.Printf("INFO model bridge proxy listening: graders %s, control %s",
		orDash(ready["endpoint"]), orDash(ready["control_endpoint"]))

	var serveErr error
	select {
	case <-signals:
	case serveErr = <-failed:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range servers {
		_ = s.server.Shutdown(ctx)
	}
	running.Wait()
	cleanup()
	return serveErr
}

func deref(value *string) string {
	if value == nil {
		return ""
	}
	return *value
}

func orDash(value *string) string {
	if value == nil {
		return "-"
	}
	return *value
}
