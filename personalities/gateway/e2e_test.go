package gateway_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/testkit"
)

type gatewayProc struct {
	cmd        *exec.Cmd
	socket     string
	sessionDir string
	logPath    string
}

// startGateway runs `capsem gateway` as a real process with the given extra
// TOML and waits for its socket.
func startGateway(t *testing.T, extraConfig string, env ...string) *gatewayProc {
	t.Helper()
	dir := t.TempDir()
	g := &gatewayProc{socket: filepath.Join(dir, "gw.sock"), sessionDir: filepath.Join(dir, "session"), logPath: filepath.Join(dir, "gateway.log")}
	cfgPath := filepath.Join(dir, "capsem.toml")
	if err := os.WriteFile(cfgPath, []byte(extraConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(g.logPath)
	if err != nil {
		t.Fatal(err)
	}
	g.cmd = exec.Command(testkit.CapsemBinary(t), "gateway", "--listen", "unix:"+g.socket, "--session-dir", g.sessionDir, "--config", cfgPath)
	g.cmd.Env = append(os.Environ(), "CAPSEM_HOME="+filepath.Join(dir, "home"), "CAPSEM_CACHE_DIR="+testkit.CacheDir(t),
		testkit.NoCorpConfig(t), "HOME="+filepath.Join(dir, "userhome"))
	g.cmd.Env = append(g.cmd.Env, env...)
	g.cmd.Stderr = logFile
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { g.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			g.cmd.Process.Kill()
			<-done
			t.Errorf("gateway did not stop on SIGTERM")
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(g.logPath)
			a, _ := os.ReadFile(filepath.Join(g.sessionDir, "mcp-aggregator.log"))
			t.Logf("gateway log:\n%s\naggregator log:\n%s", b, a)
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		if c, err := net.Dial("unix", g.socket); err == nil {
			c.Close()
			return g
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(g.logPath)
			t.Fatalf("gateway socket never appeared:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// connect starts a real capsem-mcp-server relay and an official Go SDK client
// on top of it.
func (g *gatewayProc) connect(t *testing.T) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(testkit.RelayBinary(t))
	cmd.Env = append(os.Environ(), "CAPSEM_MCP_ENDPOINT=unix:"+g.socket)
	cmd.Stderr = os.Stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	s, err := client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting through the relay: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func (g *gatewayProc) db(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(g.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func scalar[T any](t *testing.T, db *sql.DB, q string, args ...any) T {
	t.Helper()
	var v T
	if err := db.QueryRow(q, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return v
}

func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// remoteServer is a streamable-HTTP MCP server started by the test.
func remoteServer(t *testing.T) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "remote", Version: "1"}, nil)
	type addArgs struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "Add two integers."},
		func(ctx context.Context, req *mcp.CallToolRequest, a addArgs) (*mcp.CallToolResult, any, error) {
			if got := req.Extra.Header.Get("X-Capsem-Test"); got != "header-ok" {
				return nil, nil, fmt.Errorf("configured header missing, got %q", got)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strconv.Itoa(a.A + a.B)}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// everythingServer is the [[mcp.servers]] table of the real
// server-everything (npx, stdio).
func everythingServer(t *testing.T) string {
	cmd, args := testkit.EverythingServer(t)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = strconv.Quote(a)
	}
	return fmt.Sprintf("[[mcp.servers]]\nname = \"everything\"\ncommand = %q\nargs = [%s]\nconnect_timeout_secs = 120\n", cmd, strings.Join(quoted, ", "))
}

func standardConfig(t *testing.T) string {
	return everythingServer(t) + fmt.Sprintf(`
[[mcp.servers]]
name = "echo"
command = %q

[[mcp.servers]]
name = "remote"
url = %q
headers = { "X-Capsem-Test" = "header-ok" }

[[mcp.servers]]
name = "dead"
command = "/nonexistent/mcp-server"

[mcp.builtin]
allow_private_networks = true   # the test web server is on loopback

[mcp.timeouts]
tools = { "echo__sleep" = 600 }
`, testkit.EchoServer(t), remoteServer(t)+"/mcp")
}

func TestGatewayEndToEnd(t *testing.T) {
	g := startGateway(t, standardConfig(t))
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	if got := s.InitializeResult().ServerInfo.Name; got != "capsem-gateway" {
		t.Fatalf("server name %q", got)
	}
	tools := map[string]*mcp.Tool{}
	for tool, err := range s.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools[tool.Name] = tool
	}
	for _, want := range []string{"everything__echo", "everything__get-sum", "echo__echo", "remote__add", "builtin__fetch_http", "builtin__http_get"} {
		if tools[want] == nil {
			t.Errorf("tool %s missing from tools/list (%d tools)", want, len(tools))
		}
	}
	for name := range tools {
		if strings.HasPrefix(name, "dead__") {
			t.Errorf("a dead server's tool is listed: %s", name)
		}
	}
	if a := tools["builtin__fetch_http"].Annotations; a == nil || !a.ReadOnlyHint || a.OpenWorldHint == nil || !*a.OpenWorldHint {
		t.Errorf("fetch_http annotations: %+v", a)
	}

	// External stdio server (the MCP reference server).
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "everything__echo", Arguments: map[string]any{"message": "hello gateway"}})
	if err != nil || !strings.Contains(text(t, res), "hello gateway") {
		t.Fatalf("everything__echo: %v %+v", err, res)
	}
	res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "everything__get-sum", Arguments: map[string]any{"a": 2, "b": 40}})
	if err != nil || !strings.Contains(text(t, res), "42") {
		t.Fatalf("everything__get-sum: %v %+v", err, res)
	}
	// Its resources and prompts, namespaced.
	var resourceURI string
	for r, err := range s.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(r.URI, "capsem://everything/") {
			t.Errorf("resource not namespaced: %s", r.URI)
		}
		if resourceURI == "" {
			resourceURI = r.URI
		}
	}
	if resourceURI == "" {
		t.Fatal("no resources listed")
	}
	rr, err := s.ReadResource(ctx, &mcp.ReadResourceParams{URI: resourceURI})
	if err != nil || len(rr.Contents) == 0 {
		t.Fatalf("resources/read %s: %v", resourceURI, err)
	}
	prompts := map[string]bool{}
	for p, err := range s.Prompts(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		prompts[p.Name] = true
	}
	if !prompts["everything__simple-prompt"] || !prompts["everything__args-prompt"] {
		t.Fatalf("prompts: %v", prompts)
	}
	pr, err := s.GetPrompt(ctx, &mcp.GetPromptParams{Name: "everything__args-prompt", Arguments: map[string]string{"city": "Zurich"}})
	if err != nil || len(pr.Messages) == 0 {
		t.Fatalf("prompts/get: %v", err)
	}

	// Our own stdio server and a streamable-HTTP server in the same session.
	res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "ping"}})
	if err != nil || text(t, res) != "ping" {
		t.Fatalf("echo__echo: %v %+v", err, res)
	}
	res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "remote__add", Arguments: map[string]any{"a": 20, "b": 22}})
	if err != nil || res.IsError || text(t, res) != "42" {
		t.Fatalf("remote__add: %v %+v %s", err, res, text(t, res))
	}

	// A builtin tool against a local web server.
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, "<html><body><h1>Capsem</h1><p>fetched through the gateway</p></body></html>")
	}))
	defer web.Close()
	res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "builtin__fetch_http", Arguments: map[string]any{"url": web.URL + "/page"}})
	if err != nil || res.IsError || !strings.Contains(text(t, res), "fetched through the gateway") {
		t.Fatalf("builtin__fetch_http: %v %+v", err, res)
	}
	// An unknown tool and a dead server are errors, not hangs.
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "everything__nope", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Fatalf("unknown tool: %v", err)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "dead__x", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "not connected") {
		t.Fatalf("dead server: %v", err)
	}

	// The ledger: one row per tools/call, attributed to this test process
	// (the relay's parent), and the builtin's HTTP request in net_events.
	db := g.db(t)
	procName := filepath.Base(os.Args[0])
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE method='tools/call'`); n != 7 {
		t.Errorf("%d tools/call rows, want 7", n)
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE method='tools/call' AND process_name=?`, procName); n != 7 {
		t.Errorf("process attribution: %d rows with %q", n, procName)
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE tool_name='everything__echo' AND decision='allowed' AND response_preview LIKE '%hello gateway%' AND request_id IS NOT NULL`); n != 1 {
		t.Errorf("echo row missing or incomplete")
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE tool_name='dead__x' AND decision='error' AND error_message LIKE '%not connected%'`); n != 1 {
		t.Errorf("dead server row missing")
	}
	// The Go SDK client speaks the stateless revision: server/discover, no initialize.
	for _, m := range []string{"server/discover", "tools/list", "resources/list", "resources/read", "prompts/list", "prompts/get"} {
		if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE method=?`, m); n < 1 {
			t.Errorf("no row for %s", m)
		}
	}
	host := strings.TrimPrefix(web.URL, "http://")
	domain, port, _ := strings.Cut(host, ":")
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM net_events WHERE domain=? AND port=? AND path='/page' AND status_code=200 AND decision='allowed' AND conn_type='mcp_builtin'`, domain, port); n != 1 {
		t.Errorf("net_events row for the builtin fetch missing")
	}
}

