package mcphost_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/testkit"
)

// capsemMCP is one `capsem mcp` driven by the Go SDK's client over stdio,
// as Claude Code drives it, with a service of its own (in runDir).
type capsemMCP struct {
	t      *testing.T
	s      *mcp.ClientSession
	cmd    *exec.Cmd // the capsem mcp process
	env    []string
	runDir string
}

func startMCP(t *testing.T, env []string, runDir string) *capsemMCP {
	t.Helper()
	testkit.GuestBinary(t) // the service's VMs find it next to capsem
	cmd := exec.Command(testkit.CapsemBinary(t), "mcp")
	cmd.Env = env
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &capsemMCP{t: t, s: s, cmd: cmd, env: env, runDir: runDir}
}

// call calls a tool and decodes its structured result into out (when not
// nil); it returns the error text of a tool error, "" otherwise.
func (c *capsemMCP) call(name string, args map[string]any, out any) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := c.s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		c.t.Fatalf("%s %v: %v", name, args, err)
	}
	if res.IsError {
		if len(res.Content) == 0 {
			c.t.Fatalf("%s: a tool error without a message", name)
		}
		return res.Content[0].(*mcp.TextContent).Text
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s: %v in %s", name, err, b)
		}
	}
	return ""
}

// must calls a tool that must succeed.
func (c *capsemMCP) must(name string, args map[string]any, out any) {
	c.t.Helper()
	if msg := c.call(name, args, out); msg != "" {
		c.t.Fatalf("%s %v: %s", name, args, msg)
	}
}

