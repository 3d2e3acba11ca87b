package netstack

import (
	"testing"
)

func TestUsageReader(t *testing.T) {
	cases := []struct {
		name, contentType string
		chunks            []string
		model             string
		in, out           int64
	}{
		{"anthropic stream", "text/event-stream; charset=utf-8", []string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-x\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\r\n\r\n",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usa", "ge\":{\"output_tokens\":9}}\n\n",
		}, "claude-x", 10, 9},
		{"anthropic json", "application/json", []string{`{"model":"claude-y","usage":{"input_tokens":4,`, `"output_tokens":2}}`}, "claude-y", 4, 2},
		{"openai chat stream", "text/event-stream", []string{
			"data: {\"model\":\"gpt-t\",\"choices\":[]}\n\n",
			"data: {\"model\":\"gpt-t\",\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n",
		}, "gpt-t", 7, 5},
		{"openai responses stream", "text/event-stream", []string{
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-r\",\"usage\":{\"input_tokens\":3,\"output_tokens\":8}}}\n\n",
		}, "gpt-r", 3, 8},
		{"google array", "application/json", []string{`[{"modelVersion":"gemini-z","usageMetadata":{"promptTokenCount":6}},`, `{"usageMetadata":{"promptTokenCount":6,"candidatesTokenCount":11}}]`}, "gemini-z", 6, 11},
		{"no usage", "text/html", []string{"<html>"}, "", 0, 0},
		{"stream without a final newline", "text/event-stream", []string{"data: {\"usage\":{\"output_tokens\":2}}"}, "", 0, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := newUsageReader(tc.contentType)
			for _, c := range tc.chunks {
				u.Write([]byte(c))
			}
			u.End()
			if u.Model != tc.model || u.Input != tc.in || u.Output != tc.out {
				t.Fatalf("got %q %d/%d, want %q %d/%d", u.Model, u.Input, u.Output, tc.model, tc.in, tc.out)
			}
		})
	}
}

func TestUsageReaderIsBounded(t *testing.T) {
	u := newUsageReader("application/json")
	chunk := make([]byte, 1<<20)
	for range 2 {
		u.Write(chunk)
	}
	if !u.over || len(u.body) != 0 {
		t.Fatalf("kept %d bytes of an over-long body", len(u.body))
	}
	s := newUsageReader("text/event-stream")
	for range 3 {
		s.Write(chunk) // one line, no newline
	}
	if len(s.line) > maxEventLine {
		t.Fatalf("kept a %d-byte line", len(s.line))
	}
	s.Write([]byte("\ndata: {\"usage\":{\"input_tokens\":1}}\n"))
	s.End()
	if s.Input != 1 {
		t.Fatal("the line after an over-long one was not read")
	}
}

func FuzzUsageReader(f *testing.F) {
	f.Add("text/event-stream", []byte("data: {\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":1}}}\n\n"), 3)
	f.Add("application/json", []byte(`[{"usageMetadata":{"candidatesTokenCount":-1}}]`), 1)
	f.Fuzz(func(t *testing.T, contentType string, body []byte, split int) {
		u := newUsageReader(contentType)
		if split <= 0 || split > len(body) {
			split = len(body)
		}
		u.Write(body[:split])
		u.Write(body[split:])
		u.End()
		if u.Input < 0 || u.Output < 0 {
			t.Fatalf("negative token counts %d/%d", u.Input, u.Output)
		}
	})
}
