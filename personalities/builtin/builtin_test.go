package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/builtintools"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/version"
)

// childProcessEnv makes the test binary act as the mcp-builtin process, so
// Cmd.Run is tested on real stdin, stdout and stderr.
const childProcessEnv = "CAPSEM_BUILTIN_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childProcessEnv) == "1" {
		if err := (&Cmd{}).Run(context.Background()); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestCmdRunOnStdioExitsCleanlyWhenStdinCloses(t *testing.T) {
	executable, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(executable, "-test.run=^$")
	// An empty environment plus an allowlist, as the aggregator starts it.
	child.Env = []string{childProcessEnv + "=1", envvars.DomainBlock.Name() + "=*.blocked.test"}
	stderr := &syncBuffer{}
	child.Stderr = stderr

	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "personality-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, &mcp.CommandTransport{Command: child, TerminateDuration: 20 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connect: %v (stderr: %s)", err, stderr.String())
	}
	blocked, err := session.CallTool(ctx, &mcp.CallToolParams{Name: builtintools.ToolFetchHTTP, Arguments: map[string]any{"url": "http://a.blocked.test/"}})
	if err != nil || !blocked.IsError {
		t.Fatalf("blocked call = %+v, err %v", blocked, err)
	}
	started := time.Now()
	if err := session.Close(); err != nil { // closes stdin, then waits for the exit status
		t.Fatalf("child did not exit cleanly: %v (stderr: %s)", err, stderr.String())
	}
	if elapsed := time.Since(started); elapsed > 10*time.Second {
		t.Errorf("child took %s to exit after stdin closed", elapsed)
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var record map[string]any
		if err := json.Unmarshal([]byte(line), &record); err != nil {
			t.Errorf("stderr line is not a JSON log record: %q", line)
		}
	}
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu     sync.Mutex
	buffer bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.String()
}

// pipeTransports connects a server and a client through two pipes, the way
// stdin/stdout connect the aggregator to this process.
func pipeTransports() (server, client *mcp.IOTransport) {
	clientToServerReader, clientToServerWriter := io.Pipe()
	serverToClientReader, serverToClientWriter := io.Pipe()
	server = &mcp.IOTransport{Reader: clientToServerReader, Writer: serverToClientWriter}
	client = &mcp.IOTransport{Reader: serverToClientReader, Writer: clientToServerWriter}
	return server, client
}

func TestServeUntilInputCloses(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("hello from upstream"))
	}))
	defer upstream.Close()

	env := map[string]string{
		envvars.DomainBlock.Name():      "*.blocked.test",
		envvars.HTTPTimeout.Name():      "5",
		envvars.HTTPAllowPrivate.Name(): "1", // the upstream is on loopback
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, nil))
	serverTransport, clientTransport := pipeTransports()

	served := make(chan error, 1)
	go func() {
		served <- serve(context.Background(), func(key string) string { return env[key] }, serverTransport, logger)
	}()

	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "personality-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, clientTransport, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if info := session.InitializeResult().ServerInfo; info.Name != builtintools.ServerName || info.Version != version.Version {
		t.Errorf("server info = %+v, want name %q and version %q", info, builtintools.ServerName, version.Version)
	}
	tools, err := session.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 9 {
		t.Fatalf("ListTools = %v tools, err %v", tools, err)
	}
	fetched, err := session.CallTool(ctx, &mcp.CallToolParams{Name: builtintools.ToolFetchHTTP, Arguments: map[string]any{"url": upstream.URL}})
	if err != nil || fetched.IsError || !strings.Contains(fetched.Content[0].(*mcp.TextContent).Text, "hello from upstream") {
		t.Fatalf("fetch_http = %+v, err %v", fetched, err)
	}
	blocked, err := session.CallTool(ctx, &mcp.CallToolParams{Name: builtintools.ToolHTTPGet, Arguments: map[string]any{"url": "https://x.blocked.test/"}})
	if err != nil || !blocked.IsError {
		t.Fatalf("blocked call = %+v, err %v", blocked, err)
	}
	if events, err := builtintools.NetEventsFromMeta(blocked.Meta); err != nil || len(events) != 1 || events[0].Decision != builtintools.DecisionDenied {
		t.Errorf("blocked events = %+v, err %v", events, err)
	}

	// Closing the client closes the server's input: a clean exit.
	session.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve returned %v after input closed, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after its input closed")
	}

	// Every log line is one JSON object.
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	for _, line := range lines {
		var record map[string]any
		if err := json.Unmarshal([]byte(line), &record); err != nil {
			t.Errorf("log line is not JSON: %q", line)
		}
	}
	if !strings.Contains(logs.String(), `"*.blocked.test"`) || !strings.Contains(logs.String(), `"allow_private_networks":true`) ||
		!strings.Contains(logs.String(), `"version":"`+version.Version+`"`) || !strings.Contains(logs.String(), "input closed") {
		t.Errorf("logs lack the configuration or the shutdown reason:\n%s", logs.String())
	}
}

