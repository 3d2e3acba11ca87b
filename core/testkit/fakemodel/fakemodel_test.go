package fakemodel

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// client reaches the fake under the real host names, trusting its CA.
func client(t *testing.T, s *Server) *http.Client {
	pem, err := os.ReadFile(s.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, "127.0.0.1:"+s.Port)
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
}

func post(t *testing.T, c *http.Client, url, key string, body any) (*http.Response, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, strings.NewReader(string(b)))
	req.Header.Set("X-Api-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, string(out)
}

// events parses an event stream into its data objects.
func events(t *testing.T, stream string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stream))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var m map[string]any
			if err := json.Unmarshal([]byte(d), &m); err != nil {
				t.Fatalf("data %q: %v", d, err)
			}
			out = append(out, m)
		}
	}
	return out
}

func TestAnthropicPlaysTheScript(t *testing.T) {
	s := Start(t, Step{ToolSuffix: "__echo", Input: map[string]any{"message": "hi"}})
	c := client(t, s)
	url := "https://" + AnthropicHost + "/v1/messages?beta=true"
	tools := []map[string]any{{"name": "Bash"}, {"name": "mcp__capsem__everything__echo"}}
	resp, body := post(t, c, url, "k1", map[string]any{"model": "m", "stream": true, "tools": tools,
		"messages": []any{map[string]any{"role": "user", "content": "go"}}})
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("content type %q", resp.Header.Get("Content-Type"))
	}
	ev := events(t, body)
	if len(ev) != 7 || ev[1]["content_block"].(map[string]any)["name"] != "mcp__capsem__everything__echo" {
		t.Fatalf("first answer: %s", body)
	}
	partial := ev[2]["delta"].(map[string]any)["partial_json"].(string) + ev[3]["delta"].(map[string]any)["partial_json"].(string)
	if partial != `{"message":"hi"}` {
		t.Errorf("tool input %q", partial)
	}
	if u := ev[0]["message"].(map[string]any)["usage"].(map[string]any); u["input_tokens"] != float64(InputTokens) {
		t.Errorf("usage %v", u)
	}
	// The tool's result comes back: the answer is the final text.
	_, body = post(t, c, url, "k2", map[string]any{"model": "m", "stream": true, "tools": tools, "messages": []any{
		map[string]any{"role": "user", "content": "go"},
		map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "t1", "name": "mcp__capsem__everything__echo"}}},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "t1", "content": []any{map[string]any{"type": "text", "text": "Echo: hi"}}}}},
	}})
	ev = events(t, body)
	if len(ev) != 6 || ev[2]["delta"].(map[string]any)["text"] != "FAKE-DONE: Echo: hi" {
		t.Fatalf("final answer: %s", body)
	}
	reqs := s.Requests()
	if len(reqs) != 2 || reqs[0].Key != "k1" || reqs[1].Key != "k2" || len(reqs[1].Results) != 1 ||
		reqs[1].Results[0] != (ToolResult{Name: "mcp__capsem__everything__echo", Text: "Echo: hi"}) {
		t.Errorf("requests %+v", reqs)
	}
}

func TestAnthropicWithoutTheToolIsAnError(t *testing.T) {
	s := Start(t, Step{ToolSuffix: "__missing"})
	resp, body := post(t, client(t, s), "https://"+AnthropicHost+"/v1/messages", "k", map[string]any{"stream": true, "messages": []any{}})
	if resp.StatusCode != 400 || !strings.Contains(body, "__missing") {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
}

func TestGooglePlaysTheScript(t *testing.T) {
	s := Start(t, Step{ToolSuffix: "everything__echo", Input: map[string]any{"message": "hi"}})
	c := client(t, s)
	url := "https://" + GoogleHost + "/v1beta/models/gemini-fake:streamGenerateContent?alt=sse"
	tools := []any{map[string]any{"functionDeclarations": []any{map[string]any{"name": "mcp_capsem_everything__echo"}}}}
	_, body := post(t, c, url, "g1", map[string]any{"tools": tools, "contents": []any{map[string]any{"role": "user", "parts": []any{map[string]any{"text": "go"}}}}})
	ev := events(t, body)
	if len(ev) != 1 || !strings.Contains(body, `"functionCall":{"args":{"message":"hi"},"name":"mcp_capsem_everything__echo"}`) {
		t.Fatalf("first answer: %s", body)
	}
	_, body = post(t, c, url, "g2", map[string]any{"tools": tools, "contents": []any{
		map[string]any{"role": "user", "parts": []any{map[string]any{"functionResponse": map[string]any{"name": "mcp_capsem_everything__echo", "response": map[string]any{"output": "Echo: hi"}}}}},
	}})
	if !strings.Contains(body, `FAKE-DONE: {\"output\":\"Echo: hi\"}`) || !strings.Contains(body, `"promptTokenCount":321`) {
		t.Fatalf("final answer: %s", body)
	}
	// Gemini CLI's JSON-mode checks get a JSON object.
	_, body = post(t, c, "https://"+GoogleHost+"/v1beta/models/gemini-fake:generateContent", "g3",
		map[string]any{"contents": []any{}, "generationConfig": map[string]any{"responseMimeType": "application/json"}})
	if !strings.Contains(body, `next_speaker`) {
		t.Errorf("JSON mode: %s", body)
	}
	if reqs := s.Requests(); len(reqs) != 3 || reqs[1].Results[0].Text != `{"output":"Echo: hi"}` {
		t.Errorf("requests %+v", reqs)
	}
}

// FuzzServe: whatever a CLI sends, the fake answers without panicking.
func FuzzServe(f *testing.F) {
	f.Add("/v1/messages", `{"stream":true,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`)
	f.Add("/v1beta/models/m:streamGenerateContent", `{"contents":[{"parts":[{"functionResponse":{"name":"x","response":null}}]}]}`)
	f.Add("/v1beta/models/m:countTokens", `{}`)
	f.Add("/v1beta/models/", `[`)
	s := &Server{script: []Step{{ToolSuffix: "x"}}}
	f.Fuzz(func(t *testing.T, path, body string) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := http.NewRequest("POST", "https://"+AnthropicHost+path, strings.NewReader(body))
		if err != nil {
			return
		}
		s.serve(httptest.NewRecorder(), req)
	})
}
