package main

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
)

const (
	executionHeader    = "X-Evalkube-Execution"
	purposeHeader      = "X-Evalkube-Purpose"
	controlTokenHeader = "X-Evalkube-Control-Token"
	// requestsHeader: on a control listener's model answer, the call's requests that may have
	// reached the provider (the runner counts the extra ones as the call's retries).
	requestsHeader = "X-Evalkube-Upstream-Requests"
	// callKeyHeader: on a control listener's model call, the runner's name for the call, the
	// same when it sends the call again after the proxy was restarted (journal.go).
	callKeyHeader = "X-Evalkube-Call"
	// executionIDChars is the longest execution id accepted (the runner uses sample ids).
	executionIDChars = 256
	// requestBodyBytes is the largest request body accepted from a client.
	requestBodyBytes = 8 << 20
	// maxHeaderBytes bounds a client's request line and headers.
	maxHeaderBytes = 64 << 10
)

// Apps builds the handlers of the two listeners over one Service.
type Apps struct {
	Service      *Service
	ControlToken string // "" means no token is required
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	header := w.Header()
	header["Content-Type"] = []string{"application/json"}
	header["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func marshal(value any) []byte {
	out, err := json.Marshal(value)
	if err != nil {
		panic(err)
	}
	return out
}

// readBody reads a client's body, refusing more than requestBodyBytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	raw, err := readAll(http.MaxBytesReader(w, r.Body, requestBodyBytes), r.ContentLength, requestBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorBody("invalid_request",
				fmt.Sprintf("the request body is larger than %d bytes", requestBodyBytes)))
		} else {
			writeJSON(w, http.StatusBadRequest, errorBody("invalid_request", "the request body could not be read"))
		}
		return nil, false
	}
	return raw, true
}

// validExecutionID: set, at most executionIDChars characters, printable.
func validExecutionID(value string) bool {
	if value == "" || len([]rune(value)) > executionIDChars {
		return false
	}
	for _, r := range value {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// GraderHandler serves the untrusted side: the two model routes, charged to budgets, and
// nothing else (no health, no metrics: nothing about other executions leaks to graders).
func (a *Apps) GraderHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/responses", a.graderCall(Responses))
	mux.HandleFunc("POST /v1/embeddings", a.graderCall(Embeddings))
	return mux
}

func (a *Apps) graderCall(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// ctx always sends Content-Length. A chunked body from a grader is refused and the
		// connection closed: with Content-Length beside it, Go would let Transfer-Encoding
		// win and go on to read whatever follows the chunks as the next request.
		if len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusLengthRequired, errorBody("invalid_request",
				"model calls must send Content-Length (no Transfer-Encoding)"))
			return
		}
		executionID := r.Header.Get(executionHeader)
		if !validExecutionID(executionID) {
			writeJSON(w, 400, errorBody("missing_execution_id", fmt.Sprintf(
				"model calls need the %s header (set by the grader worker's ctx); call models "+
					"through ctx.responses_create / ctx.embeddings_create", executionHeader)))
			return
		}
		raw, ok := readBody(w, r)
		if !ok {
			return
		}
		status, body := a.Service.ModelCall(kind, raw, executionID, "", true)
		writeJSON(w, status, body)
	}
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, []byte(`{"status":"ok"}`))
}

// ControlHandler serves the trusted runner: model calls without budgets, usage, budgets.
func (a *Apps) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/responses", a.controlCall(Responses))
	mux.HandleFunc("POST /v1/embeddings", a.controlCall(Embeddings))
	mux.HandleFunc("POST /evalkube/v1/executions:open", a.executionsOpen)
	mux.HandleFunc("POST /evalkube/v1/usage:take", a.usageTake)
	mux.HandleFunc("GET /evalkube/v1/budget", a.budgetGet)
	mux.HandleFunc("PUT /evalkube/v1/budget", a.budgetPut)
	mux.HandleFunc("GET /healthz", healthz)
	mux.Handle("GET /metrics", a.Service.Metrics.handler)
	if a.ControlToken == "" {
		return mux
	}
	token := []byte(a.ControlToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(r.Header.Get(controlTokenHeader)), token) != 1 {
			writeJSON(w, 401, errorBody("unauthorized",
				fmt.Sprintf("control requests need the %s header", controlTokenHeader)))
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func (a *Apps) controlCall(kind Kind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		executionID := ""
		if values, sent := r.Header[executionHeader]; sent {
			executionID = values[0]
			if !validExecutionID(executionID) {
				writeJSON(w, 400, errorBody("invalid_request", "bad "+executionHeader+" header"))
				return
			}
		}
		purpose := r.Header.Get(purposeHeader)
		if purpose == "" {
			purpose = "embedding"
			if kind == Responses {
				purpose = "candidate"
			}
		}
		if purpose != "candidate" && purpose != "judge" && purpose != "embedding" {
			writeJSON(w, 400, errorBody("invalid_request", purposeHeader+" must be candidate, judge or embedding"))
			return
		}
		key := r.Header.Get(callKeyHeader)
		if key != "" && !validExecutionID(key) {
			writeJSON(w, 400, errorBody("invalid_request", "bad "+callKeyHeader+" header"))
			return
		}
		raw, ok := readBody(w, r)
		if !ok {
			return
		}
		status, body, requests := a.Service.ForwardKeyedCall(kind, raw, executionID, purpose, key, false)
		// the runner's own calls: it counts their retries itself
		w.Header().Set(requestsHeader, strconv.Itoa(requests))
		writeJSON(w, status, body)
	}
}