func TestServeBlocksPrivateNetworksByDefault(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the loopback server was reached: %s %s", r.Method, r.URL)
	}))
	defer upstream.Close()

	serverTransport, clientTransport := pipeTransports()
	served := make(chan error, 1)
	go func() {
		served <- serve(context.Background(), func(string) string { return "" }, serverTransport, slog.New(slog.DiscardHandler))
	}()
	ctx := context.Background()
	client := mcp.NewClient(&mcp.Implementation{Name: "personality-test", Version: "1"}, nil)
	session, err := client.Connect(ctx, clientTransport, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer func() {
		session.Close()
		<-served
	}()
	result, err := session.CallTool(ctx, &mcp.CallToolParams{Name: builtintools.ToolFetchHTTP, Arguments: map[string]any{"url": upstream.URL}})
	if err != nil || !result.IsError {
		t.Fatalf("fetch of a loopback URL = %+v, err %v; want a tool error", result, err)
	}
	want := "HTTP request blocked: 127.0.0.1 (private or loopback address; set allow_private_networks to permit)"
	if text := result.Content[0].(*mcp.TextContent).Text; text != want {
		t.Errorf("error = %q, want %q", text, want)
	}
	events, err := builtintools.NetEventsFromMeta(result.Meta)
	if err != nil || len(events) != 1 || events[0].Decision != builtintools.DecisionDenied || events[0].MatchedRule != builtintools.MatchedRulePrivateNetwork {
		t.Errorf("events = %+v, err %v", events, err)
	}
}

func TestServeStopsOnContextCancel(t *testing.T) {
	serverTransport, _ := pipeTransports()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, func(string) string { return "" }, serverTransport, slog.New(slog.DiscardHandler))
	}()
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after cancel")
	}
}

func TestServeRejectsBadEnvironment(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{envvars.DomainAllow.Name(): "https://not-a-host.example/"}, "not a URL"},
		{map[string]string{envvars.HTTPMaxBodyBytes.Name(): "lots"}, envvars.HTTPMaxBodyBytes.Name()},
		{map[string]string{envvars.HTTPTimeout.Name(): "0"}, envvars.HTTPTimeout.Name()},
		{map[string]string{envvars.HTTPAllowPrivate.Name(): "yes"}, envvars.HTTPAllowPrivate.Name() + `="yes": must be 1, true, 0 or false`},
	}
	for _, test := range tests {
		logs := &syncBuffer{}
		serverTransport, _ := pipeTransports()
		err := serve(context.Background(), func(key string) string { return test.env[key] }, serverTransport, slog.New(slog.NewJSONHandler(logs, nil)))
		if err == nil || !strings.Contains(err.Error(), test.want) {
			t.Errorf("env %v: error %v, want containing %q", test.env, err, test.want)
		}
		if !strings.Contains(logs.String(), `"level":"ERROR"`) {
			t.Errorf("env %v: the error was not logged: %s", test.env, logs.String())
		}
	}
}
