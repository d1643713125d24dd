package main

import (
	"bytes"
	"encoding/json"
	"math"
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
}

// UsageLedger keeps usage by execution id until the runner takes it.
type UsageLedger struct {
	mu         sync.Mutex
	executions map[string]*ExecutionUsage
}

func NewUsageLedger() *UsageLedger {
	return &UsageLedger{executions: make(map[string]*ExecutionUsage)}
}

// Record adds one call of executionID.
func (l *UsageLedger) Record(executionID, purpose string, latencyMS float64, responseID string, tokens []tokenCount, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
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
	entry.Calls++
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

// tokenUsage reads the integer token counts of an API answer's "usage" object (floats,
// booleans and strings are ignored, as the Python proxy does).
func tokenUsage(usage json.RawMessage) []tokenCount {
	usage = bytes.TrimSpace(usage)
	if len(usage) == 0 || usage[0] != '{' {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(usage, &fields) != nil {
		return nil
	}
	var counts []tokenCount
	for _, name := range tokenFields {
		raw, ok := fields[name]
		if !ok {
			continue
		}
		if value, ok := jsonInteger(raw); ok {
			counts = append(counts, tokenCount{name, value})
		}
	}
	return counts
}

// jsonInteger is raw's value when it is a JSON integer literal (no fraction, no exponent).
func jsonInteger(raw json.RawMessage) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.ContainsAny(raw, ".eE\"") || raw[0] == 't' || raw[0] == 'f' || raw[0] == 'n' {
		return 0, false
	}
	var value int64
	if json.Unmarshal(raw, &value) != nil {
		return 0, false
	}
	return value, true
}
