package builtintools

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const testPage = `<!DOCTYPE html><html><head><title>Test Page</title>
<script>var leaked = "SCRIPT-SECRET";</script><style>.x{color:red}</style></head>
<body><h1>Welcome</h1><p>Read the <a href="/docs">docs</a> for <b>details</b>.</p>
<ul><li>first item</li><li>second item</li></ul></body></html>`

// multibyteText has characters of every UTF-8 length, for pagination.
var multibyteText = strings.Repeat("añ€😀", 40)

// upstream is a loopback HTTP server with the routes the tests use. It
// records the Host of every request so tests can prove a blocked host was
// never contacted.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	hosts []string
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	up := &upstream{}
	mux := http.NewServeMux()
	mux.HandleFunc("/html", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, testPage)
	})
	mux.HandleFunc("/text", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, multibyteText)
	})
	mux.HandleFunc("/lines", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		for i := 1; i <= 20; i++ {
			word := "filler"
			if i%5 == 0 {
				word = "NEEDLE"
			}
			fmt.Fprintf(w, "line %d %s\n", i, word)
		}
	})
	mux.HandleFunc("/png", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		w.Write([]byte("\x89PNG\r\n\x1a\n\x00\x01\x02\xff"))
	})
	mux.HandleFunc("/untyped-binary", func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // stop net/http from adding one
		w.Write([]byte("\x00\x01\x02\x03binary\xff\xfe"))
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, strings.Repeat("x", 1000))
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	mux.HandleFunc("/stall-body", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "1000")
		io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		json.NewEncoder(w).Encode(map[string]string{
			"method": r.Method, "body": string(body), "x_test": r.Header.Get("X-Test"), "user_agent": r.UserAgent(),
		})
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such page here", http.StatusNotFound)
	})
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up.mu.Lock()
		up.hosts = append(up.hosts, r.Host)
		up.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	return up
}

// port is the server's loopback port, for URLs with made-up host names.
func (up *upstream) port() string {
	_, port, _ := net.SplitHostPort(up.Listener.Addr().String())
	return port
}

func (up *upstream) sawHost(prefix string) bool {
	up.mu.Lock()
	defer up.mu.Unlock()
	for _, host := range up.hosts {
		if strings.HasPrefix(host, prefix) {
			return true
		}
	}
	return false
}

// publicTestAddress is what made-up names resolve to in loopbackNet: a
// documentation address (TEST-NET-3) that the guard treats as public and
// that is never really dialed.
var publicTestAddress = netip.MustParseAddr("203.0.113.7")

// loopbackNet gives made-up host names addresses and sends every connection
// to the upstream server, whatever the address, so the domain policy and the
// private-network guard are tested with real names and addresses. Names
// under .invalid fail the way an unknown host does; names in resolved get
// those addresses; any other name gets publicTestAddress. dialed records
// each address the guard let through.
type loopbackNet struct {
	up       *upstream
	resolved map[string][]netip.Addr
	mu       sync.Mutex
	dialed   []string
}

func loopbackDial(up *upstream) *netHooks {
	return (&loopbackNet{up: up}).hooks()
}

func (n *loopbackNet) hooks() *netHooks {
	var dialer net.Dialer
	return &netHooks{
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			host = strings.ToLower(strings.TrimSuffix(host, "."))
			if strings.HasSuffix(host, ".invalid") {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			if addrs, ok := n.resolved[host]; ok {
				return addrs, nil
			}
			return []netip.Addr{publicTestAddress}, nil
		},
		dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			n.mu.Lock()
			n.dialed = append(n.dialed, address)
			n.mu.Unlock()
			return dialer.DialContext(ctx, network, n.up.Listener.Addr().String())
		},
	}
}

func (n *loopbackNet) dialedAddresses() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.dialed...)
}

// connect serves a builtin server over in-memory transports and returns a
// real go-sdk client session to it.
func connect(t *testing.T, cfg Config, hooks *netHooks) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	server := newServer(cfg, "test", hooks)
	serverTransport, clientTransport := mcp.NewInMemoryTransports()
	serverSession, err := server.Connect(ctx, serverTransport, nil)
	if err != nil {
		t.Fatalf("server connect: %v", err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "builtintools-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, clientTransport, nil)
	if err != nil {
		t.Fatalf("client connect: %v", err)
	}
	t.Cleanup(func() {
		session.Close()
		serverSession.Wait()
	})
	return session
}

func callTool(t *testing.T, session *mcp.ClientSession, name string, arguments map[string]any) *mcp.CallToolResult {
	t.Helper()
	result, err := session.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: arguments})
	if err != nil {
		t.Fatalf("CallTool(%s): %v", name, err)
	}
	return result
}

func resultText(t *testing.T, result *mcp.CallToolResult) string {
	t.Helper()
	if len(result.Content) != 1 {
		t.Fatalf("want exactly one content block, got %d", len(result.Content))
	}
	text, ok := result.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T, want text", result.Content[0])
	}
	return text.Text
}

