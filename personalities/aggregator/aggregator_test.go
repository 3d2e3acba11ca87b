package aggregator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/testkit"
)

// client drives an in-process Aggregator over pipes with real aggwire frames.
type client struct {
	t      testing.TB
	w      *aggwire.Writer
	resps  chan *aggwire.Response
	nextID uint64
	done   chan error
}

func startAggregator(t testing.TB, servers []aggwire.ServerDef) *client {
	t.Helper()
	reqR, reqW := io.Pipe()
	respR, respW := io.Pipe()
	a := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	c := &client{t: t, w: aggwire.NewWriter(reqW), resps: make(chan *aggwire.Response, 64), done: make(chan error, 1)}
	go func() { c.done <- a.Serve(context.Background(), reqR, respW); respW.Close() }()
	go func() {
		r := aggwire.NewReader(respR)
		for {
			var resp aggwire.Response
			if err := r.Read(&resp); err != nil {
				close(c.resps)
				return
			}
			c.resps <- &resp
		}
	}()
	t.Cleanup(func() {
		reqW.Close()
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			t.Error("aggregator did not stop on EOF")
		}
	})
	if r := c.do(&aggwire.Request{Method: aggwire.MethodInit, Version: aggwire.ProtocolVersion, Servers: servers}); r.Error != "" || r.Version != aggwire.ProtocolVersion {
		t.Fatalf("init: %+v", r)
	}
	return c
}

func (c *client) send(req *aggwire.Request) uint64 {
	c.nextID++
	req.ID = c.nextID
	if err := c.w.Write(req); err != nil {
		c.t.Fatal(err)
	}
	return req.ID
}

func (c *client) wait(id uint64, timeout time.Duration) *aggwire.Response {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case r, ok := <-c.resps:
			if !ok {
				c.t.Fatal("aggregator closed its output")
			}
			if r.ID == id {
				return r
			}
		case <-deadline:
			c.t.Fatalf("no response to %d within %v", id, timeout)
		}
	}
}

func (c *client) do(req *aggwire.Request) *aggwire.Response {
	c.t.Helper()
	return c.wait(c.send(req), 30*time.Second)
}

func TestNamespacingCallsAndErrors(t *testing.T) {
	echo := testkit.EchoServer(t)
	c := startAggregator(t, []aggwire.ServerDef{
		{Name: "echo", Command: echo, Enabled: true},
		{Name: "off", Command: echo, Enabled: false},
		{Name: "bad__name", Command: echo, Enabled: true},
		{Name: "builtin", Command: echo, Enabled: true}, // reserved unless Builtin
		{Name: "", Command: echo, Enabled: true},
		{Name: "both", Command: echo, URL: "http://x", Enabled: true},
	})
	tools := c.do(&aggwire.Request{Method: aggwire.MethodListTools}).Tools
	names := map[string]aggwire.Tool{}
	for _, tool := range tools {
		names[tool.Name] = tool
	}
	if len(names) != 6 || names["echo__echo"].OriginalName != "echo" || names["echo__echo"].Server != "echo" {
		t.Fatalf("tools: %v", names)
	}
	// Annotation defaults for hints a server leaves out.
	if a := names["echo__echo"].Annotations; a == nil || !a.DestructiveHint || !a.OpenWorldHint {
		t.Fatalf("annotation defaults: %+v", a)
	}
	status := c.do(&aggwire.Request{Method: aggwire.MethodListServers}).Servers
	errs := map[string]string{}
	for _, s := range status {
		errs[s.Name] = s.Error
	}
	for name, want := range map[string]string{"off": "disabled", "bad__name": `contains "__"`, "builtin": "reserved", "": "empty", "both": "both command and url"} {
		if !strings.Contains(errs[name], want) {
			t.Errorf("server %q: error %q, want %q", name, errs[name], want)
		}
	}
	r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__echo", Arguments: []byte(`{"text":"hi"}`)})
	if r.Error != "" || !strings.Contains(string(r.Result), `"text":"hi"`) {
		t.Fatalf("call: %+v", r)
	}
	// Arguments reach the server byte for byte: no float64 round trip.
	raw := `{"n":9007199254740993,"z":{"x":[1,2.50]},"a":"\u00e9"}`
	r = c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__raw", Arguments: []byte(raw)})
	var got struct {
		Content []struct{ Text string } `json:"content"`
	}
	if json.Unmarshal(r.Result, &got) != nil || len(got.Content) != 1 || got.Content[0].Text != raw {
		t.Fatalf("arguments changed on the way to the server: %s", r.Result)
	}
	if r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__raw", Arguments: []byte(`[1]`)}); r.Code != aggwire.CodeInvalidParams {
		t.Errorf("non-object arguments: %+v", r)
	}
	// The first "__" splits: a tool named a__b on server echo is echo__a__b.
	for _, tc := range []struct {
		name, want string
		code       int
	}{
		{"echo__nope", "unknown tool", aggwire.CodeInvalidParams},
		{"nope__echo", "unknown MCP server", aggwire.CodeInvalidParams},
		{"echo", "not namespaced", aggwire.CodeInvalidParams},
		{"off__echo", "not connected", aggwire.CodeUpstream},
	} {
		r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: tc.name, Arguments: []byte(`{}`)})
		if r.Code != tc.code || !strings.Contains(r.Error, tc.want) {
			t.Errorf("%s: %+v", tc.name, r)
		}
	}
	if r := c.do(&aggwire.Request{Method: aggwire.MethodReadResource, URI: "file:///etc/passwd"}); !strings.Contains(r.Error, "not namespaced") {
		t.Errorf("resource: %+v", r)
	}
	if r := c.do(&aggwire.Request{Method: "bogus"}); r.Code != aggwire.CodeInvalidParams {
		t.Errorf("bogus method: %+v", r)
	}
}

