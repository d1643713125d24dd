package main

// Responses API <-> Chat Completions, for providers with "api": "chat_completions" (vLLM,
// llama.cpp, Ollama and other servers without /v1/responses). The same mapping as the Python
// proxy's evalkube/proxy/chat.py, which documents it; tests/fixtures/chat_completions.json
// holds the vectors both engines are tested against (chat_test.go here).

import (
	"bytes"
	"encoding/json"
	"fmt"
)

const (
	responsesAPI       = "responses"
	chatCompletionsAPI = "chat_completions"
	chatPath           = "/chat/completions"
)

// object is a decoded JSON object (numbers kept as json.Number, so they pass unchanged).
type object = map[string]any

// chatDropped are Responses-only fields a Chat Completions server would not understand.
var chatDropped = map[string]bool{
	"stream": true, "stream_options": true, "store": true, "background": true, "include": true,
	"truncation": true, "metadata": true, "service_tier": true, "prompt_cache_key": true,
	"safety_identifier": true, "max_tool_calls": true, "top_logprobs": true,
}

// chatRefused need a Responses server's stored state: no faithful translation exists.
var chatRefused = []string{"previous_response_id", "conversation", "prompt"}

var chatHandled = map[string]bool{
	"input": true, "instructions": true, "max_output_tokens": true, "text": true, "tools": true,
	"tool_choice": true, "reasoning": true,
}

var chatRoles = map[string]string{
	"user": "user", "assistant": "assistant", "system": "system", "developer": "system",
}

var chatTextParts = map[string]bool{"input_text": true, "output_text": true, "text": true}

// chatError is a request or answer with no faithful counterpart; the message names the field.
type chatError struct{ message string }

func (e *chatError) Error() string { return e.message }

func chatErrorf(format string, args ...any) error {
	return &chatError{fmt.Sprintf(format, args...)}
}

// quoted spells a value in a message as the Python proxy does: 'text', else compact JSON.
func quoted(value any) string {
	if text, ok := value.(string); ok {
		return "'" + text + "'"
	}
	out, _ := json.Marshal(value)
	return string(out)
}