// TestSandboxFromTheChildsView asks a server running under the aggregator
// what it can see: the aggregator's restrictions are inherited by every
// server it starts, and the probe reports them from inside.
func TestSandboxFromTheChildsView(t *testing.T) {
	g := startGateway(t, fmt.Sprintf("[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n", testkit.EchoServer(t)), "CAPSEM_TEST_SECRET=must-not-leak")
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := filepath.Join(g.sessionDir, "session.db")
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__probe", Arguments: map[string]any{"path": db}})
	if err != nil || res.IsError {
		t.Fatalf("probe: %v %+v", err, res)
	}
	var probe struct {
		Status  map[string]string `json:"status"`
		Env     []string          `json:"env"`
		OpenErr string            `json:"open_err"`
		Opened  bool              `json:"opened"`
		PGID    int               `json:"pgid"`
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &probe); err != nil {
		t.Fatal(err)
	}
	if probe.Status["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %q", probe.Status["NoNewPrivs"])
	}
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"} {
		if probe.Status[k] != "0000000000000000" {
			t.Errorf("%s = %q", k, probe.Status[k])
		}
	}
	if probe.Opened || !strings.Contains(probe.OpenErr, "permission denied") {
		t.Errorf("session.db must not open from the sandbox: opened=%v err=%q", probe.Opened, probe.OpenErr)
	}
	allowed := map[string]bool{"PATH": true, "HOME": true, "TMPDIR": true, "LANG": true, "XDG_CACHE_HOME": true, "npm_config_cache": true, "CAPSEM_SANDBOX": true, "TZ": true, "USER": true, "CAPSEM_LOG_LEVEL": true}
	for _, kv := range probe.Env {
		k, _, _ := strings.Cut(kv, "=")
		if !allowed[k] && !strings.HasPrefix(k, "LC_") {
			t.Errorf("environment variable %q is not on the allowlist", k)
		}
		if strings.Contains(kv, "must-not-leak") {
			t.Errorf("the gateway's environment leaked: %s", kv)
		}
	}
	// The session directory is out of reach too, not just the file.
	res, err = s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__probe", Arguments: map[string]any{"path": g.sessionDir}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &probe)
	if probe.Opened {
		t.Errorf("session directory opened from the sandbox")
	}
	// The aggregator itself, as the kernel sees it.
	agg := aggregatorPID(t, g.cmd.Process.Pid)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", agg))
	for _, want := range []string{"NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("aggregator /proc status lacks %q", want)
		}
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", agg))
	for _, kv := range strings.Split(string(environ), "\x00") {
		k, _, _ := strings.Cut(kv, "=")
		if kv != "" && !allowed[k] && !strings.HasPrefix(k, "LC_") {
			t.Errorf("aggregator environment has %q", k)
		}
	}
	// It runs in the aggregator's process group, not the gateway's.
	if probe.PGID == syscall.Getpgrp() || probe.PGID == g.cmd.Process.Pid {
		t.Errorf("sandboxed server shares a process group with its owner (pgid %d)", probe.PGID)
	}
}

