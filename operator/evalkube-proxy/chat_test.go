package main

// The Responses <-> Chat Completions translation against the vectors shared with the Python
// proxy (tests/fixtures/chat_completions.json, tests/unit/proxy/test_chat_translation.py), and
// the service refusing an untranslatable request before charging any budget.

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

type chatVector struct {
	Name      string          `json:"name"`
	Responses json.RawMessage `json:"responses"`
	Chat      json.RawMessage `json:"chat"`
	Error     string          `json:"error"`
}

type chatVectors struct {
	Requests        []chatVector `json:"requests"`
	RefusedRequests []chatVector `json:"refused_requests"`
	Answers         []chatVector `json:"answers"`
	RefusedAnswers  []chatVector `json:"refused_answers"`
}

func loadChatVectors(t *testing.T) chatVectors {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "..", "tests", "fixtures", "chat_completions.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vectors chatVectors
	if err := json.Unmarshal(raw, &vectors); err != nil {
		t.Fatal(err)
	}
	if len(vectors.Requests) == 0 || len(vectors.RefusedRequests) == 0 || len(vectors.Answers) == 0 ||
		len(vectors.RefusedAnswers) == 0 {
		t.Fatal("no vectors")
	}
	return vectors
}

// sameJSON compares two JSON documents by value (key order and number spelling aside).
func sameJSON(t *testing.T, name string, got []byte, want json.RawMessage) {
	t.Helper()
	var gotValue, wantValue any
	if err := json.Unmarshal(got, &gotValue); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := json.Unmarshal(want, &wantValue); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !reflect.DeepEqual(gotValue, wantValue) {
		t.Errorf("%s:\n got %s\nwant %s", name, got, want)
	}
}

func TestChatRequestVectors(t *testing.T) {
	for _, vector := range loadChatVectors(t).Requests {
		got, err := chatPayload(vector.Responses)
		if err != nil {
			t.Errorf("%s: %v", vector.Name, err)
			continue
		}
		sameJSON(t, vector.Name, got, vector.Chat)
	}
}

func TestChatRequestRefusals(t *testing.T) {
	for _, vector := range loadChatVectors(t).RefusedRequests {
		_, err := chatPayload(vector.Responses)
		if err == nil || err.Error() != vector.Error {
			t.Errorf("%s: error %v, want %q", vector.Name, err, vector.Error)
		}
	}
}

func TestChatAnswerVectors(t *testing.T) {
	for _, vector := range loadChatVectors(t).Answers {
		chat, err := decodeObject(vector.Chat)
		if err != nil {
			t.Fatal(err)
		}
		answer, err := responsesAnswer(chat)
		if err != nil {
			t.Errorf("%s: %v", vector.Name, err)
			continue
		}
		out, err := encodeJSON(answer)
		if err != nil {
			t.Fatal(err)
		}
		sameJSON(t, vector.Name, out, vector.Responses)
	}
}

func TestChatAnswerRefusals(t *testing.T) {
	for _, vector := range loadChatVectors(t).RefusedAnswers {
		chat, err := decodeObject(vector.Chat)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := responsesAnswer(chat); err == nil || err.Error() != vector.Error {
			t.Errorf("%s: error %v, want %q", vector.Name, err, vector.Error)
		}
	}
}

func TestUnknownProviderAPIIsRefused(t *testing.T) {
	_, err := parseConfig([]byte(`{"listen": "unix:/x", "providers": {"p": {"base_url": "http://h", "api": "chat"}}}`))
	if err == nil || !strings.Contains(err.Error(), "providers.p.api must be responses or chat_completions") {
		t.Fatalf("error %v", err)
	}
	config, err := parseConfig([]byte(`{"listen": "unix:/x", "providers": {"p": {"base_url": "http://h"}}}`))
	if err != nil || config.Providers["p"].API != responsesAPI {
		t.Fatalf("default api: %v %+v", err, config.Providers["p"])
	}
}

func TestChatProviderCallsAreTranslatedAndRefusalsChargeNothing(t *testing.T) {
	var paths []string
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id": "chatcmpl-7", "model": "m", "choices": [{"message": {"content": "ok"},
			"finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}`))
	}))
	defer fake.Close()
	config := Config{MaxConnections: 1, Providers: map[string]ProviderConfig{
		"p": {BaseURL: fake.URL + "/v1", Timeout: 5, API: chatCompletionsAPI},
	}}
	service := &Service{
		Upstream: NewUpstream(config), JudgeModel: "p:m",
		Budgets: NewBudgets("u", 1, nil), Metrics: NewMetrics(), Usage: NewUsageLedger(),
	}
	service.Budgets.Open([]string{"e"})
	status, answer := service.ModelCall(Responses, []byte(`{"input": "x", "previous_response_id": "r"}`), "e", "", true)
	if status != 400 || !strings.Contains(string(answer), "speaks Chat Completions") {
		t.Fatalf("refusal: %d %s", status, answer)
	}
	status, answer = service.ModelCall(Responses, []byte(`{"input": "x"}`), "e", "", true)
	if status != 200 || !strings.Contains(string(answer), `"output_text":"ok"`) {
		t.Fatalf("call: %d %s", status, answer)
	}
	if !reflect.DeepEqual(paths, []string{"/v1/chat/completions"}) {
		t.Fatalf("paths %v", paths)
	}
	usage := service.Usage.Take([]string{"e"})["e"]
	if usage == nil || !reflect.DeepEqual(usage.ResponseIDs, []string{"chatcmpl-7"}) || usage.Usage["input_tokens"] != 3 {
		t.Fatalf("usage %+v", usage)
	}
}

// BenchmarkChatTranslation is one judge-sized call's translation both ways (request and
// answer), the CPU a chat provider adds per call in the native proxy.
func BenchmarkChatTranslation(b *testing.B) {
	request := []byte(`{"model":"m","instructions":"You grade answers.","input":[{"role":"user","content":"Is 4 right? The candidate said four."}],"temperature":0,"max_output_tokens":20,"text":{"format":{"type":"json_object"}},"stream":false,"store":true,"background":false}`)
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"{\"verdict\":\"correct\"}"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":6,"total_tokens":36}}`)
	for i := 0; i < b.N; i++ {
		if _, err := chatPayload(request); err != nil {
			b.Fatal(err)
		}
		chat, _ := decodeObject(answer)
		translated, err := responsesAnswer(chat)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := encodeJSON(translated); err != nil {
			b.Fatal(err)
		}
	}
}