// successText fails the test unless the call succeeded, and returns its text.
func successText(t *testing.T, result *mcp.CallToolResult) string {
	t.Helper()
	text := resultText(t, result)
	if result.IsError {
		t.Fatalf("unexpected tool error: %s", text)
	}
	return text
}

// errorText fails the test unless the call failed with IsError, and returns its text.
func errorText(t *testing.T, result *mcp.CallToolResult) string {
	t.Helper()
	text := resultText(t, result)
	if !result.IsError {
		t.Fatalf("expected a tool error, got success: %.300s", text)
	}
	return text
}

func netEvents(t *testing.T, result *mcp.CallToolResult) []NetEvent {
	t.Helper()
	if _, ok := result.Meta[MetaKeyNetEvents]; !ok {
		t.Fatalf("result has no %s in _meta: %v", MetaKeyNetEvents, result.Meta)
	}
	events, err := NetEventsFromMeta(result.Meta)
	if err != nil {
		t.Fatal(err)
	}
	return events
}

// singleEvent returns the only event of a call.
func singleEvent(t *testing.T, result *mcp.CallToolResult) NetEvent {
	t.Helper()
	events := netEvents(t, result)
	if len(events) != 1 {
		t.Fatalf("want 1 net event, got %d: %+v", len(events), events)
	}
	return events[0]
}

func decodeJSONOutput(t *testing.T, text string) httpResponseJSON {
	t.Helper()
	var output httpResponseJSON
	decoder := json.NewDecoder(strings.NewReader(text))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(&output); err != nil {
		t.Fatalf("output is not the JSON object: %v\n%s", err, text)
	}
	return output
}

func TestToolsListAnnotationsAndSchemas(t *testing.T) {
	session := connect(t, Config{}, nil)
	listed, err := session.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	want := map[string]hints{
		ToolFetchHTTP:   {readOnly: true, idempotent: true, openWorld: true},
		ToolGrepHTTP:    {readOnly: true, idempotent: true, openWorld: true},
		ToolHTTPHeaders: {readOnly: true, idempotent: true, openWorld: true},
		ToolHTTPGet:     {readOnly: true, idempotent: true, openWorld: true},
		ToolHTTPHead:    {readOnly: true, idempotent: true, openWorld: true},
		ToolHTTPPost:    {destructive: true, openWorld: true},
		ToolHTTPPut:     {destructive: true, idempotent: true, openWorld: true},
		ToolHTTPPatch:   {destructive: true, openWorld: true},
		ToolHTTPDelete:  {destructive: true, idempotent: true, openWorld: true},
	}
	if len(listed.Tools) != len(want) {
		t.Errorf("listed %d tools, want %d", len(listed.Tools), len(want))
	}
	for _, tool := range listed.Tools {
		expected, ok := want[tool.Name]
		if !ok {
			t.Errorf("unexpected tool %q", tool.Name)
			continue
		}
		annotations := tool.Annotations
		if annotations == nil || annotations.DestructiveHint == nil || annotations.OpenWorldHint == nil {
			t.Errorf("%s: annotations missing or incomplete: %+v", tool.Name, annotations)
			continue
		}
		got := hints{annotations.ReadOnlyHint, *annotations.DestructiveHint, annotations.IdempotentHint, *annotations.OpenWorldHint}
		if got != expected {
			t.Errorf("%s: hints %+v, want %+v", tool.Name, got, expected)
		}
		if tool.Description == "" || annotations.Title == "" {
			t.Errorf("%s: missing description or title", tool.Name)
		}
		schema, err := json.Marshal(tool.InputSchema)
		if err != nil {
			t.Fatal(err)
		}
		var decoded struct {
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(schema, &decoded); err != nil {
			t.Fatal(err)
		}
		if len(decoded.Required) == 0 || decoded.Required[0] != "url" {
			t.Errorf("%s: url is not required: %s", tool.Name, schema)
		}
		for name, property := range decoded.Properties {
			if !strings.Contains(string(property), `"description"`) {
				t.Errorf("%s: property %s has no description", tool.Name, name)
			}
		}
		switch tool.Name {
		case ToolFetchHTTP:
			if !strings.Contains(string(schema), `"enum":["markdown","content","raw"]`) || !strings.Contains(string(schema), `"default":5000`) {
				t.Errorf("fetch_http schema lacks format enum or max_length default: %s", schema)
			}
		case ToolHTTPPost, ToolHTTPPut, ToolHTTPPatch, ToolHTTPDelete:
			if _, ok := decoded.Properties["body"]; !ok {
				t.Errorf("%s has no body parameter", tool.Name)
			}
		case ToolHTTPGet, ToolHTTPHead:
			if _, ok := decoded.Properties["body"]; ok {
				t.Errorf("%s should not take a body", tool.Name)
			}
		}
	}
}

func TestFetchHTTPFormats(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	tests := []struct {
		name        string
		format      string
		wantContain []string
		wantAbsent  []string
	}{
		{
			name:   "markdown",
			format: "markdown",
			wantContain: []string{
				"URL: " + up.URL + "/html\n", "Status: 200 OK\n", "Title: Test Page\n",
				"# Welcome", "Read the [docs](" + up.URL + "/docs) for **details**.", "- first item\n- second item",
			},
			wantAbsent: []string{"SCRIPT-SECRET", "color:red", "<p>"},
		},
		{
			name:        "content",
			format:      "content",
			wantContain: []string{"Welcome\n\nRead the docs for details.", "- first item"},
			wantAbsent:  []string{"SCRIPT-SECRET", "# Welcome", "](", "**"},
		},
		{
			name:        "raw",
			format:      "raw",
			wantContain: []string{"<h1>Welcome</h1>", "SCRIPT-SECRET"},
		},
		{
			name:        "default is markdown",
			wantContain: []string{"# Welcome"},
		},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			arguments := map[string]any{"url": up.URL + "/html", "max_length": 100000}
			if test.format != "" {
				arguments["format"] = test.format
			}
			result := callTool(t, session, ToolFetchHTTP, arguments)
			text := successText(t, result)
			for _, want := range test.wantContain {
				if !strings.Contains(text, want) {
					t.Errorf("output lacks %q:\n%s", want, text)
				}
			}
			for _, unwanted := range test.wantAbsent {
				if strings.Contains(text, unwanted) {
					t.Errorf("output contains %q:\n%s", unwanted, text)
				}
			}
			event := singleEvent(t, result)
			if event.Decision != DecisionAllowed || event.StatusCode != 200 || event.Method != "GET" || event.Path != "/html" ||
				event.Domain != "127.0.0.1" || strconv.Itoa(event.Port) != up.port() || event.BytesReceived != int64(len(testPage)) ||
				event.IP != "127.0.0.1" {
				t.Errorf("event = %+v", event)
			}
		})
	}
}