func TestOneDeadServerNeverStallsOthers(t *testing.T) {
	echo := testkit.EchoServer(t)
	// "hang" never answers initialize; "gone" exits at once.
	c := startAggregator(t, []aggwire.ServerDef{
		{Name: "hang", Command: "sleep", Args: []string{"1000"}, Enabled: true, ConnectTimeoutMS: 2000},
		{Name: "gone", Command: "false", Enabled: true},
		{Name: "echo", Command: echo, Enabled: true},
	})
	start := time.Now()
	r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__echo", Arguments: []byte(`{"text":"fast"}`)})
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("a call to a healthy server waited %v for a hanging one", d)
	}
	// Listing waits for the bounded connects and then reports the rest.
	tools := c.do(&aggwire.Request{Method: aggwire.MethodListTools}).Tools
	if len(tools) != 6 {
		t.Fatalf("%d tools", len(tools))
	}
	st := c.do(&aggwire.Request{Method: aggwire.MethodListServers}).Servers
	for _, s := range st {
		if s.Name == "echo" && (!s.Connected || s.ToolCount != 6) {
			t.Errorf("echo status %+v", s)
		}
		if s.Name != "echo" && (s.Connected || s.Error == "") {
			t.Errorf("%s status %+v", s.Name, s)
		}
	}
}

func TestConcurrentOutOfOrderAndCancel(t *testing.T) {
	c := startAggregator(t, []aggwire.ServerDef{{Name: "echo", Command: testkit.EchoServer(t), Enabled: true}})
	c.do(&aggwire.Request{Method: aggwire.MethodListTools})
	slow := c.send(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__sleep", Arguments: []byte(`{"ms":20000}`)})
	fast := c.send(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__echo", Arguments: []byte(`{"text":"x"}`)})
	if r := c.wait(fast, 10*time.Second); r.Error != "" {
		t.Fatal(r.Error)
	}
	c.send(&aggwire.Request{Method: aggwire.MethodCancel, Target: slow})
	start := time.Now()
	r := c.wait(slow, 5*time.Second)
	if r.Error == "" || time.Since(start) > 3*time.Second {
		t.Fatalf("cancelled call: %+v after %v", r, time.Since(start))
	}
}

func TestRefreshReplacesServers(t *testing.T) {
	echo := testkit.EchoServer(t)
	c := startAggregator(t, []aggwire.ServerDef{{Name: "one", Command: echo, Enabled: true}})
	if r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "one__echo", Arguments: []byte(`{"text":"1"}`)}); r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := c.do(&aggwire.Request{Method: aggwire.MethodRefresh, Servers: []aggwire.ServerDef{{Name: "two", Command: echo, Enabled: true}}}); r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "two__echo", Arguments: []byte(`{"text":"2"}`)}); r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "one__echo", Arguments: []byte(`{}`)}); !strings.Contains(r.Error, "unknown MCP server") {
		t.Fatalf("old server still routed: %+v", r)
	}
}

