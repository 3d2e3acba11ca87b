package mcphost_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/testkit"
)

// httpMCP is one `capsem mcp --http` process, with a service of its own.
type httpMCP struct {
	t      *testing.T
	url    string // as it printed it
	cmd    *exec.Cmd
	stderr *lockedBuffer
	exited chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's, set before exited closes
}

// lockedBuffer is a process's stderr, read while the process writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startHTTPMCP starts capsem mcp with args (--http ... and the rest) and
// waits for the URL it prints. When the test ends it is stopped with
// SIGTERM and must exit 0 within the shutdown's bounds.
func startHTTPMCP(t *testing.T, env []string, args ...string) *httpMCP {
	t.Helper()
	cmd := exec.Command(testkit.CapsemBinary(t), append([]string{"mcp"}, args...)...)
	cmd.Env = env
	m := &httpMCP{t: t, cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = m.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.err = cmd.Wait(); close(m.exited) }()
	t.Cleanup(func() { m.stop(syscall.SIGTERM) })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case m.url = <-line:
	case <-time.After(time.Minute):
		t.Fatalf("capsem mcp %v printed no URL in a minute; stderr:\n%s", args, m.stderr)
	}
	if u, err := url.Parse(m.url); err != nil || u.Scheme != "http" || u.Path != hostmcp.HTTPPath {
		t.Fatalf("capsem mcp %v printed %q, not its URL; stderr:\n%s", args, m.url, m.stderr)
	}
	return m
}

// stop signals the process and requires a clean exit (0) within 15 s.
func (m *httpMCP) stop(sig syscall.Signal) {
	m.t.Helper()
	select {
	case <-m.exited:
		return
	default:
	}
	m.cmd.Process.Signal(sig)
	select {
	case <-m.exited:
		if m.err != nil {
			m.t.Errorf("capsem mcp --http after %v: %v; stderr:\n%s", sig, m.err, m.stderr)
		}
	case <-time.After(15 * time.Second):
		m.cmd.Process.Kill()
		<-m.exited
		m.t.Errorf("capsem mcp --http still running 15 s after %v; stderr:\n%s", sig, m.stderr)
	}
}

// hostPort is the address the server listens on, as its URL gives it.
func (m *httpMCP) hostPort() string {
	u, _ := url.Parse(m.url)
	return u.Host
}