func TestFetchHTTPBinaryRefusedUnlessRaw(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	for _, path := range []string{"/png", "/untyped-binary"} {
		t.Run(path, func(t *testing.T) {
			refused := callTool(t, session, ToolFetchHTTP, map[string]any{"url": up.URL + path})
			if text := errorText(t, refused); !strings.Contains(text, "refused binary content") || !strings.Contains(text, "format=raw") {
				t.Errorf("refusal message = %q", text)
			}
			if event := singleEvent(t, refused); event.Decision != DecisionError || event.StatusCode != 200 || !strings.Contains(event.Error, "binary") {
				t.Errorf("refusal event = %+v", event)
			}
			grepRefused := callTool(t, session, ToolGrepHTTP, map[string]any{"url": up.URL + path, "pattern": "binary"})
			errorText(t, grepRefused)

			raw := callTool(t, session, ToolFetchHTTP, map[string]any{"url": up.URL + path, "format": "raw"})
			text := successText(t, raw)
			header, body, found := strings.Cut(text, "\n\n")
			if !found || !strings.Contains(header, "Encoding: base64") {
				t.Fatalf("raw output has no base64 header:\n%s", text)
			}
			if _, err := base64.StdEncoding.DecodeString(body); err != nil {
				t.Errorf("raw body is not base64: %v", err)
			}
			if event := singleEvent(t, raw); event.Decision != DecisionAllowed {
				t.Errorf("raw event = %+v", event)
			}
		})
	}
}

func TestFetchHTTPPaginationKeepsCharactersWhole(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	var joined strings.Builder
	for start, pages := 0, 0; ; pages++ {
		if pages > len(multibyteText) {
			t.Fatal("pagination does not progress")
		}
		result := callTool(t, session, ToolFetchHTTP, map[string]any{"url": up.URL + "/text", "start_index": start, "max_length": 7})
		header, chunk, _ := strings.Cut(successText(t, result), "\n\n")
		if !utf8.ValidString(chunk) {
			t.Fatalf("page at %d is not valid UTF-8: %q", start, chunk)
		}
		joined.WriteString(chunk)
		_, next, more := strings.Cut(header, "use start_index=")
		if !more {
			break
		}
		nextIndex, err := strconv.Atoi(strings.TrimSuffix(strings.SplitN(next, " ", 2)[0], "."))
		if err != nil {
			t.Fatalf("cannot read next start_index from %q", header)
		}
		if nextIndex <= start {
			t.Fatalf("next start_index %d does not advance from %d", nextIndex, start)
		}
		start = nextIndex
	}
	if joined.String() != multibyteText {
		t.Errorf("pages joined = %q, want the original text", joined.String())
	}

	past := callTool(t, session, ToolFetchHTTP, map[string]any{"url": up.URL + "/text", "start_index": len(multibyteText) + 1})
	if text := errorText(t, past); !strings.Contains(text, "past the end") {
		t.Errorf("start_index past the end: %q", text)
	}
}

