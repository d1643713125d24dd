package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"
)

// Kind of model call: the Responses or the Embeddings API.
type Kind int

const (
	Responses Kind = iota
	Embeddings
)

func (k Kind) path() string {
	if k == Responses {
		return "/responses"
	}
	return "/embeddings"
}

func (k Kind) defaultPurpose() string {
	if k == Responses {
		return "judge"
	}
	return "embedding"
}

// localProvider is served by the Python proxy only (sentence-transformers in-process).
const localProvider = "local"

// Service is what the proxy does for one model call, independent of HTTP plumbing.
type Service struct {
	Upstream       *Upstream
	JudgeModel     string
	EmbeddingModel string
	Budgets        *Budgets
	Metrics        *Metrics
	Usage          *UsageLedger
	// Journal (nil: none) keeps budgets, tokens, usage and sent requests across a restart.
	Journal *Journal
}

// forcedResponseFlags: a grader gets one synchronous, stored answer, never a stream or a
// background job the proxy could not count.
var forcedResponseFlags = map[string]json.RawMessage{
	"stream":     json.RawMessage("false"),
	"store":      json.RawMessage("true"),
	"background": json.RawMessage("false"),
}

type modelError struct{ message string }

func (e *modelError) Error() string { return e.message }

// ResolveModel maps the request's model field to (provider, bare model name).
func (s *Service) ResolveModel(kind Kind, model *string) (string, string, error) {
	fallback, field := s.JudgeModel, "judgeModel"
	if kind == Embeddings {
		fallback, field = s.EmbeddingModel, "embeddingModel"
	}
	name := ""
	if model == nil || *model == "auto" {
		if fallback == "" {
			return "", "", &modelError{fmt.Sprintf(
				"model='auto' needs the run's %s; set spec.%s on the EvalRun or pass model='provider:model'", field, field)}
		}
		name = fallback
	} else {
		name = *model
	}
	if strings.TrimSpace(name) == "" {
		return "", "", &modelError{"`model` must be a string such as 'openai:gpt-4.1-mini' or 'auto'"}
	}
	configured := strings.Join(s.Upstream.ProviderNames(), ", ")
	if configured == "" {
		configured = "none"
	}
	if provider, bare, found := strings.Cut(name, ":"); found && provider != "" && bare != "" {
		if _, ok := s.Upstream.Providers[provider]; !ok && provider != localProvider {
			return "", "", &modelError{fmt.Sprintf(
				"model '%s': provider '%s' is not configured for this run (configured: %s); declare it under spec.providers",
				name, provider, configured)}
		}
		return provider, bare, nil
	}
	// A bare model name (as OpenAI-hosted graders pass) goes to the provider of the run's
	// default model for this kind, or to the only configured provider.
	if provider, _, found := strings.Cut(fallback, ":"); found {
		return provider, name, nil
	}
	if len(s.Upstream.Providers) == 1 {
		return s.Upstream.ProviderNames()[0], name, nil
	}
	return "", "", &modelError{fmt.Sprintf(
		"model '%s' names no provider; pass 'provider:%s' (configured: %s)", name, name, configured)}
}

// errorBody is the OpenAI-shaped error document {"error": {"type", "message", ...}}.
func errorBody(kind, message string, extra ...string) []byte {
	failure := map[string]string{"type": kind, "message": message}
	for i := 0; i+1 < len(extra); i += 2 {
		failure[extra[i]] = extra[i+1]
	}
	out, _ := json.Marshal(map[string]any{"error": failure})
	return out
}

// ModelCall forwards one model call. budgeted calls (graders') are charged to the execution
// and the unit; the runner's calls (control listener) are not.
func (s *Service) ModelCall(kind Kind, raw []byte, executionID, purpose string, budgeted bool) (int, []byte) {
	status, body, _ := s.ForwardCall(kind, raw, executionID, purpose, budgeted)
	return status, body
}

// ForwardCall is ModelCall with the call's requests that may have reached the provider (0
// when none was sent), which the control listener tells the runner.
func (s *Service) ForwardCall(kind Kind, raw []byte, executionID, purpose string, budgeted bool) (int, []byte, int) {
	return s.ForwardKeyedCall(kind, raw, executionID, purpose, "", budgeted)
}