// childPIDs lists the children of pid (any thread may have forked them).
func childPIDs(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state, ppid, ...
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

func aggregatorPID(t *testing.T, gatewayPID int) int {
	t.Helper()
	for _, pid := range childPIDs(gatewayPID) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(b), "mcp-aggregator") {
			return pid
		}
	}
	t.Fatalf("no aggregator child of %d", gatewayPID)
	return 0
}

func TestAggregatorDeathFailsCallsAtOnceAndRecovers(t *testing.T) {
	g := startGateway(t, fmt.Sprintf("[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n", testkit.EchoServer(t)))
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "warm"}}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__sleep", Arguments: map[string]any{"ms": 30000}})
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond)
	pid := aggregatorPID(t, g.cmd.Process.Pid)
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "aggregator") {
			t.Fatalf("pending call: %v", err)
		}
		if d := time.Since(killed); d > time.Second {
			t.Fatalf("pending call failed after %v, want < 1s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("pending call still waiting 5s after the aggregator died")
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "again"}})
	if err != nil || text(t, res) != "again" {
		t.Fatalf("call after restart: %v", err)
	}
	if newPID := aggregatorPID(t, g.cmd.Process.Pid); newPID == pid {
		t.Fatal("aggregator was not restarted")
	}
	// The killed aggregator was reaped and its server died with it.
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		t.Fatalf("killed aggregator still present: %s", b)
	}
	if n := scalar[int](t, g.db(t), `SELECT COUNT(*) FROM mcp_calls WHERE tool_name='echo__sleep' AND decision='error'`); n != 1 {
		t.Errorf("the failed call has %d error rows, want 1", n)
	}
}