func TestFetchHTTPErrorStatus(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	result := callTool(t, session, ToolFetchHTTP, map[string]any{"url": up.URL + "/missing"})
	text := errorText(t, result)
	if !strings.Contains(text, "HTTP 404 Not Found from "+up.URL+"/missing") || !strings.Contains(text, "no such page here") {
		t.Errorf("error = %q", text)
	}
	if event := singleEvent(t, result); event.Decision != DecisionAllowed || event.StatusCode != 404 {
		t.Errorf("event = %+v (the exchange itself succeeded)", event)
	}
}

func TestGrepHTTP(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	tests := []struct {
		name        string
		arguments   map[string]any
		wantContain []string
		wantAbsent  []string
	}{
		{
			name:      "case-insensitive with context",
			arguments: map[string]any{"url": up.URL + "/lines", "pattern": "needle", "context_lines": 1},
			wantContain: []string{
				"Pattern: needle\n", "Matches found: 4\n",
				"--- Match 1 (line 5) ---\n    4: line 4 filler\n>>> 5: line 5 NEEDLE\n    6: line 6 filler\n",
				"--- Match 4 (line 20) ---\n    19: line 19 filler\n>>> 20: line 20 NEEDLE\n    21: \n",
			},
		},
		{
			name:        "default context is three lines",
			arguments:   map[string]any{"url": up.URL + "/lines", "pattern": "line 10 "},
			wantContain: []string{"    7: line 7 filler\n", ">>> 10: line 10 NEEDLE\n", "    13: line 13 filler\n"},
			wantAbsent:  []string{"    6: ", "    14: "},
		},
		{
			name:        "max matches",
			arguments:   map[string]any{"url": up.URL + "/lines", "pattern": "NEEDLE", "max_matches": 2, "context_lines": 0},
			wantContain: []string{"Matches found: 4 (showing the first 2; raise max_matches to see more)", "--- Match 2 (line 10) ---"},
			wantAbsent:  []string{"--- Match 3"},
		},
		{
			name:        "no match",
			arguments:   map[string]any{"url": up.URL + "/lines", "pattern": "absent-word"},
			wantContain: []string{"Matches found: 0"},
			wantAbsent:  []string{"--- Match"},
		},
		{
			name:        "html is searched as text",
			arguments:   map[string]any{"url": up.URL + "/html", "pattern": "details|leaked"},
			wantContain: []string{"Matches found: 1", ">>> "},
			wantAbsent:  []string{"SCRIPT-SECRET", "<b>"},
		},
		{
			name:        "raw searches markup",
			arguments:   map[string]any{"url": up.URL + "/html", "pattern": "<b>details", "raw": true},
			wantContain: []string{"Matches found: 1", "<b>details</b>"},
		},
		{
			name:        "paginated report",
			arguments:   map[string]any{"url": up.URL + "/lines", "pattern": "NEEDLE", "max_length": 40},
			wantContain: []string{"Matches found: 4", "use start_index="},
		},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			result := callTool(t, session, ToolGrepHTTP, test.arguments)
			text := successText(t, result)
			for _, want := range test.wantContain {
				if !strings.Contains(text, want) {
					t.Errorf("output lacks %q:\n%s", want, text)
				}
			}
			for _, unwanted := range test.wantAbsent {
				if strings.Contains(text, unwanted) {
					t.Errorf("output contains %q:\n%s", unwanted, text)
				}
			}
			if event := singleEvent(t, result); event.Decision != DecisionAllowed {
				t.Errorf("event = %+v", event)
			}
		})
	}
}

func TestGrepHTTPBadPatterns(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	tests := []struct {
		pattern string
		want    string
	}{
		{pattern: "", want: "pattern"},
		{pattern: "(unclosed", want: `invalid pattern "(unclosed"`},
		{pattern: `(?<=x)y`, want: "invalid pattern"},
	}
	for _, test := range tests {
		result := callTool(t, session, ToolGrepHTTP, map[string]any{"url": up.URL + "/lines", "pattern": test.pattern})
		if text := errorText(t, result); !strings.Contains(text, test.want) {
			t.Errorf("pattern %q: error %q, want containing %q", test.pattern, text, test.want)
		}
	}
	if up.sawHost("127.0.0.1") {
		t.Error("a request was sent although the pattern was rejected first")
	}
}