func (a *Apps) usageTake(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		raw = []byte("{}")
	}
	var request struct {
		ExecutionIDs json.RawMessage `json:"execution_ids"`
	}
	var ids []string
	valid := json.Unmarshal(raw, &request) == nil
	if valid && string(bytes.TrimSpace(request.ExecutionIDs)) == `"*"` {
		a.Service.Budgets.Close(nil)
		taken := a.Service.Usage.TakeAll()
		a.Service.Journal.Take(nil)
		writeJSON(w, 200, marshal(taken))
		return
	}
	if !valid || len(request.ExecutionIDs) == 0 || json.Unmarshal(request.ExecutionIDs, &ids) != nil || ids == nil {
		writeJSON(w, 400, errorBody("invalid_request",
			`send {"execution_ids": ["id", ...]} (or "*" for every recorded execution)`))
		return
	}
	// Taking an execution's usage closes its token: it can call no more.
	a.Service.Budgets.Close(ids)
	taken := a.Service.Usage.Take(ids)
	a.Service.Journal.Take(ids)
	writeJSON(w, 200, marshal(taken))
}

func (a *Apps) executionsOpen(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	var request struct {
		Tokens []string `json:"tokens"`
	}
	valid := json.Unmarshal(raw, &request) == nil && request.Tokens != nil
	for _, token := range request.Tokens {
		valid = valid && validExecutionID(token)
	}
	if !valid {
		writeJSON(w, 400, errorBody("invalid_request", fmt.Sprintf(
			`send {"tokens": ["token", ...]} (printable, at most %d characters each)`, executionIDChars)))
		return
	}
	if err := a.Service.Budgets.Open(request.Tokens); err != nil {
		writeJSON(w, 409, errorBody("invalid_request", err.Error()))
		return
	}
	a.Service.Journal.Open(request.Tokens)
	writeJSON(w, 200, marshal(map[string]int{"opened": len(request.Tokens)}))
}

func (a *Apps) budgetGet(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, 200, marshal(a.Service.Budgets.Snapshot()))
}

func (a *Apps) budgetPut(w http.ResponseWriter, r *http.Request) {
	raw, ok := readBody(w, r)
	if !ok {
		return
	}
	var fields map[string]json.RawMessage
	var unitID string
	perExecution, okPer := int64(0), false
	planned, okPlanned := int64(0), false
	if json.Unmarshal(raw, &fields) == nil && fields != nil {
		if id := bytes.TrimSpace(fields["unit_id"]); len(id) > 0 && id[0] == '"' && json.Unmarshal(id, &unitID) == nil {
			perExecution, okPer = jsonInteger(fields["max_calls_per_execution"])
			planned, okPlanned = jsonInteger(fields["planned_executions"])
		}
	}
	if !okPer || !okPlanned || perExecution < 0 || planned < 0 || perExecution > 1<<31 || planned > 1<<31 {
		writeJSON(w, 400, errorBody("invalid_request",
			`send {"unit_id": str, "max_calls_per_execution": int >= 0, "planned_executions": int >= 0}`))
		return
	}
	plannedInt := int(planned)
	a.Service.Budgets.Configure(unitID, int(perExecution), &plannedInt)
	a.Service.Journal.Unit(unitID, int(perExecution), plannedInt)
	writeJSON(w, 200, marshal(a.Service.Budgets.Snapshot()))
}

// listener binds address: "unix:/path" (mode applied to the socket file) or "host:port" /
// "http://host:port". It returns the endpoint clients use ("unix:/path" or "http://h:p").
func listener(address string, mode os.FileMode) (net.Listener, string, error) {
	if strings.HasPrefix(address, "unix:") {
		path := strings.TrimPrefix(address, "unix:")
		if path == "" {
			return nil, "", fmt.Errorf("unix: listen address needs a path, e.g. unix:/run/evalkube/model.sock")
		}
		if info, err := os.Lstat(path); err == nil && info.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(path)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, "", err
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, "", err
		}
		if err := os.Chmod(path, mode); err != nil {
			ln.Close()
			return nil, "", err
		}
		return ln, "unix:" + path, nil
	}
	rest := address
	if _, after, found := strings.Cut(address, "://"); found {
		rest = after
	}
	rest = strings.TrimRight(rest, "/")
	at := strings.LastIndex(rest, ":")
	if at < 0 {
		return nil, "", fmt.Errorf("listen address %q is neither unix:/path nor host:port", address)
	}
	port, err := strconv.Atoi(rest[at+1:])
	if err != nil {
		return nil, "", fmt.Errorf("listen address %q is neither unix:/path nor host:port", address)
	}
	host := strings.Trim(rest[:at], "[]")
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, "", err
	}
	bound := ln.Addr().(*net.TCPAddr)
	return ln, "http://" + net.JoinHostPort(bound.IP.String(), strconv.Itoa(bound.Port)), nil
}

// newServer applies the limits a hostile client meets: header size and time, idle time.
func newServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          nil,
	}
}

// readAll reads body, sized up front when its length is announced: net/http's body reader
// stops at the announced Content-Length, and io.ReadAll would grow its buffer from 512 bytes.
func readAll(body io.Reader, announced int64, limit int64) ([]byte, error) {
	if announced <= 0 || announced > limit {
		return io.ReadAll(body)
	}
	buffer := make([]byte, announced)
	if _, err := io.ReadFull(body, buffer); err != nil {
		return nil, err
	}
	return buffer, nil
}