// shell runs command in vm through capsem_exec; it must exit 0. It
// returns the command's stdout.
func (c *capsemMCP) shell(vm, command string) string {
	c.t.Helper()
	var r hostmcp.ExecOut
	c.must("capsem_exec", map[string]any{"id": vm, "command": command}, &r)
	if r.ExitCode != 0 {
		c.t.Fatalf("%s: %q exited %d:\n%s\n%s", vm, command, r.ExitCode, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// refused calls a tool that must fail with a message containing want.
func (c *capsemMCP) refused(name string, args map[string]any, want string) {
	c.t.Helper()
	msg := c.call(name, args, nil)
	if msg == "" || !strings.Contains(msg, want) {
		c.t.Errorf("%s %v: got %q, want a tool error containing %q", name, args, msg, want)
	}
}

// stopService stops the service of env.
func stopService(t *testing.T, env []string) {
	t.Helper()
	cmd := exec.Command(testkit.CapsemBinary(t), "service", "stop")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("capsem service stop: %v\n%s", err, out)
	}
}

// TestMCPSendsNothingToAnotherUser: another local user listens on the
// service's socket, on a socket file of this user's where only the
// kernel's record of who listens tells. capsem mcp answers every call
// with the refusal, naming the socket and why, and the listener receives
// not one byte: not the command, not the secret in its environment.
func TestMCPSendsNothingToAnotherUser(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	dir, err := os.MkdirTemp("", "cmu-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	sock := filepath.Join(dir, "service.sock")
	l := testkit.MoveInAsNobody(t, sock)
	if err := os.Lchown(sock, os.Geteuid(), os.Getegid()); err != nil {
		t.Fatal(err)
	}
	c := startMCP(t, append(slices.Clip(env), "CAPSEM_UDS_PATH="+sock), runDir)
	want := "refusing to connect to " + sock + ": " + sock + " is not private to you: the process serving it"
	c.refused("capsem_exec", map[string]any{"id": "dev", "command": "env", "env": map[string]any{"API_KEY": "sk-must-not-leave"}}, want)
	c.refused("capsem_create", map[string]any{"name": "dev", "env": map[string]any{"API_KEY": "sk-must-not-leave"}}, want)
	c.refused("capsem_list", map[string]any{}, want)
	if _, bytes := l.Stop(); bytes != 0 {
		t.Errorf("the other user's listener received %d bytes", bytes)
	}
}

func TestMCPDrivesSandboxes(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	c := startMCP(t, env, runDir)

	tools, err := c.s.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 26 {
		t.Fatalf("tools/list: %d tools, %v", len(tools.Tools), err)
	}
	var v hostmcp.VersionOut
	c.must("capsem_version", map[string]any{}, &v)
	if !v.ServiceReachable || !v.Match {
		t.Fatalf("the service was not started, or is another build: %+v", v)
	}

	var dev hostmcp.VMOut
	published := func() int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}()
	c.must("capsem_create", map[string]any{"name": "dev", "ramMb": 512, "cpuCount": 1, "env": map[string]any{"FROM_CREATE": "yes"},
		"ports": []map[string]any{{"host": published, "guest": 3000}}}, &dev)
	if dev.State != "running" || !dev.Persistent || dev.Name != "dev" || dev.RAMMb != 512 {
		t.Fatalf("create: %+v", dev)
	}

	t.Run("exec", func(t *testing.T) {
		var r hostmcp.ExecOut
		c.must("capsem_exec", map[string]any{"id": "dev", "command": `echo "out $FROM_CREATE"; echo err >&2; exit 3`}, &r)
		if r.Stdout != "out yes\n" || r.Stderr != "err\n" || r.ExitCode != 3 || r.TimedOut {
			t.Fatalf("exec: %+v", r)
		}
		c.must("capsem_exec", map[string]any{"id": dev.ID, "command": "pwd; echo $X", "workdir": "/tmp", "env": map[string]any{"X": "1"}}, &r)
		if r.Stdout != "/tmp\n1\n" {
			t.Fatalf("workdir and env: %+v", r)
		}
		start := time.Now()
		c.must("capsem_exec", map[string]any{"id": "dev", "command": "sleep 60 & sleep 60; echo never", "timeout": 1}, &r)
		if !r.TimedOut || strings.Contains(r.Stdout, "never") || time.Since(start) > 20*time.Second {
			t.Fatalf("timeout: %+v after %v", r, time.Since(start))
		}
		// The timeout killed the whole process group: no sleep survives.
		c.must("capsem_exec", map[string]any{"id": "dev", "command": "pgrep -x sleep || echo none"}, &r)
		if r.Stdout != "none\n" {
			t.Fatalf("processes left by the timed-out command: %q", r.Stdout)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := c.s.CallTool(ctx, &mcp.CallToolParams{Name: "capsem_exec", Arguments: map[string]any{"id": "dev", "command": "touch /tmp/started; sleep 600"}})
			done <- err
		}()
		var r hostmcp.ExecOut
		for i := 0; ; i++ {
			c.must("capsem_exec", map[string]any{"id": "dev", "command": "test -e /tmp/started && echo yes || true"}, &r)
			if r.Stdout == "yes\n" {
				break
			}
			if i > 100 {
				t.Fatal("the command never started")
			}
			time.Sleep(100 * time.Millisecond)
		}
		cancel()
		<-done
		for i := 0; ; i++ {
			// [0]: the pattern does not match the shell that runs pgrep.
			c.must("capsem_exec", map[string]any{"id": "dev", "command": "pgrep -f 'sleep 60[0]' || echo gone"}, &r)
			if r.Stdout == "gone\n" {
				break
			}
			if i > 50 {
				t.Fatalf("the cancelled command still runs: %q", r.Stdout)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("info and resolver", func(t *testing.T) {
		var vm hostmcp.VMOut
		c.must("capsem_info", map[string]any{"id": "dev"}, &vm)
		if len(vm.Ports) != 1 || vm.Ports[0].Host != published || vm.Ports[0].Guest != 3000 || vm.Ports[0].Address != "127.0.0.1" {
			t.Errorf("capsem_info ports: %+v, want 127.0.0.1:%d to 3000", vm.Ports, published)
		}
		// The guest's resolver is the host's stack.
		var f hostmcp.ReadFileOut
		c.must("capsem_read_file", map[string]any{"id": "dev", "path": "/etc/resolv.conf"}, &f)
		if !strings.Contains(f.Content, "nameserver 192.168.127.1") {
			t.Errorf("capsem_read_file /etc/resolv.conf: %q", f.Content)
		}
	})

	t.Run("files", func(t *testing.T) {
		text := "héllo, wörld ✓ 日本\n"
		c.must("capsem_write_file", map[string]any{"id": "dev", "path": "/root/workspace/dir/u.txt", "content": text}, nil)
		var f hostmcp.ReadFileOut
		c.must("capsem_read_file", map[string]any{"id": "dev", "path": "/root/workspace/dir/u.txt"}, &f)
		if f.Content != text || f.Encoding != "utf8" {
			t.Fatalf("unicode round trip: %+v", f)
		}
		big := strings.Repeat("0123456789abcdef", 5<<20/16)
		c.must("capsem_write_file", map[string]any{"id": "dev", "path": "/tmp/big", "content": big}, nil)
		c.must("capsem_read_file", map[string]any{"id": "dev", "path": "/tmp/big"}, &f)
		if f.Size != 5<<20 || f.Content != big {
			t.Fatalf("5 MiB round trip: %d bytes", f.Size)
		}
		bin := []byte{0, 1, 2, 0xff, 0xfe, '\n', 0x80}
		c.must("capsem_write_file", map[string]any{"id": "dev", "path": "/tmp/bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}, nil)
		c.refused("capsem_read_file", map[string]any{"id": "dev", "path": "/tmp/bin"}, "read it with encoding base64")
		c.must("capsem_read_file", map[string]any{"id": "dev", "path": "/tmp/bin", "encoding": "base64"}, &f)
		if got, _ := base64.StdEncoding.DecodeString(f.Content); !bytes.Equal(got, bin) {
			t.Fatalf("binary round trip: %x", got)
		}
		c.refused("capsem_read_file", map[string]any{"id": "dev", "path": "/nonexistent/file"}, "no such file")
		c.refused("capsem_read_file", map[string]any{"id": "dev", "path": "/root/workspace/dir"}, "directory")
		var r hostmcp.ExecOut
		c.must("capsem_exec", map[string]any{"id": "dev", "command": "ln -sf /root/workspace/dir/u.txt /tmp/link"}, &r)
		c.must("capsem_read_file", map[string]any{"id": "dev", "path": "/tmp/link"}, &f)
		if f.Content != text {
			t.Fatalf("through a symlink: %+v", f)
		}
	})

	t.Run("inspect", func(t *testing.T) {
		var sc hostmcp.SchemaOut
		c.must("capsem_inspect_schema", map[string]any{"id": "dev"}, &sc)
		if !strings.Contains(strings.Join(sc.Tables, "\n"), "CREATE TABLE exec_events") {
			t.Fatalf("schema: %v", sc.Tables)
		}
		c.must("capsem_inspect_schema", map[string]any{}, &sc)
		if !strings.Contains(strings.Join(sc.Tables, "\n"), "CREATE TABLE mcp_calls") {
			t.Fatalf("schema without a VM: %v", sc.Tables)
		}
		count := func() float64 {
			var q hostmcp.InspectOut
			c.must("capsem_inspect", map[string]any{"id": "dev", "sql": "SELECT count(*) AS n FROM exec_events"}, &q)
			if len(q.Rows) != 1 || q.Columns[0] != "n" {
				t.Fatalf("inspect: %+v", q)
			}
			return q.Rows[0][0].(float64)
		}
		before := count()
		if before < 3 {
			t.Fatalf("%v exec_events rows after the execs above", before)
		}
		for _, sql := range []string{
			"DELETE FROM exec_events",
			"ATTACH DATABASE '/etc/passwd' AS p",
			"SELECT load_extension('/tmp/x.so')",
			"PRAGMA writable_schema = 1",
			"WITH x AS (SELECT 1) DELETE FROM exec_events",
			"CREATE TEMP TABLE t AS SELECT * FROM exec_events",
		} {
			c.refused("capsem_inspect", map[string]any{"id": "dev", "sql": sql}, "refused")
		}
		c.refused("capsem_inspect", map[string]any{"id": "dev", "sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"}, "")
		if after := count(); after != before {
			t.Fatalf("exec_events went from %v to %v rows through refused SQL", before, after)
		}
	})

	t.Run("timeline", func(t *testing.T) {
		// A command run with a trace id calls the gateway through the
		// relay: its exec row and the gateway's rows of its calls share
		// the trace, and the timeline gives them in time order.
		const list = `'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}' ` +
			`'{"jsonrpc":"2.0","method":"notifications/initialized"}' '{"jsonrpc":"2.0","id":2,"method":"tools/list"}'`
		var r hostmcp.ExecOut
		c.must("capsem_exec", map[string]any{"id": "dev", "traceId": "tl-1", "command": "printf '%s\\n' " + list + " | capsem-mcp-server | grep -c jsonrpc"}, &r)
		if r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "2" {
			t.Fatalf("the traced command: %+v", r)
		}
		var tl hostmcp.TimelineOut
		c.must("capsem_timeline", map[string]any{"id": "dev", "traceId": "tl-1"}, &tl)
		var layers []string
		for i, e := range tl.Events {
			layers = append(layers, e.Layer)
			if e.TraceID != "tl-1" || (i > 0 && e.TS < tl.Events[i-1].TS) {
				t.Errorf("event %d out of trace or order: %+v", i, e)
			}
		}
		if len(tl.Events) < 3 || layers[0] != "exec" || !strings.HasPrefix(tl.Events[0].Summary, "api: printf") ||
			!slices.ContainsFunc(tl.Events, func(e hostmcp.TimelineEventOut) bool {
				return e.Layer == "mcp" && strings.Contains(e.Summary, "tools/list")
			}) {
			t.Fatalf("timeline of the trace: %+v", tl.Events)
		}
		// Without a trace: every layer asked for, the latest first left out.
		c.must("capsem_timeline", map[string]any{"id": "dev", "layers": []string{"exec"}, "limit": 2}, &tl)
		if len(tl.Events) != 2 || tl.Omitted == 0 || tl.Events[0].Layer != "exec" {
			t.Fatalf("the last two commands: %+v", tl)
		}
		c.refused("capsem_timeline", map[string]any{"id": "dev", "layers": []string{"disk"}}, `layer "disk"`)
	})

	t.Run("policed MCP tools", func(t *testing.T) {
		// A VM whose policy blocks the builtin http_get of any URL naming
		// "forbidden": the host's calls go through that policy, and into
		// the VM's ledger as the host's.
		cfg := filepath.Join(t.TempDir(), "vm.toml")
		os.WriteFile(cfg, []byte("[[mcp.rules]]\nname = \"no-forbidden\"\naction = \"block\"\ntool = \"builtin__http_get\"\nargument = \"url\"\nmatches = \"forbidden\"\n"), 0o600)
		var vm hostmcp.VMOut
		c.must("capsem_create", map[string]any{"name": "policed", "base": "minimal", "ramMb": 512, "cpuCount": 1, "config": cfg}, &vm)
		defer c.must("capsem_delete", map[string]any{"id": "policed"}, nil)
		// A listing waits for the servers' first connect; the status then
		// shows them connected.
		var tools hostmcp.MCPToolsOut
		c.must("capsem_mcp_tools", map[string]any{"id": "policed", "server": "builtin"}, &tools)
		if !slices.ContainsFunc(tools.Tools, func(tool hostmcp.MCPToolOut) bool { return tool.Name == "builtin__http_get" && tool.InputSchema != nil }) {
			t.Fatalf("builtin tools: %+v", tools)
		}
		var servers hostmcp.MCPServersOut
		c.must("capsem_mcp_servers", map[string]any{"id": "policed"}, &servers)
		if !slices.ContainsFunc(servers.Servers, func(s hostmcp.MCPServerOut) bool { return s.Name == "builtin" && s.Connected && s.Tools > 0 }) {
			t.Fatalf("servers: %+v", servers)
		}
		var out hostmcp.MCPCallOut
		c.must("capsem_mcp_call", map[string]any{"id": "policed", "name": "builtin__http_get", "args": map[string]any{"url": "http://127.0.0.1:9/allowed"}, "traceId": "host-1"}, &out)
		if !out.IsError { // allowed by the MCP policy; the VM's [net] policy refuses the address
			t.Fatalf("the allowed call: %+v", out)
		}
		c.refused("capsem_mcp_call", map[string]any{"id": "policed", "name": "builtin__http_get", "args": map[string]any{"url": "http://127.0.0.1:9/forbidden-secret"}}, "no-forbidden")
		c.refused("capsem_mcp_call", map[string]any{"id": "policed", "name": "nosuch__tool"}, `unknown MCP server "nosuch"`)
		c.refused("capsem_mcp_call", map[string]any{"id": "policed", "name": "http_get"}, "not namespaced")
		var q hostmcp.InspectOut
		c.must("capsem_inspect", map[string]any{"id": "policed", "sql": "SELECT decision, transport, process_name, coalesce(trace_id, '-'), coalesce(request_preview, '') FROM mcp_calls WHERE method = 'tools/call' AND pending = 0 ORDER BY id"}, &q)
		if got := fmt.Sprint(q.Rows); !strings.HasPrefix(got, "[[allowed host host host-1 ") || !strings.Contains(got, "[denied host host - ") || strings.Contains(got, "forbidden-secret") {
			t.Fatalf("the host's calls in the ledger: %s", got)
		}
	})

	t.Run("panics", func(t *testing.T) {
		// A real crash of a real capsem process: a VM's process killed
		// with SIGQUIT dumps its goroutines into its log, and
		// capsem_panics finds it, naming the VM.
		var vm hostmcp.VMOut
		c.must("capsem_create", map[string]any{"name": "crash", "base": "minimal", "ramMb": 512, "cpuCount": 1}, &vm)
		defer c.must("capsem_delete", map[string]any{"id": "crash"}, nil)
		if vm.PID <= 0 {
			t.Fatalf("no pid: %+v", vm)
		}
		if err := syscall.Kill(vm.PID, syscall.SIGQUIT); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); vm.State != "defunct"; time.Sleep(200 * time.Millisecond) {
			c.must("capsem_info", map[string]any{"id": "crash"}, &vm)
			if time.Now().After(deadline) {
				t.Fatalf("the crashed VM is %s", vm.State)
			}
		}
		var p hostmcp.PanicsOut
		c.must("capsem_panics", map[string]any{"since": "10m"}, &p)
		if !slices.ContainsFunc(p.Panics, func(r hostmcp.PanicOut) bool {
			return r.Component == "process" && r.VM == vm.ID && r.Message == "SIGQUIT: quit" && r.Fatal && len(r.Frames) > 0 && strings.HasSuffix(r.Log, "process.log")
		}) {
			t.Fatalf("capsem_panics: %+v", p)
		}
		c.refused("capsem_panics", map[string]any{"limit": 1000}, "limit")
	})

	t.Run("triage", func(t *testing.T) {
		// What went wrong above, ranked: the service's refusal of the bad
		// limit just before, and dev's failed command (exit 3) from its
		// ledger.
		var tr hostmcp.TriageOut
		c.must("capsem_triage", map[string]any{"id": "dev", "since": "1h", "limit": 200}, &tr)
		has := func(kind, summary string) bool {
			return slices.ContainsFunc(tr.Findings, func(f hostmcp.FindingOut) bool { return f.Kind == kind && strings.Contains(f.Summary, summary) })
		}
		if !has("refused_request", "GET /v1/panics refused with 400") || !has("failed_exec", "exit 3: ") {
			t.Fatalf("triage: %+v", tr)
		}
		for i := 1; i < len(tr.Findings); i++ {
			if slices.Index(api.Severities, tr.Findings[i].Severity) < slices.Index(api.Severities, tr.Findings[i-1].Severity) {
				t.Fatalf("not ranked by severity: %+v", tr.Findings)
			}
		}
		c.refused("capsem_triage", map[string]any{"id": "ghost"}, `no VM named "ghost"`)
	})

	t.Run("logs", func(t *testing.T) {
		var l hostmcp.LogsOut
		c.must("capsem_vm_logs", map[string]any{"id": "dev", "tail": 5}, &l)
		if l.Serial == "" || strings.Count(l.Process, "\n") > 5 || l.Process == "" {
			t.Fatalf("vm logs: %+v", l)
		}
		c.must("capsem_service_logs", map[string]any{"grep": "VM running"}, &l)
		if !strings.Contains(l.Service, "VM running") {
			t.Fatalf("service logs: %q", l.Service)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		c.refused("capsem_create", map[string]any{"name": "../etc"}, "use lower-case letters")
		c.refused("capsem_create", map[string]any{"name": "Dev"}, "use lower-case letters")
		c.refused("capsem_create", map[string]any{"name": "dev"}, `a VM named "dev" exists already`)
		c.refused("capsem_create", map[string]any{"ramMb": 1 << 30}, "memory")
		c.refused("capsem_create", map[string]any{"env": map[string]any{"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD")
		c.refused("capsem_exec", map[string]any{"id": "ghost", "command": "true"}, `no VM named "ghost"`)
		c.refused("capsem_exec", map[string]any{"id": "../../x", "command": "true"}, "no VM named")
		c.refused("capsem_resume", map[string]any{"name": "dev"}, "VM dev is running: resume takes a VM that is stopped or defunct")
		var l hostmcp.ListOut
		c.must("capsem_list", map[string]any{}, &l)
		if len(l.VMs) != 1 {
			t.Fatalf("a refused create left a VM behind: %+v", l.VMs)
		}
	})

	t.Run("stop and resume", func(t *testing.T) {
		var r hostmcp.ExecOut
		c.must("capsem_exec", map[string]any{"id": "dev", "command": "echo kept > /root/workspace/kept; echo disk > /root/ondisk; sync"}, &r)
		var vm hostmcp.VMOut
		c.must("capsem_stop", map[string]any{"id": "dev"}, &vm)
		if vm.State != "stopped" {
			t.Fatalf("stop: %+v", vm)
		}
		c.refused("capsem_exec", map[string]any{"id": "dev", "command": "true"}, "not running")
		c.must("capsem_resume", map[string]any{"name": "dev"}, &vm)
		if vm.State != "running" {
			t.Fatalf("resume: %+v", vm)
		}
		c.must("capsem_exec", map[string]any{"id": "dev", "command": "cat /root/workspace/kept /root/ondisk"}, &r)
		if r.Stdout != "kept\ndisk\n" {
			t.Fatalf("state after resume: %+v", r)
		}
	})

	t.Run("ephemeral, persist, purge", func(t *testing.T) {
		var e1, e2 hostmcp.VMOut
		c.must("capsem_create", map[string]any{"ramMb": 512, "cpuCount": 1}, &e1)
		c.must("capsem_create", map[string]any{"ramMb": 512, "cpuCount": 1}, &e2)
		if e1.Persistent || e1.Name != "" {
			t.Fatalf("ephemeral: %+v", e1)
		}
		// Two VMs isolated from each other.
		var r hostmcp.ExecOut
		c.must("capsem_exec", map[string]any{"id": e1.ID, "command": "echo one > /root/workspace/mine"}, &r)
		c.must("capsem_exec", map[string]any{"id": e2.ID, "command": "cat /root/workspace/mine 2>&1 || true"}, &r)
		if strings.Contains(r.Stdout, "one") {
			t.Fatalf("a file of one VM is visible in the other: %+v", r)
		}
		var p hostmcp.VMOut
		c.must("capsem_persist", map[string]any{"id": e2.ID, "name": "kept2"}, &p)
		if !p.Persistent || p.Name != "kept2" {
			t.Fatalf("persist: %+v", p)
		}
		c.refused("capsem_persist", map[string]any{"id": e1.ID, "name": "dev"}, "exists already")
		var pr hostmcp.PurgeOut
		c.must("capsem_purge", map[string]any{}, &pr)
		if len(pr.Removed) != 1 || pr.Removed[0] != e1.ID {
			t.Fatalf("purge removed %v, want only %s", pr.Removed, e1.ID)
		}
		if _, err := os.Stat(filepath.Join(runDir, "sessions", e1.ID)); !os.IsNotExist(err) {
			t.Fatalf("the purged VM's session remains: %v", err)
		}
		var vm hostmcp.VMOut
		c.must("capsem_stop", map[string]any{"id": "kept2"}, &vm)
		c.must("capsem_delete", map[string]any{"id": "kept2"}, nil)
		c.refused("capsem_info", map[string]any{"id": "kept2"}, "no VM named")
		c.refused("capsem_exec", map[string]any{"id": e2.ID, "command": "true"}, "no VM named")
	})

	t.Run("run", func(t *testing.T) {
		var r hostmcp.ExecOut
		c.must("capsem_run", map[string]any{"command": "echo hi; uname -s"}, &r)
		if r.Stdout != "hi\nLinux\n" || r.ExitCode != 0 {
			t.Fatalf("run: %+v", r)
		}
		var l hostmcp.ListOut
		c.must("capsem_list", map[string]any{}, &l)
		if len(l.VMs) != 1 || l.VMs[0].Name != "dev" {
			t.Fatalf("run left a VM: %+v", l.VMs)
		}
	})

	t.Run("a boot blocks nothing else", func(t *testing.T) {
		other := startMCP(t, env, runDir)
		done := make(chan string, 1)
		go func() {
			var vm hostmcp.VMOut
			done <- c.call("capsem_create", map[string]any{"name": "slow", "ramMb": 512, "cpuCount": 1}, &vm)
		}()
		// While it boots, the other VM and the list answer, and show it
		// booting.
		seen := false
		for !seen {
			var l hostmcp.ListOut
			other.must("capsem_list", map[string]any{}, &l)
			for _, v := range l.VMs {
				seen = seen || v.Name == "slow" && v.State == "booting"
			}
			select {
			case msg := <-done:
				t.Fatalf("the create finished (%q) before list or exec ever saw it booting", msg)
			default:
			}
		}
		var r hostmcp.ExecOut
		other.must("capsem_exec", map[string]any{"id": "dev", "command": "echo meanwhile"}, &r)
		if msg := <-done; msg != "" {
			t.Fatal(msg)
		}
		c.must("capsem_delete", map[string]any{"id": "slow"}, nil)
	})

	t.Run("two clients at once", func(t *testing.T) {
		other := startMCP(t, env, runDir)
		var wg sync.WaitGroup
		errs := make(chan string, 2)
		for i, cl := range []*capsemMCP{c, other} {
			wg.Go(func() {
				var vm hostmcp.VMOut
				name := fmt.Sprintf("par-%d", i)
				if msg := cl.call("capsem_create", map[string]any{"name": name, "ramMb": 512, "cpuCount": 1}, &vm); msg != "" {
					errs <- msg
					return
				}
				var r hostmcp.ExecOut
				for j := range 5 {
					if msg := cl.call("capsem_exec", map[string]any{"id": name, "command": fmt.Sprintf("echo %s-%d > /root/workspace/f; cat /root/workspace/f", name, j)}, &r); msg != "" || r.Stdout != fmt.Sprintf("%s-%d\n", name, j) {
						errs <- fmt.Sprintf("%s: %q %+v", name, msg, r)
						return
					}
				}
				cl.call("capsem_delete", map[string]any{"id": name}, nil)
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
	})

	c.must("capsem_delete", map[string]any{"id": "dev"}, nil)
	var l hostmcp.ListOut
	c.must("capsem_list", map[string]any{}, &l)
	if len(l.VMs) != 0 {
		t.Fatalf("VMs left: %+v", l.VMs)
	}
}

// TestServiceRestartAndCrash: a service stopped with one persistent VM
// stopped and one running lists both after a restart, the running one
// still answering; after a kill -9 of the service the next call starts a
// new one, which re-adopts the running VM; nothing is left unowned.
func TestServiceRestartAndCrash(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	c := startMCP(t, env, runDir)
	var vm hostmcp.VMOut
	c.must("capsem_create", map[string]any{"name": "up", "ramMb": 512, "cpuCount": 1}, &vm)
	c.must("capsem_create", map[string]any{"name": "down", "ramMb": 512, "cpuCount": 1}, &vm)
	c.must("capsem_stop", map[string]any{"id": "down"}, &vm)

	check := func(when string) {
		t.Helper()
		var l hostmcp.ListOut
		c.must("capsem_list", map[string]any{}, &l)
		states := map[string]api.VMState{}
		for _, v := range l.VMs {
			states[v.Name] = v.State
		}
		if states["up"] != "running" || states["down"] != "stopped" || len(states) != 2 {
			t.Fatalf("%s: %v", when, states)
		}
		var r hostmcp.ExecOut
		c.must("capsem_exec", map[string]any{"id": "up", "command": "echo alive"}, &r)
		if r.Stdout != "alive\n" {
			t.Fatalf("%s: exec %+v", when, r)
		}
	}
	servicePID := func() int {
		var v hostmcp.VersionOut
		c.must("capsem_version", map[string]any{}, &v)
		out, err := exec.Command("pgrep", "-f", "capsem service$").Output()
		if err != nil {
			t.Fatalf("no service process: %v", err)
		}
		for _, f := range strings.Fields(string(out)) {
			var pid int
			fmt.Sscan(f, &pid)
			if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil && bytes.Contains(env, []byte("CAPSEM_RUN_DIR="+runDir+"\x00")) {
				return pid
			}
		}
		t.Fatalf("no service process of %s among %q", runDir, out)
		return 0
	}

	// A VM whose process dies is defunct, with its log's last lines, and
	// a persistent one resumes.
	var victim hostmcp.VMOut
	c.must("capsem_create", map[string]any{"name": "victim", "ramMb": 512, "cpuCount": 1}, &victim)
	if err := syscall.Kill(victim.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		c.must("capsem_info", map[string]any{"id": "victim"}, &victim)
		if victim.State == "defunct" {
			break
		}
		if i > 200 {
			t.Fatalf("a killed VM is still %s", victim.State)
		}
		time.Sleep(25 * time.Millisecond)
	}
	if victim.LastLog == "" {
		t.Errorf("a defunct VM without its last log lines: %+v", victim)
	}
	c.refused("capsem_exec", map[string]any{"id": "victim", "command": "true"}, "defunct")
	c.must("capsem_resume", map[string]any{"name": "victim"}, &victim)
	c.must("capsem_delete", map[string]any{"id": "victim"}, nil)

	stopService(t, env)
	check("after a clean restart") // the call starts a new service

	old := servicePID()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for syscall.Kill(old, 0) == nil {
		time.Sleep(10 * time.Millisecond)
	}
	check("after kill -9 of the service")
	if now := servicePID(); now == old {
		t.Fatalf("still service %d", now)
	}
	if n := len(testkit.VMProcesses(runDir)); n != 1 {
		t.Fatalf("%d VM processes, want 1 (the running VM's)", n)
	}
}

// TestTypeScriptSDKClient drives capsem mcp with the official TypeScript
// MCP SDK client (testdata/tsclient/host.mjs), an independent client of
// the same flow.
func TestTypeScriptSDKClient(t *testing.T) {
	dir := filepath.Join(testkit.ModuleRoot(t), "testdata", "tsclient")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Fatalf("the TypeScript SDK is not installed (make deps runs npm ci in %s): %v", dir, err)
	}
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	node := exec.Command("node", filepath.Join(dir, "host.mjs"), testkit.CapsemBinary(t))
	node.Dir, node.Env, node.Stderr = dir, env, os.Stderr
	out, err := node.Output()
	if err != nil {
		t.Fatalf("TypeScript client: %v\n%s", err, out)
	}
	var report struct {
		ServerVersion        struct{ Name string } `json:"serverVersion"`
		Instructions         string                `json:"instructions"`
		Tools                []string              `json:"tools"`
		AllHaveOutputSchemas bool                  `json:"allHaveOutputSchemas"`
		Version              hostmcp.VersionOut    `json:"version"`
		Created              hostmcp.VMOut         `json:"created"`
		Exec                 hostmcp.ExecOut       `json:"exec"`
		Read                 hostmcp.ReadFileOut   `json:"read"`
		Rows                 hostmcp.InspectOut    `json:"rows"`
		Unknown              struct {
			IsError bool   `json:"isError"`
			Text    string `json:"text"`
		} `json:"unknown"`
		After hostmcp.ListOut `json:"after"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("report %q: %v", out, err)
	}
	if report.ServerVersion.Name != "capsem" || !strings.Contains(report.Instructions, "capsem_create") || len(report.Tools) != 26 || !report.AllHaveOutputSchemas {
		t.Errorf("discovery: %+v", report)
	}
	if !report.Version.Match || report.Created.State != "running" || report.Created.Name != "ts-vm" {
		t.Errorf("version/create: %+v %+v", report.Version, report.Created)
	}
	if report.Exec.Stdout != "from-ts\n" || report.Exec.Stderr != "oops\n" || report.Exec.ExitCode != 7 {
		t.Errorf("exec: %+v", report.Exec)
	}
	if report.Read.Content != "ünïcode\n" {
		t.Errorf("read: %+v", report.Read)
	}
	if len(report.Rows.Rows) == 0 || !strings.Contains(fmt.Sprint(report.Rows.Rows), "from-ts") {
		t.Errorf("inspect: %+v", report.Rows)
	}
	if !report.Unknown.IsError || !strings.Contains(report.Unknown.Text, `no VM named "no-such-vm"`) {
		t.Errorf("unknown VM: %+v", report.Unknown)
	}
	if len(report.After.VMs) != 0 {
		t.Errorf("VMs left: %+v", report.After.VMs)
	}
}

// TestKilledClientEndsItsRun: capsem mcp killed (SIGKILL) while its
// capsem_run runs leaves no VM: the run belongs to the service, which
// ends it when its stream breaks.
func TestKilledClientEndsItsRun(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	cmd := exec.Command(testkit.CapsemBinary(t), "mcp")
	cmd.Env = env
	ctx := context.Background()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "doomed", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	go s.CallTool(ctx, &mcp.CallToolParams{Name: "capsem_run", Arguments: map[string]any{"command": "sleep 600"}})
	svc := apiclient.NewServiceClient(filepath.Join(runDir, "service.sock"), nil)
	deadline := time.Now().Add(4 * time.Minute)
	for {
		vms, _ := svc.List(ctx)
		if len(vms) == 1 && vms[0].Run && vms[0].State == api.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's VM never ran: %+v", vms)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cmd.Process.Kill()
	for {
		vms, err := svc.List(ctx)
		if err == nil && len(vms) == 0 && len(testkit.VMProcesses(runDir)) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after capsem mcp was killed: VMs %+v (%v), processes %v", vms, err, testkit.VMProcesses(runDir))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestProgressTellsTheStages: with a progress token, capsem_create and
// capsem_run report the real stages of the VM's start as the per-VM
// process reaches them (guest assets, accelerator, resume or boot), then
// readiness or the command.
func TestProgressTellsTheStages(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	var mu sync.Mutex
	var msgs []string
	cmd := exec.Command(testkit.CapsemBinary(t), "mcp")
	cmd.Env = env
	ctx := context.Background()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "progress", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			msgs = append(msgs, r.Params.Message)
			mu.Unlock()
		}}).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		tool string
		args map[string]any
		last string
	}{
		{"capsem_create", map[string]any{"name": "staged"}, "ready"},
		{"capsem_run", map[string]any{"command": "true"}, "running the command in vm-"},
	} {
		params := &mcp.CallToolParams{Name: tc.tool, Arguments: tc.args}
		params.SetProgressToken(tc.tool)
		if res, err := s.CallTool(ctx, params); err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", tc.tool, err, res)
		}
		// Notifications may trail the result a little.
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			all := strings.Join(msgs, "|")
			mu.Unlock()
			started := strings.Contains(all, "|resuming the saved boot of this configuration") || strings.Contains(all, "|booting under ")
			if strings.Contains(all, "|checking the guest assets|") && strings.Contains(all, "|choosing the accelerator|") && started && strings.Contains(all, tc.last) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: progress %q", tc.tool, all)
			}
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		msgs = nil
		mu.Unlock()
	}
}