func TestHTTPHeaders(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	for _, method := range []string{"", "HEAD", "GET"} {
		t.Run("method="+method, func(t *testing.T) {
			arguments := map[string]any{"url": up.URL + "/echo"}
			if method != "" {
				arguments["method"] = method
			}
			result := callTool(t, session, ToolHTTPHeaders, arguments)
			var output headersJSON
			decoder := json.NewDecoder(strings.NewReader(successText(t, result)))
			decoder.DisallowUnknownFields()
			if err := decoder.Decode(&output); err != nil {
				t.Fatalf("output is not JSON: %v", err)
			}
			wantMethod := method
			if wantMethod == "" {
				wantMethod = "HEAD"
			}
			if output.Method != wantMethod || output.Status != 200 || output.StatusText != "OK" ||
				output.Headers["X-Multi"] != "a, b" || output.Headers["Content-Type"] != "application/json" {
				t.Errorf("output = %+v", output)
			}
			if event := singleEvent(t, result); event.Method != wantMethod || event.Decision != DecisionAllowed || event.BytesReceived != 0 {
				t.Errorf("event = %+v", event)
			}
		})
	}
	bad := callTool(t, session, ToolHTTPHeaders, map[string]any{"url": up.URL, "method": "POST"})
	errorText(t, bad)
}

func TestHTTPMethodTools(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	tests := []struct {
		tool       string
		method     string
		body       string
		wantStatus int
	}{
		{ToolHTTPGet, "GET", "", 200},
		{ToolHTTPPost, "POST", `{"name":"capsem"}`, 201},
		{ToolHTTPPut, "PUT", "put body", 200},
		{ToolHTTPPatch, "PATCH", "patch body", 200},
		{ToolHTTPDelete, "DELETE", "", 200},
		{ToolHTTPDelete, "DELETE", "delete body", 200},
		{ToolHTTPHead, "HEAD", "", 200},
	}
	for _, test := range tests {
		t.Run(test.tool+"/"+test.body, func(t *testing.T) {
			arguments := map[string]any{"url": up.URL + "/echo?q=1", "headers": map[string]any{"X-Test": "header-value"}}
			if test.body != "" {
				arguments["body"] = test.body
			}
			result := callTool(t, session, test.tool, arguments)
			text := successText(t, result)
			output := decodeJSONOutput(t, text)
			if output.Method != test.method || output.Status != test.wantStatus || output.URL != up.URL+"/echo?q=1" ||
				output.BodyEncoding != "utf-8" || output.Headers["X-Multi"] != "a, b" || output.Truncated {
				t.Errorf("output = %+v", output)
			}
			if test.method == "HEAD" {
				if output.Body != "" {
					t.Errorf("HEAD returned a body: %q", output.Body)
				}
			} else {
				var echoed map[string]string
				if err := json.Unmarshal([]byte(output.Body), &echoed); err != nil {
					t.Fatalf("echoed body is not JSON: %v: %q", err, output.Body)
				}
				if echoed["method"] != test.method || echoed["body"] != test.body || echoed["x_test"] != "header-value" ||
					!strings.HasPrefix(echoed["user_agent"], "capsem-builtin/") {
					t.Errorf("server saw %+v", echoed)
				}
			}
			event := singleEvent(t, result)
			if event.Method != test.method || event.Query != "q=1" || event.BytesSent != int64(len(test.body)) ||
				event.StatusCode != test.wantStatus || event.Decision != DecisionAllowed {
				t.Errorf("event = %+v", event)
			}
		})
	}
}

