package fakemodel

import (
	"encoding/json"
	"net/http"
	"strings"
)

type googlePart struct {
	Text         string `json:"text,omitempty"`
	FunctionCall *struct {
		Name string         `json:"name"`
		Args map[string]any `json:"args"`
	} `json:"functionCall,omitempty"`
	FunctionResponse *struct {
		Name     string         `json:"name"`
		Response map[string]any `json:"response"`
	} `json:"functionResponse,omitempty"`
}

type googleRequest struct {
	Contents []struct {
		Role  string       `json:"role"`
		Parts []googlePart `json:"parts"`
	} `json:"contents"`
	Tools []struct {
		FunctionDeclarations []struct {
			Name string `json:"name"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
	GenerationConfig struct {
		ResponseMimeType string `json:"responseMimeType"`
	} `json:"generationConfig"`
}

// google answers /v1beta/models/MODEL:ACTION: streamGenerateContent and
// generateContent play the script; countTokens counts; a JSON-mode
// generateContent (Gemini CLI's routing and next-speaker checks) gets a
// JSON object that sends it on with the model it was given.
func (s *Server) google(w http.ResponseWriter, r *http.Request, key string, body []byte) {
	rest := r.URL.Path[strings.Index(r.URL.Path, "/models/")+len("/models/"):]
	model, action, _ := strings.Cut(rest, ":")
	var req googleRequest
	if err := json.Unmarshal(body, &req); err != nil && action != "countTokens" {
		http.Error(w, `{"error":{"code":400,"message":"fakemodel: bad JSON","status":"INVALID_ARGUMENT"}}`, http.StatusBadRequest)
		return
	}
	rec := Request{Provider: "google", Method: r.Method, Path: r.URL.Path, Key: key}
	for _, t := range req.Tools {
		for _, d := range t.FunctionDeclarations {
			rec.Tools = append(rec.Tools, d.Name)
		}
	}
	for _, c := range req.Contents {
		for _, p := range c.Parts {
			if p.FunctionResponse != nil {
				text, _ := json.Marshal(p.FunctionResponse.Response)
				res := ToolResult{Name: p.FunctionResponse.Name, Text: string(text)}
				if _, failed := p.FunctionResponse.Response["error"]; failed {
					res.IsError = true
				}
				rec.Results = append(rec.Results, res)
			}
		}
	}
	s.record(rec)
	usage := map[string]any{"promptTokenCount": InputTokens, "candidatesTokenCount": OutputTokens, "totalTokenCount": InputTokens + OutputTokens}
	if action == "countTokens" {
		writeJSON(w, map[string]any{"totalTokens": InputTokens})
		return
	}
	var parts []any
	switch step := s.next(rec.Results); {
	case req.GenerationConfig.ResponseMimeType == "application/json":
		parts = []any{map[string]any{"text": `{"reasoning":"fake","next_speaker":"user","complexity_reasoning":"fake","complexity_score":1,"model_choice":"flash"}`}}
	case step != nil:
		name := pickTool(rec.Tools, step.ToolSuffix)
		if name == "" {
			http.Error(w, `{"error":{"code":400,"message":"fakemodel: no tool ending in `+step.ToolSuffix+` was offered","status":"INVALID_ARGUMENT"}}`, http.StatusBadRequest)
			return
		}
		parts = []any{map[string]any{"functionCall": map[string]any{"name": name, "args": step.Input}}}
	default:
		parts = []any{map[string]any{"text": finalText(rec.Results)}}
	}
	answer := map[string]any{"candidates": []any{map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": usage, "modelVersion": model}
	if action != "streamGenerateContent" {
		writeJSON(w, answer)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "", answer)
}