// ForwardKeyedCall is ForwardCall for a call the runner names with key (X-Evalkube-Call,
// the same when it sends the call again): the requests a killed proxy sent for that key and
// never answered are added to this call's (they were paid, their answers never used).
func (s *Service) ForwardKeyedCall(kind Kind, raw []byte, executionID, purpose, key string, budgeted bool) (int, []byte, int) {
	if purpose == "" {
		purpose = kind.defaultPurpose()
	}
	body, answer := decodeRequest(raw)
	if answer != nil {
		return 400, answer, 0
	}
	model, err := modelField(body["model"])
	if err != nil {
		return 400, errorBody("invalid_request", err.Error()), 0
	}
	provider, bare, err := s.ResolveModel(kind, model)
	if err != nil {
		return 400, errorBody("invalid_request", err.Error()), 0
	}
	if provider == localProvider {
		if kind != Embeddings {
			return 400, errorBody("invalid_request", "the local provider serves embeddings only"), 0
		}
		return 400, errorBody("invalid_request",
			"the local provider (on-machine embeddings) is served by the Python proxy only; "+
				"run the sidecar with `evalkube proxy --engine python`"), 0
	}
	quoted, _ := json.Marshal(bare)
	body["model"] = quoted
	if kind == Responses {
		for name, value := range forcedResponseFlags {
			body[name] = value
		}
	}
	payload, err := encodeRequest(body)
	if err != nil {
		return 400, errorBody("invalid_request", "the request body could not be re-encoded"), 0
	}
	path := kind.path()
	if kind == Responses {
		// Translated here, before any budget is charged: a request that a chat provider
		// cannot take is refused like any other bad request.
		var failure *UpstreamError
		if path, payload, failure = s.Upstream.ResponsesCall(provider, payload); failure != nil {
			return 400, errorBody("invalid_request", failure.Message, "provider", provider), 0
		}
	}
	if budgeted {
		if exhausted := s.Budgets.Acquire(executionID); exhausted != nil {
			s.Metrics.Rejected(exhausted.Scope)
			if exhausted.Scope == "unknown_execution" {
				s.Metrics.Call(purpose, provider, "unknown_execution", -1)
				return 403, errorBody("unknown_execution", exhausted.Message), 0
			}
			s.Metrics.Call(purpose, provider, "budget_exhausted", -1)
			return 429, errorBody("budget_exhausted", exhausted.Message, "scope", exhausted.Scope), 0
		}
	}
	call := s.Journal.NextCall()
	var sent func()
	if s.Journal != nil {
		sent = func() { s.Journal.Sent(call, executionID, key) }
	}
	claimed := s.Journal.Claim(key)
	started := time.Now()
	reply, parsed, failure := s.Upstream.PostCallTraced(provider, path, payload, sent)
	seconds := time.Since(started).Seconds()
	done := journalRecord{Exec: executionID, Key: key, Purpose: purpose, MS: seconds * 1000, Budgeted: budgeted}
	if failure != nil {
		status, errorKind := errorStatus(failure)
		requests := failure.Requests + claimed
		log.Printf("WARNING model call failed: %s (execution %s, purpose %s)", failure.Message, executionID, purpose)
		s.Metrics.Call(purpose, provider, "error", seconds)
		if executionID != "" {
			s.Usage.Record(executionID, purpose, seconds*1000, "", nil, false, requests)
		}
		done.Requests = requests
		s.Journal.Done(call, done)
		return status, errorBody(errorKind, failure.Message, "provider", provider), requests
	}
	requests := parsed.Requests + claimed
	tokens := parsed.Usage.Counts()
	responseID := ""
	if kind == Responses && len(parsed.ID) > 0 && parsed.ID[0] == '"' {
		_ = json.Unmarshal(parsed.ID, &responseID)
	}
	s.Metrics.Call(purpose, provider, "ok", seconds)
	if len(tokens) > 0 {
		s.Metrics.AddTokens(purpose, tokens)
	}
	if executionID != "" {
		s.Usage.Record(executionID, purpose, seconds*1000, responseID, tokens, true, requests)
	}
	if s.Journal != nil {
		done.OK, done.Requests, done.RID = true, requests, responseID
		done.Usage = make(map[string]int64, len(tokens))
		for _, token := range tokens {
			done.Usage[token.name] = token.value
		}
		s.Journal.Done(call, done)
	}
	return 200, reply, requests
}

// decodeRequest parses a client's body into its top-level fields (an empty body is {}).
func decodeRequest(raw []byte) (map[string]json.RawMessage, []byte) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 {
		return map[string]json.RawMessage{}, nil
	}
	var body map[string]json.RawMessage
	err := json.Unmarshal(trimmed, &body)
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		return nil, errorBody("invalid_request", "the request body is not valid JSON")
	}
	if err != nil || body == nil {
		return nil, errorBody("invalid_request", "the request body must be a JSON object")
	}
	return body, nil
}

// modelField is the request's model: nil when absent or null, an error when not a string.
func modelField(raw json.RawMessage) (*string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var model string
	if raw[0] != '"' || json.Unmarshal(raw, &model) != nil {
		return nil, &modelError{"`model` must be a string such as 'openai:gpt-4.1-mini' or 'auto'"}
	}
	return &model, nil
}

// encodeRequest writes the body for the provider without HTML escaping (the client's text
// reaches the provider as sent).
func encodeRequest(body map[string]json.RawMessage) ([]byte, error) {
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(body); err != nil {
		return nil, err
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

// errorStatus maps an upstream failure to the proxy's HTTP status and error type.
func errorStatus(failure *UpstreamError) (int, string) {
	switch failure.Kind {
	case "credentials":
		return 502, "credentials_rejected"
	case "no_credentials":
		return 502, "credentials_missing"
	case "timeout":
		return 504, "upstream_timeout"
	case "unreachable":
		return 502, "upstream_unreachable"
	case "configuration":
		return 400, "invalid_request"
	}
	if failure.Status == 429 {
		return 429, "rate_limited"
	}
	if failure.Status >= 400 && failure.Status < 500 {
		return failure.Status, "invalid_request"
	}
	return 502, "upstream_error"
}