func TestHTTPToolsJSONPaginationAndBinary(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)

	var joined strings.Builder
	for start := 0; ; {
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/text", "start_index": start, "max_length": 5})
		output := decodeJSONOutput(t, successText(t, result))
		if !utf8.ValidString(output.Body) || output.StartIndex != start || output.TotalLength != len(multibyteText) {
			t.Fatalf("page = %+v", output)
		}
		joined.WriteString(output.Body)
		if output.NextStartIndex == nil {
			if output.EndIndex != output.TotalLength {
				t.Fatalf("last page ends at %d of %d", output.EndIndex, output.TotalLength)
			}
			break
		}
		if !output.Truncated || *output.NextStartIndex <= start {
			t.Fatalf("page = %+v", output)
		}
		start = *output.NextStartIndex
	}
	if joined.String() != multibyteText {
		t.Error("JSON pages do not join back to the body")
	}

	binary := decodeJSONOutput(t, successText(t, callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/png"})))
	decoded, err := base64.StdEncoding.DecodeString(binary.Body)
	if binary.BodyEncoding != "base64" || err != nil || string(decoded) != "\x89PNG\r\n\x1a\n\x00\x01\x02\xff" {
		t.Errorf("binary output = %+v (decode error %v)", binary, err)
	}
}

func TestHTTPRequestHeaderValidation(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	tests := []struct {
		headers map[string]any
		want    string
	}{
		{map[string]any{"Host": "evil.com"}, `header "Host" cannot be set`},
		{map[string]any{"content-length": "5"}, `header "content-length" cannot be set`},
		{map[string]any{"Bad Name": "x"}, `invalid header name "Bad Name"`},
		{map[string]any{"X-Split": "a\r\nInjected: yes"}, "line break"},
	}
	for _, test := range tests {
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/echo", "headers": test.headers})
		if text := errorText(t, result); !strings.Contains(text, test.want) {
			t.Errorf("headers %v: error %q, want containing %q", test.headers, text, test.want)
		}
		if event := singleEvent(t, result); event.Decision != DecisionError {
			t.Errorf("event = %+v", event)
		}
	}
}

func TestDomainPolicyEnforced(t *testing.T) {
	tests := []struct {
		name        string
		cfg         Config
		host        string
		wantAllowed bool
		wantMessage string
		wantRule    string
	}{
		{name: "no policy", host: "anything.test", wantAllowed: true},
		{name: "exact block", cfg: Config{Block: []string{"evil.com"}}, host: "evil.com",
			wantMessage: `HTTP request blocked: evil.com (domain blocked by "evil.com")`, wantRule: "evil.com"},
		{name: "wildcard block", cfg: Config{Block: []string{"*.com"}}, host: "evil.com",
			wantMessage: `HTTP request blocked: evil.com (domain blocked by "*.com")`, wantRule: "*.com"},
		{name: "block ignores case and trailing dot", cfg: Config{Block: []string{"evil.com"}}, host: "EVIL.Com.",
			wantMessage: `HTTP request blocked: evil.com (domain blocked by "evil.com")`, wantRule: "evil.com"},
		{name: "wildcard allow covers subdomain", cfg: Config{Allow: []string{"*.example.test"}}, host: "api.example.test",
			wantAllowed: true, wantRule: "*.example.test"},
		{name: "wildcard allow does not cover apex", cfg: Config{Allow: []string{"*.example.test"}}, host: "example.test",
			wantMessage: "HTTP request blocked: example.test (domain not in allow list)"},
		{name: "allow list denies others", cfg: Config{Allow: []string{"good.test"}}, host: "other.test",
			wantMessage: "HTTP request blocked: other.test (domain not in allow list)"},
		{name: "block before allow", cfg: Config{Allow: []string{"*.example.test"}, Block: []string{"secret.example.test"}},
			host: "secret.example.test", wantMessage: `HTTP request blocked: secret.example.test (domain blocked by "secret.example.test")`,
			wantRule: "secret.example.test"},
		{name: "invalid policy fails closed", cfg: Config{Block: []string{"bad*pattern"}}, host: "anything.test",
			wantMessage: "HTTP request blocked: anything.test (domain policy is invalid: block list"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			up := newUpstream(t)
			port := up.port()
			session := connect(t, test.cfg, loopbackDial(up))
			url := "http://" + test.host + ":" + port + "/echo"
			for _, tool := range []string{ToolFetchHTTP, ToolHTTPGet, ToolHTTPPost} {
				result := callTool(t, session, tool, map[string]any{"url": url})
				event := singleEvent(t, result)
				if event.MatchedRule != test.wantRule || strconv.Itoa(event.Port) != port {
					t.Errorf("%s: event = %+v, want rule %q", tool, event, test.wantRule)
				}
				if test.wantAllowed {
					successText(t, result)
					if event.Decision != DecisionAllowed {
						t.Errorf("%s: event = %+v", tool, event)
					}
					continue
				}
				if text := errorText(t, result); !strings.HasPrefix(text, test.wantMessage) {
					t.Errorf("%s: error %q, want prefix %q", tool, text, test.wantMessage)
				}
				if event.Decision != DecisionDenied || event.StatusCode != 0 || event.BytesReceived != 0 || event.Error == "" {
					t.Errorf("%s: denied event = %+v", tool, event)
				}
			}
			if !test.wantAllowed && up.sawHost(strings.ToLower(strings.TrimSuffix(test.host, "."))) {
				t.Errorf("blocked host %s was contacted", test.host)
			}
		})
	}
}

func TestRedirectToBlockedHostIsRefusedAtTheHop(t *testing.T) {
	up := newUpstream(t)
	port := up.port()
	session := connect(t, Config{Block: []string{"*.evil.test"}}, loopbackDial(up))
	blockedURL := "http://www.evil.test:" + port + "/echo"
	// Two allowed hops, then a redirect into the blocked domain.
	secondHop := "http://safe.test:" + port + "/redirect?to=" + blockedURL
	firstURL := "http://start.test:" + port + "/redirect?to=" + strings.ReplaceAll(secondHop, "?to=", "%3Fto=")

	for _, tool := range []string{ToolFetchHTTP, ToolHTTPGet, ToolHTTPHeaders} {
		t.Run(tool, func(t *testing.T) {
			result := callTool(t, session, tool, map[string]any{"url": firstURL})
			text := errorText(t, result)
			wantMessage := `HTTP request blocked: www.evil.test (domain blocked by "*.evil.test"; redirected from http://safe.test:` + port + "/redirect?to="
			if !strings.HasPrefix(text, wantMessage) {
				t.Errorf("error = %q, want prefix %q", text, wantMessage)
			}
			events := netEvents(t, result)
			if len(events) != 3 {
				t.Fatalf("want an event per hop (3), got %+v", events)
			}
			wantDomains := []string{"start.test", "safe.test", "www.evil.test"}
			wantDecisions := []string{DecisionAllowed, DecisionAllowed, DecisionDenied}
			wantStatus := []int{302, 302, 0}
			for i, event := range events {
				if event.Domain != wantDomains[i] || event.Decision != wantDecisions[i] || event.StatusCode != wantStatus[i] {
					t.Errorf("hop %d: event = %+v, want %s %s %d", i, event, wantDomains[i], wantDecisions[i], wantStatus[i])
				}
			}
			if events[2].MatchedRule != "*.evil.test" || events[2].Path != "/echo" {
				t.Errorf("denied hop = %+v", events[2])
			}
		})
	}
	if up.sawHost("www.evil.test") {
		t.Error("the blocked redirect target was contacted")
	}
}