func TestVersionMismatchAndOversizedResult(t *testing.T) {
	c := startAggregator(t, []aggwire.ServerDef{{Name: "echo", Command: testkit.EchoServer(t), Enabled: true}})
	if r := c.do(&aggwire.Request{Method: aggwire.MethodInit, Version: 99}); !strings.Contains(r.Error, "protocol version 99") {
		t.Fatalf("version: %+v", r)
	}
	r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__big", Arguments: []byte(`{"bytes":17000000}`)})
	// Either the SDK's line limit or our frame limit refuses it, by name.
	if !strings.Contains(r.Error, "too large") && !strings.Contains(r.Error, "exceeded the configured maximum") {
		t.Fatalf("oversized: %.200s", r.Error)
	}
	// The server's session broke; the next call reconnects and works.
	r = c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__echo", Arguments: []byte(`{"text":"ok"}`)})
	if r.Error != "" {
		t.Fatalf("after oversized: %+v", r)
	}
	var v map[string]any
	if json.Unmarshal(r.Result, &v) != nil {
		t.Fatal("result is not JSON")
	}
}

// TestAggregatorIsDBFree proves the aggregator cannot reach session.db in
// code: nothing it links writes or opens SQLite. (The run-time half, that
// its sandbox cannot open session.db, is in the gateway's end-to-end tests.)
func TestAggregatorIsDBFree(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, forbidden := range []string{"github.com/mattn/go-sqlite3", "github.com/capsem/capsem/core/ledger", "database/sql"} {
		for _, line := range strings.Split(string(out), "\n") {
			if line == forbidden {
				t.Errorf("the aggregator links %s", forbidden)
			}
		}
	}
}

// TestFailedServerConnectsAgain: a server that cannot start yet (its
// package still downloading, say) is connected again after a growing
// pause, without a refresh, and its tools join the listing once it
// answers; while it is being retried, listings do not wait for it and its
// status says which attempt it is on and how the last one failed.
func TestFailedServerConnectsAgain(t *testing.T) {
	first, max := retryFirst, retryMax
	retryFirst, retryMax = 200*time.Millisecond, 400*time.Millisecond
	t.Cleanup(func() { retryFirst, retryMax = first, max })
	echo := testkit.EchoServer(t)
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	c := startAggregator(t, []aggwire.ServerDef{
		{Name: "late", Command: "/bin/sh", Args: []string{"-c", `test -e "$0" && exec "$1"; echo "not yet" >&2; exit 1`, ready, echo}, Enabled: true,
			ReadPaths: []string{dir, filepath.Dir(echo)}},
		{Name: "echo", Command: echo, Enabled: true},
	})
	if n := len(c.do(&aggwire.Request{Method: aggwire.MethodListTools}).Tools); n != 6 {
		t.Fatalf("%d tools before the late server can start, want echo's 6", n)
	}
	// A few attempts fail meanwhile; the status says so.
	time.Sleep(time.Second)
	var late aggwire.ServerStatus
	for _, s := range c.do(&aggwire.Request{Method: aggwire.MethodListServers}).Servers {
		if s.Name == "late" {
			late = s
		}
	}
	if late.Connected || !strings.Contains(late.Error, "attempt") {
		t.Fatalf("late server before it can start: %+v, want an error naming its attempt", late)
	}
	if err := os.WriteFile(ready, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		start := time.Now()
		tools := c.do(&aggwire.Request{Method: aggwire.MethodListTools}).Tools
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("a listing waited %v for a server being retried", d)
		}
		if len(tools) == 12 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the late server never joined: %d tools; servers %+v", len(tools), c.do(&aggwire.Request{Method: aggwire.MethodListServers}).Servers)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "late__echo", Arguments: []byte(`{"text":"joined"}`)})
	if r.Error != "" || !strings.Contains(string(r.Result), "joined") {
		t.Fatalf("call to the late server: %+v", r)
	}
}