// TestReloadOnSIGHUP adds a server by rewriting the config and sending SIGHUP.
func TestReloadOnSIGHUP(t *testing.T) {
	g := startGateway(t, "")
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "x"}}); err == nil {
		t.Fatal("echo server should not exist yet")
	}
	cfg := g.cmd.Args[len(g.cmd.Args)-1]
	os.WriteFile(cfg, []byte(fmt.Sprintf("[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n", testkit.EchoServer(t))), 0o600)
	g.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "reloaded"}})
		if err == nil && text(t, res) == "reloaded" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("server not available after SIGHUP: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A broken file keeps the running configuration.
	os.WriteFile(cfg, []byte("[[mcp.servers]]\nname = \"bad__name\"\ncommand = \"x\"\n"), 0o600)
	g.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(500 * time.Millisecond)
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "still"}}); err != nil {
		t.Fatalf("invalid config replaced the running one: %v", err)
	}
	logb, _ := os.ReadFile(g.logPath)
	if !bytes(logb).contains("reload on SIGHUP failed") {
		t.Errorf("invalid reload not reported in the log")
	}
}

type bytes []byte

func (b bytes) contains(s string) bool { return strings.Contains(string(b), s) }

// TestTypeScriptSDKClient drives the relay with the official TypeScript MCP
// SDK client (what Claude Code is built on): initialize, lists, a call to the
// reference server, a resource read, and an error for an unknown tool.
func TestTypeScriptSDKClient(t *testing.T) {
	root := testkit.ModuleRoot(t)
	dir := filepath.Join(root, "testdata", "tsclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript SDK is not installed (make deps runs npm ci in %s): %v", dir, err)
	}
	g := startGateway(t, everythingServer(t))
	node := exec.Command("node", filepath.Join(dir, "client.mjs"), testkit.RelayBinary(t))
	node.Dir = dir
	node.Env = append(os.Environ(), "CAPSEM_MCP_ENDPOINT=unix:"+g.socket)
	node.Stderr = os.Stderr
	out, err := node.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v\n%s", err, out)
	}
	var report struct {
		ServerVersion struct{ Name string } `json:"serverVersion"`
		Instructions  string                `json:"instructions"`
		Tools         []string              `json:"tools"`
		Echo          string                `json:"echo"`
		Prompts       []string              `json:"prompts"`
		ResourceCount int                   `json:"resourceCount"`
		ReadContents  int                   `json:"readContents"`
		UnknownTool   string                `json:"unknownTool"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("report %q: %v", out, err)
	}
	if report.ServerVersion.Name != "capsem-gateway" || !strings.Contains(report.Instructions, "namespaced") {
		t.Errorf("initialize: %+v", report)
	}
	if !slicesContains(report.Tools, "everything__echo") || !slicesContains(report.Tools, "builtin__fetch_http") {
		t.Errorf("tools: %v", report.Tools)
	}
	if report.Echo != "Echo: from typescript" {
		t.Errorf("echo: %q", report.Echo)
	}
	if !slicesContains(report.Prompts, "everything__simple-prompt") || report.ResourceCount == 0 || report.ReadContents == 0 {
		t.Errorf("prompts/resources: %+v", report)
	}
	if !strings.Contains(report.UnknownTool, "unknown tool") {
		t.Errorf("unknown tool: %q", report.UnknownTool)
	}
	// The TypeScript client uses the initialize handshake (the Go SDK uses
	// server/discover): both are in the ledger with the client's process name
	// (node client.mjs: the script names the program).
	db := g.db(t)
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE method='initialize' AND process_name='client'`); n != 1 {
		t.Errorf("initialize rows attributed to the client script: %d", n)
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE method='notifications/initialized'`); n != 1 {
		t.Errorf("initialized notification rows: %d", n)
	}
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