func TestRedirectsAllowedAreFollowedAndRecorded(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/redirect?to=/echo"})
	output := decodeJSONOutput(t, successText(t, result))
	if output.FinalURL != up.URL+"/echo" || output.URL != up.URL+"/redirect?to=/echo" || output.Status != 200 {
		t.Errorf("output = %+v", output)
	}
	events := netEvents(t, result)
	if len(events) != 2 || events[0].StatusCode != 302 || events[0].Path != "/redirect" || events[1].Path != "/echo" || events[1].StatusCode != 200 {
		t.Errorf("events = %+v", events)
	}
}

func TestRedirectLimits(t *testing.T) {
	up := newUpstream(t)
	t.Run("limit reached", func(t *testing.T) {
		session := connect(t, Config{MaxRedirects: 2, AllowPrivateNetworks: true}, nil)
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/loop"})
		if text := errorText(t, result); !strings.Contains(text, "too many redirects: stopped after 2 (limit 2)") {
			t.Errorf("error = %q", text)
		}
		events := netEvents(t, result)
		if len(events) != 4 || events[3].Decision != DecisionError || events[2].Decision != DecisionAllowed {
			t.Errorf("events = %+v", events)
		}
	})
	t.Run("redirects off", func(t *testing.T) {
		session := connect(t, Config{MaxRedirects: -1, AllowPrivateNetworks: true}, nil)
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/loop"})
		output := decodeJSONOutput(t, successText(t, result))
		if output.Status != http.StatusFound || output.Headers["Location"] != "/loop" {
			t.Errorf("output = %+v", output)
		}
		if events := netEvents(t, result); len(events) != 1 || events[0].StatusCode != 302 {
			t.Errorf("events = %+v", events)
		}
	})
	t.Run("redirect to another scheme", func(t *testing.T) {
		session := connect(t, Config{AllowPrivateNetworks: true}, nil)
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/redirect?to=ftp://files.test/x"})
		if text := errorText(t, result); !strings.Contains(text, `unsupported url scheme "ftp"`) {
			t.Errorf("error = %q", text)
		}
		if events := netEvents(t, result); len(events) != 2 || events[1].Decision != DecisionError || events[1].Domain != "files.test" {
			t.Errorf("events = %+v", events)
		}
	})
}

func TestBodyCap(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{MaxBodyBytes: 100, AllowPrivateNetworks: true}, nil)

	result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + "/big", "max_length": 1000})
	output := decodeJSONOutput(t, successText(t, result))
	if !output.BodyLimitReached || !output.Truncated || output.TotalLength != 100 || len(output.Body) != 100 || output.NextStartIndex != nil {
		t.Errorf("output = %+v", output)
	}
	if event := singleEvent(t, result); event.BytesReceived != 100 {
		t.Errorf("event = %+v, want 100 bytes received", event)
	}

	fetched := successText(t, callTool(t, session, ToolFetchHTTP, map[string]any{"url": up.URL + "/big"}))
	if !strings.Contains(fetched, "longer than the 100-byte limit") || !strings.Contains(fetched, "Content length: 100 bytes") {
		t.Errorf("fetch output does not report the cap:\n%s", fetched)
	}
}

func TestTimeout(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{Timeout: 200 * time.Millisecond, AllowPrivateNetworks: true}, nil)
	tests := []struct {
		path       string
		wantStatus int
	}{
		{"/slow", 0},         // no response headers in time
		{"/stall-body", 200}, // headers arrive, the body stalls
	}
	for _, test := range tests {
		t.Run(test.path, func(t *testing.T) {
			started := time.Now()
			result := callTool(t, session, ToolHTTPGet, map[string]any{"url": up.URL + test.path})
			if elapsed := time.Since(started); elapsed > 3*time.Second {
				t.Errorf("call took %s despite a 200ms timeout", elapsed)
			}
			if text := errorText(t, result); !strings.Contains(text, "timed out after 200ms") {
				t.Errorf("error = %q", text)
			}
			event := singleEvent(t, result)
			if event.Decision != DecisionError || event.StatusCode != test.wantStatus || !strings.Contains(event.Error, "timed out") {
				t.Errorf("event = %+v", event)
			}
		})
	}
}