// connectHTTP connects the Go SDK's client over streamable HTTP, with
// headers added to every request.
func connectHTTP(t *testing.T, endpoint string, headers map[string]string) (*mcp.ClientSession, error) {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: addHeaders{headers, tr}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "http-e2e", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client, MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

type addHeaders struct {
	headers map[string]string
	base    http.RoundTripper
}

func (a addHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range a.headers {
		r.Header.Set(k, v)
	}
	return a.base.RoundTrip(r)
}

// rawPost sends one JSON-RPC initialize by hand, with the given Host and
// extra headers, and returns the status, the WWW-Authenticate header and
// the body.
func rawPost(t *testing.T, endpoint, host string, headers map[string]string, body io.Reader) (int, string, string) {
	t.Helper()
	if body == nil {
		body = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	}
	req, err := http.NewRequest(http.MethodPost, endpoint, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if host != "" {
		req.Host = host
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("POST %s (Host %q): %v", endpoint, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// goldenTools is the tools/list the host MCP server answers, as
// core/hostmcp's golden test pins it.
func goldenTools(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testkit.ModuleRoot(t), "testdata", "hostmcp", "tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// TestHTTPServesTheTools: over streamable HTTP the Go SDK's client gets
// the very catalog stdio serves (the golden, schemas and all), and calls
// that need no VM work; SIGINT ends the server cleanly.
func TestHTTPServesTheTools(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	m := startHTTPMCP(t, env, "--http", "127.0.0.1:0")
	s, err := connectHTTP(t, m.url, nil)
	if err != nil {
		t.Fatalf("connecting: %v; stderr:\n%s", err, m.stderr)
	}
	if init := s.InitializeResult(); init.ServerInfo.Name != "capsem" || !strings.Contains(init.Instructions, "capsem_create") {
		t.Errorf("initialize: %+v", init)
	}
	res, err := s.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.MarshalIndent(res.Tools, "", "  ")
	if !bytes.Equal(got, goldenTools(t)) {
		t.Errorf("tools/list over HTTP differs from testdata/hostmcp/tools.json:\n%.2000s", got)
	}
	c := &capsemMCP{t: t, s: s}
	var v hostmcp.VersionOut
	c.must("capsem_version", map[string]any{}, &v)
	if !v.ServiceReachable || !v.Match {
		t.Errorf("the service was not started, or is another build: %+v", v)
	}
	var list hostmcp.ListOut
	c.must("capsem_list", map[string]any{}, &list)
	if len(list.VMs) != 0 {
		t.Errorf("capsem_list: %+v", list)
	}
	c.refused("capsem_info", map[string]any{"id": "no-such-vm"}, `no VM named "no-such-vm"`)
	s.Close()
	m.stop(syscall.SIGINT)
}

// TestHTTPRefusesDNSRebinding: a request whose Host is not this server (a
// name of the attacker's that resolves to loopback, or another port) or
// whose Origin is not a loopback origin (a web page's) is refused with 403
// saying why; loopback names and origins pass.
func TestHTTPRefusesDNSRebinding(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	m := startHTTPMCP(t, env, "--http", "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(m.hostPort())
	for _, tc := range []struct {
		name    string
		host    string
		headers map[string]string
		status  int
		says    string
	}{
		{name: "attacker's name", host: "rebind.attacker.example:" + port, status: 403, says: "refused against DNS rebinding"},
		{name: "attacker's name, no port", host: "rebind.attacker.example", status: 403, says: "DNS rebinding"},
		{name: "another port", host: "localhost:1", status: 403, says: "localhost:" + port},
		{name: "evil origin", headers: map[string]string{"Origin": "http://attacker.example"}, status: 403, says: `Origin "http://attacker.example" is not a loopback origin`},
		{name: "null origin", headers: map[string]string{"Origin": "null"}, status: 403, says: "not a loopback origin"},
		{name: "evil origin on localhost's name", host: "localhost:" + port, headers: map[string]string{"Origin": "https://localhost.attacker.example"}, status: 403, says: "not a loopback origin"},
		{name: "localhost", host: "localhost:" + port, status: 200},
		{name: "ipv6 loopback name", host: "[::1]:" + port, status: 200},
		{name: "loopback origin", headers: map[string]string{"Origin": "http://localhost:6274"}, status: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := rawPost(t, m.url, tc.host, tc.headers, nil)
			if status != tc.status || !strings.Contains(body, tc.says) {
				t.Errorf("%d %q; want %d saying %q", status, body, tc.status, tc.says)
			}
			if status == 200 && !strings.Contains(body, `"serverInfo"`) {
				t.Errorf("not an initialize result: %q", body)
			}
		})
	}
	if !strings.Contains(m.stderr.String(), "capsem mcp refused an HTTP request") {
		t.Errorf("no refusal logged:\n%s", m.stderr)
	}
}

// writeToken writes a private token file.
func writeToken(t *testing.T, token string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHTTPToken: with --token-file every request needs the token: none
// or a wrong one is refused 401 with a bearer challenge, the right one
// gets the tools.
func TestHTTPToken(t *testing.T) {
	const token = "e2e-token-0123456789abcdef"
	env, _ := testkit.ServiceEnv(t)
	m := startHTTPMCP(t, env, "--http", "127.0.0.1:0", "--token-file", writeToken(t, token, 0o600))
	for _, tc := range []struct {
		name      string
		auth      string
		status    int
		challenge string
		says      string
	}{
		{name: "none", status: 401, challenge: `Bearer realm="capsem mcp"`, says: "needs a bearer token"},
		{name: "wrong", auth: "Bearer " + token + "-not", status: 401, challenge: `error="invalid_token"`, says: "wrong bearer token"},
		{name: "empty", auth: "Bearer ", status: 401, challenge: `error="invalid_token"`, says: "not a bearer token"},
		{name: "basic", auth: "Basic " + token, status: 401, challenge: `Bearer realm="capsem mcp"`, says: "not a bearer token"},
		{name: "right", auth: "Bearer " + token, status: 200, says: `"serverInfo"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := map[string]string{}
			if tc.auth != "" {
				headers["Authorization"] = tc.auth
			}
			status, challenge, body := rawPost(t, m.url, "", headers, nil)
			if status != tc.status || !strings.Contains(challenge, tc.challenge) || !strings.Contains(body, tc.says) {
				t.Errorf("%d %q %q; want %d, a challenge with %q, saying %q", status, challenge, body, tc.status, tc.challenge, tc.says)
			}
		})
	}
	if _, err := connectHTTP(t, m.url, nil); err == nil {
		t.Error("the SDK's client connected without the token")
	}
	s, err := connectHTTP(t, m.url, map[string]string{"Authorization": "Bearer " + token})
	if err != nil {
		t.Fatalf("with the token: %v; stderr:\n%s", err, m.stderr)
	}
	res, err := s.ListTools(context.Background(), nil)
	if err != nil || len(res.Tools) == 0 {
		t.Fatalf("tools/list with the token: %d tools, %v", len(res.Tools), err)
	}
	if strings.Contains(m.stderr.String(), token) {
		t.Errorf("the token is in the log:\n%s", m.stderr)
	}
}

// TestHTTPRefusesToStart: capsem mcp refuses at start, saying why and
// printing no URL, a non-loopback address without a token, a token
// file others may read, and the HTTP flags without --http. With the token,
// every interface is served.
func TestHTTPRefusesToStart(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	shared := writeToken(t, "e2e-token-0123456789abcdef", 0o644)
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--http", "0.0.0.0:0"}, "0.0.0.0 is not a loopback address, and without --token-file anyone who can reach it could run commands in your sandboxes"},
		{[]string{"--http", "[::]:0"}, "is not a loopback address"},
		{[]string{"--http", "0.0.0.0:0", "--token-file", shared}, "mode 0644 lets others than its owner at the token: chmod 600 it"},
		{[]string{"--http", "127.0.0.1:0", "--token-file", shared + ".missing"}, "no such file"},
		{[]string{"--http", "127.0.0.1"}, "missing port"},
		{[]string{"--token-file", shared}, "--token-file and --allow-host go with --http"},
	} {
		cmd := exec.Command(testkit.CapsemBinary(t), append([]string{"mcp"}, tc.args...)...)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		code := 0
		if err := cmd.Run(); err != nil {
			code = -1
			if exit, ok := err.(*exec.ExitError); ok {
				code = exit.ExitCode()
			}
		}
		if code != 1 || stdout.Len() != 0 || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("capsem mcp %v: exit %d, stdout %q, stderr %q; want 1 saying %q", tc.args, code, &stdout, &stderr, tc.says)
		}
	}

	const token = "e2e-token-0123456789abcdef"
	m := startHTTPMCP(t, env, "--http", "0.0.0.0:0", "--token-file", writeToken(t, token, 0o600))
	_, port, _ := net.SplitHostPort(m.hostPort())
	endpoint := "http://127.0.0.1:" + port + hostmcp.HTTPPath
	if status, _, body := rawPost(t, endpoint, "", nil, nil); status != 401 {
		t.Errorf("every interface, no token: %d %q", status, body)
	}
	if status, _, body := rawPost(t, endpoint, "", map[string]string{"Authorization": "Bearer " + token}, nil); status != 200 {
		t.Errorf("every interface, the token: %d %q", status, body)
	}
}

// TestHTTPBodyLimit: a body past the bound (hostmcp.MaxMessageBytes, which
// a 64 MiB capsem_write_file fits) is refused with 413 naming the bound;
// the server goes on serving.
func TestHTTPBodyLimit(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	m := startHTTPMCP(t, env, "--http", "127.0.0.1:0")
	s, err := connectHTTP(t, m.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	over := io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0","id":5,"method":"ping","params":{"pad":"`),
		io.LimitReader(repeatByte('x'), hostmcp.MaxMessageBytes))
	status, _, body := rawPost(t, m.url, "", map[string]string{"Mcp-Session-Id": s.ID(), "Mcp-Protocol-Version": s.InitializeResult().ProtocolVersion}, over)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(body, "exceeds") {
		t.Errorf("the oversized body: %d %q, want 413", status, body)
	}
	c := &capsemMCP{t: t, s: s}
	var v hostmcp.VersionOut
	c.must("capsem_version", map[string]any{}, &v)
	if _, err := connectHTTP(t, m.url, nil); err != nil {
		t.Errorf("a new session after the refused body: %v", err)
	}
}

// repeatByte reads as an endless run of one byte.
type repeatByte byte

func (b repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// TestTypeScriptSDKClientHTTP: the official TypeScript SDK's streamable
// HTTP client (testdata/tsclient/http.mjs) takes capsem mcp --http's
// catalog, every tool with its input and output schema, and calls it.
func TestTypeScriptSDKClientHTTP(t *testing.T) {
	dir := filepath.Join(testkit.ModuleRoot(t), "testdata", "tsclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript SDK is not installed (make deps runs npm ci in %s): %v", dir, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is required (make deps installs nodejs): %v", err)
	}
	const token = "e2e-token-0123456789abcdef"
	env, _ := testkit.ServiceEnv(t)
	m := startHTTPMCP(t, env, "--http", "127.0.0.1:0", "--token-file", writeToken(t, token, 0o600))
	node := exec.Command("node", filepath.Join(dir, "http.mjs"), m.url, token)
	node.Dir, node.Env, node.Stderr = dir, env, os.Stderr
	out, err := node.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v\n%s\ncapsem mcp:\n%s", err, out, m.stderr)
	}
	var report struct {
		ServerVersion struct{ Name string } `json:"serverVersion"`
		SessionID     string                `json:"sessionId"`
		Instructions  string                `json:"instructions"`
		Tools         []struct {
			Name       string `json:"name"`
			InputType  string `json:"inputType"`
			OutputType string `json:"outputType"`
			Annotated  bool   `json:"annotated"`
		} `json:"tools"`
		Version hostmcp.VersionOut `json:"version"`
		List    hostmcp.ListOut    `json:"list"`
		Unknown struct {
			IsError bool   `json:"isError"`
			Text    string `json:"text"`
		} `json:"unknown"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("report %q: %v", out, err)
	}
	var golden []struct{ Name string }
	json.Unmarshal(goldenTools(t), &golden)
	if report.ServerVersion.Name != "capsem" || report.SessionID == "" || !strings.Contains(report.Instructions, "capsem_create") || len(report.Tools) != len(golden) {
		t.Errorf("discovery: %d tools (want %d), %+v", len(report.Tools), len(golden), report)
	}
	for i, tool := range report.Tools {
		if i < len(golden) && tool.Name != golden[i].Name || tool.InputType != "object" || tool.OutputType != "object" || !tool.Annotated {
			t.Errorf("tool %d: %+v", i, tool)
		}
	}
	if !report.Version.Match || len(report.List.VMs) != 0 {
		t.Errorf("calls: %+v %+v", report.Version, report.List)
	}
	if !report.Unknown.IsError || !strings.Contains(report.Unknown.Text, `no VM named "no-such-vm"`) {
		t.Errorf("unknown VM: %+v", report.Unknown)
	}
}