func decodeObject(raw []byte) (object, error) {
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.UseNumber()
	var out object
	if err := decoder.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

func encodeJSON(value any) ([]byte, error) {
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil {
		return nil, err
	}
	return bytes.TrimRight(out.Bytes(), "\n"), nil
}

// chatPayload turns the Responses request payload into the Chat Completions one.
func chatPayload(payload []byte) ([]byte, error) {
	body, err := decodeObject(payload)
	if err != nil {
		return nil, chatErrorf("the request body is not a JSON object")
	}
	chat, err := chatRequest(body)
	if err != nil {
		return nil, err
	}
	return encodeJSON(chat)
}

// chatRequest is the Chat Completions request for the Responses request body.
func chatRequest(body object) (object, error) {
	for _, name := range chatRefused {
		if body[name] != nil {
			return nil, chatErrorf(
				"`%s` needs a provider that keeps Responses state; a Chat Completions provider cannot honour it", name)
		}
	}
	out := object{}
	for key, value := range body {
		if !chatDropped[key] && !chatHandled[key] {
			out[key] = value
		}
	}
	messages, err := chatMessages(body)
	if err != nil {
		return nil, err
	}
	out["messages"] = messages
	if body["max_output_tokens"] != nil {
		out["max_tokens"] = body["max_output_tokens"]
	}
	if text := body["text"]; text != nil {
		textObject, ok := text.(object)
		if !ok {
			return nil, chatErrorf("`text` must be an object such as {'format': {...}}")
		}
		format, err := chatResponseFormat(textObject["format"])
		if err != nil {
			return nil, err
		}
		if format != nil {
			out["response_format"] = format
		}
	}
	if tools := body["tools"]; tools != nil {
		translated, err := chatTools(tools)
		if err != nil {
			return nil, err
		}
		out["tools"] = translated
	}
	if choice := body["tool_choice"]; choice != nil {
		translated, err := chatToolChoice(choice)
		if err != nil {
			return nil, err
		}
		out["tool_choice"] = translated
	}
	if reasoning, ok := body["reasoning"].(object); ok && reasoning["effort"] != nil {
		out["reasoning_effort"] = reasoning["effort"]
	}
	out["stream"] = false
	return out, nil
}

func chatMessages(body object) ([]any, error) {
	messages := []any{}
	if instructions := body["instructions"]; instructions != nil {
		text, ok := instructions.(string)
		if !ok {
			return nil, chatErrorf("`instructions` must be a string")
		}
		messages = append(messages, object{"role": "system", "content": text})
	}
	switch input := body["input"].(type) {
	case string:
		return append(messages, object{"role": "user", "content": input}), nil
	case []any:
		for index, raw := range input {
			where := fmt.Sprintf("input[%d]", index)
			item, ok := raw.(object)
			if !ok {
				return nil, chatErrorf("%s must be an object", where)
			}
			kind := item["type"]
			switch {
			case kind == nil || kind == "message":
				message, err := chatMessage(item, where)
				if err != nil {
					return nil, err
				}
				messages = append(messages, message)
			case kind == "function_call":
				call := object{
					"id":       item["call_id"],
					"type":     "function",
					"function": object{"name": item["name"], "arguments": item["arguments"]},
				}
				if len(messages) > 0 && messages[len(messages)-1].(object)["role"] == "assistant" {
					last := messages[len(messages)-1].(object)
					calls, _ := last["tool_calls"].([]any)
					last["tool_calls"] = append(calls, call)
				} else {
					messages = append(messages, object{"role": "assistant", "content": nil, "tool_calls": []any{call}})
				}
			case kind == "function_call_output":
				output, ok := item["output"].(string)
				if !ok {
					return nil, chatErrorf("%s.output must be a string", where)
				}
				messages = append(messages, object{"role": "tool", "tool_call_id": item["call_id"], "content": output})
			case kind == "reasoning":
				// a previous answer's reasoning: a chat server cannot take it back
			default:
				return nil, chatErrorf("%s: item type %s cannot be sent to a Chat Completions provider", where, quoted(kind))
			}
		}
		return messages, nil
	}
	return nil, chatErrorf("`input` must be a string or a list of input items")
}

func chatMessage(item object, where string) (object, error) {
	given, _ := item["role"].(string)
	role, ok := chatRoles[given]
	if !ok {
		return nil, chatErrorf("%s.role must be user, assistant, system or developer", where)
	}
	switch content := item["content"].(type) {
	case string:
		return object{"role": role, "content": content}, nil
	case []any:
		parts := make([]any, 0, len(content))
		for index, raw := range content {
			part, err := chatPart(raw, fmt.Sprintf("%s.content[%d]", where, index))
			if err != nil {
				return nil, err
			}
			parts = append(parts, part)
		}
		if len(parts) == 1 && parts[0].(object)["type"] == "text" {
			return object{"role": role, "content": parts[0].(object)["text"]}, nil
		}
		return object{"role": role, "content": parts}, nil
	}
	return nil, chatErrorf("%s.content must be a string or a list of parts", where)
}

func chatPart(raw any, where string) (object, error) {
	part, ok := raw.(object)
	if !ok {
		return nil, chatErrorf("%s must be an object", where)
	}
	kind := part["type"]
	if name, ok := kind.(string); ok && chatTextParts[name] {
		return object{"type": "text", "text": part["text"]}, nil
	}
	if kind == "input_image" {
		if part["image_url"] == nil {
			return nil, chatErrorf(
				"%s: input_image needs image_url (a URL or data: URL) for a Chat Completions provider", where)
		}
		image := object{"url": part["image_url"]}
		if part["detail"] != nil {
			image["detail"] = part["detail"]
		}
		return object{"type": "image_url", "image_url": image}, nil
	}
	return nil, chatErrorf("%s: content type %s cannot be sent to a Chat Completions provider", where, quoted(kind))
}

func chatResponseFormat(format any) (object, error) {
	if format == nil {
		return nil, nil
	}
	formatObject, _ := format.(object)
	switch formatObject["type"] {
	case "text":
		return nil, nil
	case "json_object":
		return object{"type": "json_object"}, nil
	case "json_schema":
		schema := object{}
		for _, key := range []string{"name", "description", "schema", "strict"} {
			if value, ok := formatObject[key]; ok {
				schema[key] = value
			}
		}
		return object{"type": "json_schema", "json_schema": schema}, nil
	}
	return nil, chatErrorf("`text.format.type` must be text, json_object or json_schema")
}

func chatTools(tools any) ([]any, error) {
	list, ok := tools.([]any)
	if !ok {
		return nil, chatErrorf("`tools` must be a list")
	}
	out := make([]any, 0, len(list))
	for index, raw := range list {
		tool, _ := raw.(object)
		if tool["type"] != "function" {
			return nil, chatErrorf(
				"tools[%d]: a Chat Completions provider takes function tools only (got type %s)", index, quoted(tool["type"]))
		}
		function := object{}
		for _, key := range []string{"name", "description", "parameters", "strict"} {
			if value, ok := tool[key]; ok {
				function[key] = value
			}
		}
		out = append(out, object{"type": "function", "function": function})
	}
	return out, nil
}

func chatToolChoice(choice any) (any, error) {
	if text, ok := choice.(string); ok {
		return text, nil
	}
	if choiceObject, ok := choice.(object); ok && choiceObject["type"] == "function" {
		return object{"type": "function", "function": object{"name": choiceObject["name"]}}, nil
	}
	return nil, chatErrorf("`tool_choice` must be auto, none, required or {'type': 'function', 'name': ...}")
}

// responsesAnswer is the Responses object for a chat completion (its first choice).
func responsesAnswer(chat object) (object, error) {
	choices, _ := chat["choices"].([]any)
	var choice object
	if len(choices) > 0 {
		choice, _ = choices[0].(object)
	}
	if choice == nil {
		return nil, chatErrorf("a chat completion without choices")
	}
	message, ok := choice["message"].(object)
	if !ok {
		return nil, chatErrorf("a chat completion whose first choice has no message")
	}
	content, isText := message["content"].(string)
	if message["content"] != nil && !isText {
		return nil, chatErrorf("a chat completion whose message content is not text")
	}
	suffix, _ := chat["id"].(string)
	output := []any{}
	if reasoning, _ := message["reasoning_content"].(string); reasoning != "" {
		output = append(output, object{
			"type":    "reasoning",
			"id":      "rs_" + suffix,
			"summary": []any{object{"type": "summary_text", "text": reasoning}},
		})
	}
	var calls []object
	if list, ok := message["tool_calls"].([]any); ok {
		for _, raw := range list {
			if call, ok := raw.(object); ok {
				calls = append(calls, call)
			}
		}
	}
	parts := []any{}
	if isText && (content != "" || len(calls) == 0) {
		parts = append(parts, object{"type": "output_text", "text": content, "annotations": []any{}})
	}
	if refusal, _ := message["refusal"].(string); refusal != "" {
		parts = append(parts, object{"type": "refusal", "refusal": refusal})
	}
	if len(parts) > 0 {
		output = append(output, object{
			"type": "message", "id": "msg_" + suffix, "status": "completed", "role": "assistant", "content": parts,
		})
	}
	for _, call := range calls {
		function, _ := call["function"].(object)
		callID, _ := call["id"].(string)
		output = append(output, object{
			"type":      "function_call",
			"id":        "fc_" + callID,
			"call_id":   call["id"],
			"name":      function["name"],
			"arguments": function["arguments"],
			"status":    "completed",
		})
	}
	status, incomplete := "completed", any(nil)
	switch choice["finish_reason"] {
	case "length":
		status, incomplete = "incomplete", object{"reason": "max_output_tokens"}
	case "content_filter":
		status, incomplete = "incomplete", object{"reason": "content_filter"}
	}
	return object{
		"id":                 chat["id"],
		"object":             "response",
		"created_at":         chat["created"],
		"model":              chat["model"],
		"status":             status,
		"incomplete_details": incomplete,
		"error":              nil,
		"output":             output,
		"output_text":        content,
		"usage":              responsesUsage(chat["usage"]),
	}, nil
}

func responsesUsage(raw any) any {
	usage, ok := raw.(object)
	if !ok {
		return nil
	}
	prompt, _ := usage["prompt_tokens_details"].(object)
	completion, _ := usage["completion_tokens_details"].(object)
	cached, reasoning := prompt["cached_tokens"], completion["reasoning_tokens"]
	if cached == nil {
		cached = 0
	}
	if reasoning == nil {
		reasoning = 0
	}
	return object{
		"input_tokens":          usage["prompt_tokens"],
		"input_tokens_details":  object{"cached_tokens": cached},
		"output_tokens":         usage["completion_tokens"],
		"output_tokens_details": object{"reasoning_tokens": reasoning},
		"total_tokens":          usage["total_tokens"],
	}
}