func TestConnectionFailuresAreRecorded(t *testing.T) {
	// A port with nothing listening: bind one, then close it.
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddress := listener.Addr().String()
	listener.Close()
	_, closedPort, _ := net.SplitHostPort(closedAddress)

	up := newUpstream(t)
	tests := []struct {
		name     string
		hooks    *netHooks
		url      string
		wantText string
		wantPort int
	}{
		{name: "connection refused", url: "http://" + closedAddress + "/x?y=1", wantText: "connection refused", wantPort: mustAtoi(t, closedPort)},
		{name: "unknown host", hooks: loopbackDial(up), url: "https://nowhere.invalid/x?y=1", wantText: `cannot resolve host "nowhere.invalid"`, wantPort: 443},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			session := connect(t, Config{AllowPrivateNetworks: true}, test.hooks)
			for _, tool := range []string{ToolFetchHTTP, ToolGrepHTTP, ToolHTTPHeaders, ToolHTTPDelete} {
				arguments := map[string]any{"url": test.url}
				if tool == ToolGrepHTTP {
					arguments["pattern"] = "x"
				}
				result := callTool(t, session, tool, arguments)
				if text := errorText(t, result); !strings.Contains(text, test.wantText) {
					t.Errorf("%s: error = %q, want containing %q", tool, text, test.wantText)
				}
				event := singleEvent(t, result)
				if event.Decision != DecisionError || event.Port != test.wantPort || event.Path != "/x" || event.Query != "y=1" ||
					!strings.Contains(event.Error, test.wantText) || event.Timestamp.IsZero() {
					t.Errorf("%s: event = %+v", tool, event)
				}
			}
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDefaultPortsInEvents(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{}, loopbackDial(up))
	result := callTool(t, session, ToolHTTPGet, map[string]any{"url": "http://plain.test/echo"})
	successText(t, result)
	if event := singleEvent(t, result); event.Port != 80 || event.Domain != "plain.test" {
		t.Errorf("event = %+v, want port 80", event)
	}
}

func TestInvalidURLs(t *testing.T) {
	session := connect(t, Config{}, nil)
	tests := []struct {
		url  string
		want string
	}{
		{"", "url is required"},
		{"example.com/path", `has no scheme: use http:// or https://`},
		{"ftp://example.com/file", `unsupported url scheme "ftp"`},
		{"file:///etc/passwd", `unsupported url scheme "file"`},
		{"http://", "has no host"},
		{"http://exa_mple..com/", "empty label"},
		{"http://bücher.example/", "not ASCII"},
		{"http://example.com:99999/", `invalid port "99999"`},
		{"http://[::1/", "invalid url"},
	}
	for _, test := range tests {
		t.Run(test.url, func(t *testing.T) {
			result := callTool(t, session, ToolHTTPGet, map[string]any{"url": test.url})
			if text := errorText(t, result); !strings.Contains(text, test.want) {
				t.Errorf("error = %q, want containing %q", text, test.want)
			}
			if event := singleEvent(t, result); event.Decision != DecisionError {
				t.Errorf("event = %+v", event)
			}
		})
	}
}

func TestInvalidArgumentsAreToolErrors(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{AllowPrivateNetworks: true}, nil)
	tests := []struct {
		tool      string
		arguments map[string]any
	}{
		{ToolFetchHTTP, map[string]any{"url": up.URL, "format": "pdf"}},
		{ToolFetchHTTP, map[string]any{"url": up.URL, "max_length": 0}},
		{ToolFetchHTTP, map[string]any{"url": up.URL, "max_length": maxMaxLength + 1}},
		{ToolFetchHTTP, map[string]any{"url": up.URL, "start_index": -1}},
		{ToolGrepHTTP, map[string]any{"url": up.URL, "pattern": "x", "context_lines": -1}},
		{ToolGrepHTTP, map[string]any{"url": up.URL, "pattern": "x", "max_matches": 0}},
		{ToolHTTPGet, map[string]any{}},
	}
	for _, test := range tests {
		result := callTool(t, session, test.tool, test.arguments)
		errorText(t, result)
	}
	if up.sawHost("127.0.0.1") {
		t.Error("a request was sent for invalid arguments")
	}
}

func TestNetEventsFromMetaWithoutEvents(t *testing.T) {
	events, err := NetEventsFromMeta(map[string]any{"other": 1})
	if err != nil || events != nil {
		t.Errorf("NetEventsFromMeta without the key = %v, %v", events, err)
	}
	if _, err := NetEventsFromMeta(map[string]any{MetaKeyNetEvents: "not a list"}); err == nil {
		t.Error("want an error for a malformed value")
	}
}
