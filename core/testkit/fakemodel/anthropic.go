package fakemodel

import (
	"encoding/json"
	"net/http"
	"strings"
)

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type anthropicRequest struct {
	Model  string `json:"model"`
	Stream bool   `json:"stream"`
	Tools  []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
}

// blocks reads a message's content: a string or a list of blocks.
func blocks(raw json.RawMessage) []anthropicBlock {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return []anthropicBlock{{Type: "text", Text: text}}
	}
	var bs []anthropicBlock
	json.Unmarshal(raw, &bs)
	return bs
}

// resultText is a tool_result's content as text.
func resultText(raw json.RawMessage) string {
	var parts []string
	for _, b := range blocks(raw) {
		if b.Type == "text" {
			parts = append(parts, b.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func (s *Server) anthropic(w http.ResponseWriter, r *http.Request, key string, body []byte) {
	var req anthropicRequest
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"fakemodel: bad JSON"}}`, http.StatusBadRequest)
		return
	}
	rec := Request{Provider: "anthropic", Method: r.Method, Path: r.URL.Path, Key: key}
	for _, t := range req.Tools {
		rec.Tools = append(rec.Tools, t.Name)
	}
	names := map[string]string{}
	for _, m := range req.Messages {
		for _, b := range blocks(m.Content) {
			switch b.Type {
			case "tool_use":
				names[b.ID] = b.Name
			case "tool_result":
				rec.Results = append(rec.Results, ToolResult{Name: names[b.ToolUseID], Text: resultText(b.Content), IsError: b.IsError})
			}
		}
	}
	s.record(rec)
	model := req.Model
	if model == "" {
		model = "capsem-fake-model"
	}
	var content map[string]any
	stop := "end_turn"
	var input []byte
	if step := s.next(rec.Results); step != nil {
		name := pickTool(rec.Tools, step.ToolSuffix)
		if name == "" {
			http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"fakemodel: no tool ending in `+step.ToolSuffix+` was offered"}}`, http.StatusBadRequest)
			return
		}
		input, _ = json.Marshal(step.Input)
		content = map[string]any{"type": "tool_use", "id": "toolu_fake_" + name, "name": name, "input": map[string]any{}}
		stop = "tool_use"
	} else {
		content = map[string]any{"type": "text", "text": ""}
	}
	usageIn := map[string]any{"input_tokens": InputTokens, "output_tokens": 1}
	if !req.Stream {
		block := content
		if stop == "tool_use" {
			var in map[string]any
			json.Unmarshal(input, &in)
			block = map[string]any{"type": "tool_use", "id": content["id"], "name": content["name"], "input": in}
		} else {
			block = map[string]any{"type": "text", "text": finalText(rec.Results)}
		}
		writeJSON(w, map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": model, "content": []any{block},
			"stop_reason": stop, "stop_sequence": nil, "usage": map[string]any{"input_tokens": InputTokens, "output_tokens": OutputTokens}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	sse(w, "message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_fake", "type": "message", "role": "assistant",
		"model": model, "content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": usageIn}})
	sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": content})
	if stop == "tool_use" {
		// In two pieces, as a real stream splits a tool's input.
		half := len(input) / 2
		for _, part := range []string{string(input[:half]), string(input[half:])} {
			sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "input_json_delta", "partial_json": part}})
		}
	} else {
		sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": finalText(rec.Results)}})
	}
	sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	sse(w, "message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": OutputTokens}})
	sse(w, "message_stop", map[string]any{"type": "message_stop"})
}
