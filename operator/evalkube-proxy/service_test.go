package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func newTestService(judge, embedding string, providers ...string) *Service {
	config := Config{MaxConnections: 1, Providers: map[string]ProviderConfig{}}
	for _, name := range providers {
		config.Providers[name] = ProviderConfig{BaseURL: "http://127.0.0.1:9", Timeout: 1}
	}
	return &Service{
		Upstream: NewUpstream(config), JudgeModel: judge, EmbeddingModel: embedding,
		Budgets: NewBudgets("u", 64, nil), Metrics: NewMetrics(), Usage: NewUsageLedger(),
	}
}

func TestResolveModel(t *testing.T) {
	service := newTestService("openai:judge-1", "", "openai", "other")
	str := func(s string) *string { return &s }
	cases := []struct {
		kind           Kind
		model          *string
		provider, bare string
		err            string
	}{
		{Responses, nil, "openai", "judge-1", ""},
		{Responses, str("auto"), "openai", "judge-1", ""},
		{Responses, str("other:m"), "other", "m", ""},
		{Responses, str("gpt-x"), "openai", "gpt-x", ""},
		{Responses, str("nope:m"), "", "", "provider 'nope' is not configured for this run (configured: openai, other)"},
		{Embeddings, nil, "", "", "needs the run's embeddingModel"},
		{Embeddings, str("bare"), "", "", "names no provider; pass 'provider:bare'"},
		{Responses, str("  "), "", "", "must be a string"},
		{Embeddings, str("local:all-minilm-l6-v2"), "local", "all-minilm-l6-v2", ""},
	}
	for _, c := range cases {
		provider, bare, err := service.ResolveModel(c.kind, c.model)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: error %v, want %q", c.model, err, c.err)
			}
			continue
		}
		if err != nil || provider != c.provider || bare != c.bare {
			t.Errorf("%v: got %s %s %v", c.model, provider, bare, err)
		}
	}
}

func TestBadRequestBodies(t *testing.T) {
	service := newTestService("p:m", "p:e", "p")
	cases := map[string]string{
		`{`:             "not valid JSON",
		`[1]`:           "must be a JSON object",
		`null`:          "must be a JSON object",
		`{"model": 5}`:  "`model` must be a string",
		`{"model": ""}`: "`model` must be a string",
	}
	for body, want := range cases {
		status, answer := service.ModelCall(Responses, []byte(body), "e", "", true)
		if status != 400 || !strings.Contains(string(answer), want) {
			t.Errorf("%s: %d %s", body, status, answer)
		}
	}
	if service.Budgets.Snapshot().Used != 0 {
		t.Error("a refused request was charged to the budget")
	}
}

func TestBudgetExhaustedAnswerShape(t *testing.T) {
	service := newTestService("p:m", "", "p")
	service.Budgets.Configure("u", 0, nil)
	open(t, service.Budgets, "e")
	status, answer := service.ModelCall(Responses, []byte(`{}`), "e", "", true)
	var document struct {
		Error map[string]string `json:"error"`
	}
	json.Unmarshal(answer, &document)
	if status != 429 || document.Error["type"] != "budget_exhausted" || document.Error["scope"] != "execution" {
		t.Fatalf("%d %s", status, answer)
	}
}

func TestUnknownExecutionAnswerShape(t *testing.T) {
	service := newTestService("p:m", "", "p")
	status, answer := service.ModelCall(Responses, []byte(`{}`), "never-opened", "", true)
	var document struct {
		Error map[string]string `json:"error"`
	}
	json.Unmarshal(answer, &document)
	if status != 403 || document.Error["type"] != "unknown_execution" {
		t.Fatalf("%d %s", status, answer)
	}
}

func TestValidExecutionID(t *testing.T) {
	for value, want := range map[string]bool{
		"sample-1": true, "": false, strings.Repeat("x", 257): false, "bad\x01id": false, "tab\tid": false,
	} {
		if got := validExecutionID(value); got != want {
			t.Errorf("validExecutionID(%q) = %v", value, got)
		}
	}
}

func TestTokenUsageIgnoresNonIntegers(t *testing.T) {
	var answer Answer
	raw := `{"id": "r", "usage": {"input_tokens": 3, "output_tokens": 1.5, "total_tokens": true, "prompt_tokens": "7"}}`
	if err := json.Unmarshal([]byte(raw), &answer); err != nil {
		t.Fatal(err)
	}
	if got := answer.Usage.Counts(); len(got) != 1 || got[0] != (tokenCount{"input_tokens", 3}) {
		t.Fatalf("%+v", got)
	}
	for _, odd := range []string{`{"usage": 5}`, `{"usage": null}`, `{"usage": [1]}`, `{}`} {
		var answer Answer
		if err := json.Unmarshal([]byte(odd), &answer); err != nil || len(answer.Usage.Counts()) != 0 {
			t.Errorf("%s: %v %+v", odd, err, answer.Usage.Counts())
		}
	}
}
