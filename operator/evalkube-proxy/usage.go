package main

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"sync"
)

// tokenFields are the token counts summed per execution (Responses and Embeddings APIs).
var tokenFields = []string{"input_tokens", "output_tokens", "total_tokens", "prompt_tokens"}

// ExecutionUsage is what one grader execution did through the proxy; the runner takes it and
// stores it on the sample.
type ExecutionUsage struct {
	Calls       int              `json:"calls"`
	Errors      int              `json:"errors"`
	ResponseIDs []string         `json:"response_ids"`
	Usage       map[string]int64 `json:"usage"`
	LatencyMS   []float64        `json:"latency_ms"`
	ByPurpose   map[string]int   `json:"by_purpose"`
	// Retries are requests sent again for these calls that may have reached the provider
	// (after a 429, a 5xx, a timeout or a dropped connection): each may be billed.
	Retries int `json:"retries"`
}

// UsageLedger keeps usage by execution id until the runner takes it.
type UsageLedger struct {
	mu         sync.Mutex
	executions map[string]*ExecutionUsage
}

func NewUsageLedger() *UsageLedger {
	return &UsageLedger{executions: make(map[string]*ExecutionUsage)}
}

// Record adds one call of executionID; requests: its attempts that may have reached the
// provider.
func (l *UsageLedger) Record(executionID, purpose string, latencyMS float64, responseID string, tokens []tokenCount, ok bool, requests int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	entry := l.entry(executionID)
	entry.Calls++
	if requests > 1 {
		entry.Retries += requests - 1
	}
	if !ok {
		entry.Errors++
	}
	entry.ByPurpose[purpose]++
	entry.LatencyMS = append(entry.LatencyMS, math.Round(latencyMS*1000)/1000)
	if responseID != "" {
		entry.ResponseIDs = append(entry.ResponseIDs, responseID)
	}
	for _, token := range tokens {
		entry.Usage[token.name] += token.value
	}
}

// RecordCounts is Record with the token counts by name (as the journal keeps them).
func (l *UsageLedger) RecordCounts(executionID, purpose string, latencyMS float64, responseID string, usage map[string]int64, ok bool, requests int) {
	var tokens []tokenCount
	for _, name := range tokenFields {
		if value, found := usage[name]; found {
			tokens = append(tokens, tokenCount{name, value})
		}
	}
	l.Record(executionID, purpose, latencyMS, responseID, tokens, ok, requests)
}

// AddRetries counts requests of executionID's calls that may have reached the provider and
// whose answers were never used (a killed proxy's calls, replayed from its journal).
func (l *UsageLedger) AddRetries(executionID string, requests int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entry(executionID).Retries += requests
}

func (l *UsageLedger) entry(executionID string) *ExecutionUsage {
	entry := l.executions[executionID]
	if entry == nil {
		entry = &ExecutionUsage{
			ResponseIDs: []string{},
			Usage:       map[string]int64{},
			LatencyMS:   []float64{},
			ByPurpose:   map[string]int{},
		}
		l.executions[executionID] = entry
	}
	return entry
}

// Take removes and returns the usage of ids (ids without calls are absent).
func (l *UsageLedger) Take(ids []string) map[string]*ExecutionUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	taken := make(map[string]*ExecutionUsage)
	for _, id := range ids {
		if entry, ok := l.executions[id]; ok {
			taken[id] = entry
			delete(l.executions, id)
		}
	}
	return taken
}

// TakeAll removes and returns everything recorded.
func (l *UsageLedger) TakeAll() map[string]*ExecutionUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	taken := l.executions
	l.executions = make(map[string]*ExecutionUsage)
	return taken
}

type tokenCount struct {
	name  string
	value int64
}

// Usage is the token counts of an API answer's "usage" object, as sent. Anything but an
// object leaves it empty (a provider's odd usage never fails the call).
type Usage struct {
	InputTokens  json.RawMessage `json:"input_tokens"`
	OutputTokens json.RawMessage `json:"output_tokens"`
	TotalTokens  json.RawMessage `json:"total_tokens"`
	PromptTokens json.RawMessage `json:"prompt_tokens"`
}

func (u *Usage) UnmarshalJSON(raw []byte) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil
	}
	type plain Usage
	return json.Unmarshal(raw, (*plain)(u))
}

// Counts are the integer token counts (floats, booleans and strings are ignored, as the
// Python proxy does), in tokenFields order.
func (u *Usage) Counts() []tokenCount {
	var counts []tokenCount
	for i, raw := range [...]json.RawMessage{u.InputTokens, u.OutputTokens, u.TotalTokens, u.PromptTokens} {
		if value, ok := jsonInteger(raw); ok {
			counts = append(counts, tokenCount{tokenFields[i], value})
		}
	}
	return counts
}

// jsonInteger is raw's value when it is a JSON integer literal (no fraction, no exponent).
func jsonInteger(raw json.RawMessage) (int64, bool) {
	value, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64)
	return value, err == nil
}
