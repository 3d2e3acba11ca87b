// Package fakemodel is the only stand-in of the end-to-end agent tests: a
// scripted fake of the model APIs that real AI CLIs call (Anthropic's
// Messages API with streaming and tool_use blocks, Google's
// generateContent and streamGenerateContent), served over TLS on the
// host's loopback under the real API host names, with a certificate of its
// own CA. A VM reaches it through the network policy's hosts and
// allow_private, and through a [[net.credentials]] entry whose secret only
// this server and the host know: what the fake sees as the key proves the
// swap.
//
// The script is the tools to call, in order: each answer calls the next
// one the request's tool list offers (matched by name suffix), and once
// every step has a result the answer is text, "FAKE-DONE: " and the last
// tool result.
package fakemodel

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/capsem/capsem/core/netca"
)

// API host names the fake answers for.
const (
	AnthropicHost = "api.anthropic.com"
	GoogleHost    = "generativelanguage.googleapis.com"
)

// Token counts every answer reports (so a test can find them in the
// ledger's model_calls).
const (
	InputTokens  = 321
	OutputTokens = 45
)

// Step is one tool call the fake asks for.
type Step struct {
	// ToolSuffix picks the tool: the first offered whose name ends with it.
	ToolSuffix string
	Input      map[string]any
}

// Request is what the fake saw of one request.
type Request struct {
	Provider, Method, Path string
	// Key is the API key the request carried (x-api-key, x-goog-api-key
	// or a bearer token).
	Key string
	// Tools are the tool names the request offered.
	Tools []string
	// Results are the tool results it carried, in order.
	Results []ToolResult
}

// ToolResult is one tool result a request carried back.
type ToolResult struct {
	Name, Text string
	IsError    bool
}

// Server is a running fake.
type Server struct {
	// Port is the loopback port it listens on, for both hosts.
	Port string
	// CAFile is the PEM of the CA its certificates chain to (the
	// credential's ca_file).
	CAFile string
	// Secret is the API key the host must put on requests (written to
	// SecretFile, the credential's source_file).
	Secret, SecretFile string

	script []Step
	srv    *httptest.Server

	mu       sync.Mutex
	requests []Request
}

// Start starts a fake that plays script, stopped when t ends.
func Start(t testing.TB, script ...Step) *Server {
	t.Helper()
	dir := t.TempDir()
	ca, err := netca.LoadOrCreate(filepath.Join(dir, "fake-model-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{script: script, CAFile: filepath.Join(dir, "fake-model-roots.pem"), SecretFile: filepath.Join(dir, "model.key")}
	if err := os.WriteFile(s.CAFile, ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 16)
	rand.Read(random)
	s.Secret = "sk-fake-model-" + hex.EncodeToString(random)
	if err := os.WriteFile(s.SecretFile, []byte(s.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := map[string]*tls.Certificate{}
	for _, name := range []string{AnthropicHost, GoogleHost} {
		if certs[name], err = ca.Leaf(name); err != nil {
			t.Fatal(err)
		}
	}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.srv.EnableHTTP2 = true
	s.srv.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c, ok := certs[h.ServerName]; ok {
			return c, nil
		}
		return nil, fmt.Errorf("fakemodel: no certificate for %q", h.ServerName)
	}}
	s.srv.StartTLS()
	t.Cleanup(s.srv.Close)
	_, s.Port, _ = net.SplitHostPort(s.srv.Listener.Addr().String())
	return s
}

// Requests is every request so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func (s *Server) record(r Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := r.Header.Get("X-Api-Key")
	if key == "" {
		key = r.Header.Get("X-Goog-Api-Key")
	}
	if key == "" {
		key = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	if key == "" {
		key = r.URL.Query().Get("key")
	}
	path := r.URL.Path
	switch {
	case path == "/api/hello":
		s.record(Request{Provider: "anthropic", Method: r.Method, Path: path, Key: key})
	case path == "/v1/messages/count_tokens":
		s.record(Request{Provider: "anthropic", Method: r.Method, Path: path, Key: key})
		writeJSON(w, map[string]any{"input_tokens": InputTokens})
	case path == "/v1/messages":
		s.anthropic(w, r, key, body)
	case strings.HasPrefix(path, "/v1beta/models/") || strings.HasPrefix(path, "/v1/models/"):
		s.google(w, r, key, body)
	default:
		s.record(Request{Provider: "unknown", Method: r.Method, Path: path, Key: key})
		http.Error(w, "fakemodel: no such route "+path, http.StatusNotFound)
	}
}

// next is the step to ask for after results, or nil for the final text.
func (s *Server) next(results []ToolResult) *Step {
	if len(results) < len(s.script) {
		return &s.script[len(results)]
	}
	return nil
}

func finalText(results []ToolResult) string {
	if len(results) == 0 {
		return "FAKE-DONE: no tool was called"
	}
	return "FAKE-DONE: " + results[len(results)-1].Text
}

func pickTool(tools []string, suffix string) string {
	for _, t := range tools {
		if strings.HasSuffix(t, suffix) {
			return t
		}
	}
	return ""
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// sse writes one server-sent event and flushes it.
func sse(w http.ResponseWriter, event string, data any) {
	b, _ := json.Marshal(data)
	if event != "" {
		fmt.Fprintf(w, "event: %s\n", event)
	}
	fmt.Fprintf(w, "data: %s\n\n", b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}
