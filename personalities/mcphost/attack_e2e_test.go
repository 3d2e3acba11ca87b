package mcphost_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/testkit"
)

// peakMiB is the peak resident size of a process (VmHWM), in MiB.
func peakMiB(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the status of %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM of %d: %q", pid, v)
			}
			return kb >> 10
		}
	}
	t.Fatalf("no VmHWM for %d", pid)
	return 0
}

func wideZeroblobs(n int) string {
	return "SELECT " + strings.TrimSuffix(strings.Repeat("zeroblob(16000000), ", n), ", ")
}

// TestInspectAnswersAreBounded attacks as the issue found: one inspect
// query of wide zeroblobs took the service from 16 MiB to 1.7 GiB and, as
// capsem_inspect, capsem mcp to 5 GB. Through the real service (as the CLI
// asks it), capsem mcp and the CLI: the query of 24 such columns is
// refused with the memory bound named, one such value comes back cut with
// its whole length, an endless result stops at the answer's byte bound,
// and neither the service nor capsem mcp ever grows past 200 MiB, several
// such queries at once included.
func TestInspectAnswersAreBounded(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	c := startMCP(t, env, runDir)
	var vm hostmcp.VMOut
	c.must("capsem_create", map[string]any{"name": "ledger", "ramMb": 512, "cpuCount": 1}, &vm)
	svc := apiclient.NewServiceClient(filepath.Join(runDir, "service.sock"), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	version, err := svc.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("service", func(t *testing.T) {
		_, err := svc.Inspect(ctx, "ledger", api.InspectRequest{SQL: wideZeroblobs(24)})
		var se *apiclient.StatusError
		if !errors.As(err, &se) || se.Status != 400 || !strings.Contains(se.Message, "MiB of memory queries may use") {
			t.Fatalf("24 columns of zeroblob(16000000): %v, want a refusal naming the memory bound", err)
		}
		r, err := svc.Inspect(ctx, "ledger", api.InspectRequest{SQL: "SELECT zeroblob(16000000) AS big, 'x' AS small"})
		if err != nil {
			t.Fatal(err)
		}
		cut, ok := api.AsCutCell(r.Rows[0][0])
		value, _ := cut.Value.(string)
		if !r.Truncated || r.CutCells != 1 || r.TruncatedBy != "" || !ok || cut.Bytes != 16000000 || len(value) == 0 || len(value) > api.MaxInspectCellBytes || r.Rows[0][1] != "x" {
			t.Fatalf("one zeroblob(16000000): truncated %v by %q, %d cut, cell %+v (%d bytes of value), %v", r.Truncated, r.TruncatedBy, r.CutCells, ok, len(value), r.Rows[0][1])
		}
		r, err = svc.Inspect(ctx, "ledger", api.InspectRequest{MaxRows: api.MaxInspectRows,
			SQL: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x, zeroblob(500000) FROM c"})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Truncated || r.TruncatedBy != api.TruncatedByBytes || len(r.Rows) < 2 || len(r.Rows) >= api.MaxInspectRows {
			t.Fatalf("endless rows of 500 KB: truncated %v by %q after %d rows", r.Truncated, r.TruncatedBy, len(r.Rows))
		}
		// Several at once: each is answered, and the memory bound holds.
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for range 6 {
			wg.Go(func() {
				_, err := svc.Inspect(ctx, "ledger", api.InspectRequest{SQL: wideZeroblobs(12)})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err == nil || !strings.Contains(err.Error(), "MiB of memory queries may use") {
				t.Errorf("12 columns at once: %v", err)
			}
		}
	})

	t.Run("capsem mcp", func(t *testing.T) {
		c.refused("capsem_inspect", map[string]any{"id": "ledger", "sql": wideZeroblobs(12)}, "MiB of memory queries may use")
		var q hostmcp.InspectOut
		c.must("capsem_inspect", map[string]any{"id": "ledger", "sql": "SELECT zeroblob(16000000) AS big, 'x' AS small"}, &q)
		cut, ok := api.AsCutCell(q.Rows[0][0])
		if !q.Truncated || q.CutCells != 1 || !ok || cut.Bytes != 16000000 {
			t.Fatalf("one zeroblob(16000000): %v %d %+v", q.Truncated, q.CutCells, ok)
		}
	})

	t.Run("cli", func(t *testing.T) {
		cmd := exec.Command(testkit.CapsemBinary(t), "inspect", "ledger", "SELECT zeroblob(16000000) AS big, 'x' AS small")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("[cut: 16000000 bytes in all]")) || !bytes.Contains(out, []byte("(1 cell(s) cut")) {
			t.Fatalf("capsem inspect: %v\n%.2000s", err, out)
		}
	})

	if peak := peakMiB(t, version.PID); peak > 200 {
		t.Errorf("the service peaked at %d MiB, want under 200", peak)
	}
	if peak := peakMiB(t, c.cmd.Process.Pid); peak > 200 {
		t.Errorf("capsem mcp peaked at %d MiB, want under 200", peak)
	}
	c.must("capsem_delete", map[string]any{"id": "ledger"}, nil)
}

// rawMCP is `capsem mcp` driven line by line on its stdin and stdout, so
// that a test can send what no SDK client would.
type rawMCP struct {
	t       *testing.T
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	answers chan rawAnswer
	exited  chan struct{} // closed once the process is reaped, exitErr set
	exitErr error
}

// rawAnswer is one line capsem mcp writes.
type rawAnswer struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func startRawMCP(t *testing.T, env []string) *rawMCP {
	t.Helper()
	testkit.GuestBinary(t)
	cmd := exec.Command(testkit.CapsemBinary(t), "mcp")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &rawMCP{t: t, cmd: cmd, stdin: stdin, answers: make(chan rawAnswer, 100), exited: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadBytes('\n')
			if len(bytes.TrimSpace(line)) > 0 {
				var a rawAnswer
				if jerr := json.Unmarshal(line, &a); jerr != nil {
					t.Errorf("capsem mcp wrote a line that is not JSON-RPC: %.200q", line)
				} else if a.Method == "" { // notifications are not answers
					m.answers <- a
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		<-read
		m.exitErr = cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-m.exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-m.exited
		}
		if t.Failed() {
			t.Logf("capsem mcp's stderr:\n%s", stderr.String())
		}
	})
	return m
}

func (m *rawMCP) send(lines ...string) {
	m.t.Helper()
	for _, l := range lines {
		if _, err := io.WriteString(m.stdin, l+"\n"); err != nil {
			m.t.Fatalf("writing to capsem mcp: %v", err)
		}
	}
}

func (m *rawMCP) next(timeout time.Duration) rawAnswer {
	m.t.Helper()
	select {
	case a := <-m.answers:
		return a
	case <-m.exited:
		m.t.Fatalf("capsem mcp exited (%v) instead of answering", m.exitErr)
	case <-time.After(timeout):
		m.t.Fatalf("capsem mcp did not answer in %v", timeout)
	}
	return rawAnswer{}
}

func toolCall(id int, name string, args map[string]any) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": map[string]any{"name": name, "arguments": args}})
	return string(b)
}

// TestBadLinesDoNotEndCapsemMCP attacks as the issue found: bad JSON, a
// batch, or a line over its bound made capsem mcp exit without an answer,
// killing every call in flight. Sent while a command runs in a VM, each
// gets its JSON-RPC error (-32700 on id null for bad JSON, -32600 for the
// batch and the long line), a request after them is served, the command's
// call is answered, and capsem mcp stays small and keeps running.
func TestBadLinesDoNotEndCapsemMCP(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	m := startRawMCP(t, env)
	m.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if a := m.next(time.Minute); string(a.ID) != "1" || a.Error != nil {
		t.Fatalf("initialize: %s %+v", a.ID, a.Error)
	}
	m.send(toolCall(2, "capsem_create", map[string]any{"name": "busy", "ramMb": 512, "cpuCount": 1}))
	if a := m.next(5 * time.Minute); string(a.ID) != "2" || a.Error != nil || bytes.Contains(a.Result, []byte(`"isError":true`)) {
		t.Fatalf("capsem_create: %s %+v %s", a.ID, a.Error, a.Result)
	}

	// In flight while the bad lines come.
	m.send(toolCall(3, "capsem_exec", map[string]any{"id": "busy", "command": "sleep 30; echo survived"}))
	m.send(`{"jsonrpc":"2.0","id":4,"method":"tools/list"`) // not JSON: cut short
	m.send(`[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]`)
	m.send(`{"jsonrpc":"2.0","id":7,"method":"ping","params":{"pad":"` + strings.Repeat("x", hostmcp.MaxLineBytes) + `"}}`)
	m.send(`{"jsonrpc":"2.0","id":8,"method":"tools/list"}`)

	wantErrors := []struct {
		code int64
		text string
	}{{-32700, "parse error"}, {-32600, "batches are not supported"}, {-32600, fmt.Sprintf("over %d bytes", hostmcp.MaxLineBytes)}}
	var order []string
	for len(order) < 5 {
		a := m.next(2 * time.Minute)
		switch {
		case string(a.ID) == "null":
			i := len(order)
			if i >= len(wantErrors) || a.Error == nil || a.Error.Code != wantErrors[i].code || !strings.Contains(a.Error.Message, wantErrors[i].text) {
				t.Fatalf("refusal %d: %+v, want code %+v", i, a.Error, wantErrors[min(i, len(wantErrors)-1)])
			}
			order = append(order, fmt.Sprint(a.Error.Code))
		case string(a.ID) == "8":
			if a.Error != nil || !bytes.Contains(a.Result, []byte("capsem_exec")) {
				t.Fatalf("tools/list after the bad lines: %+v", a.Error)
			}
			order = append(order, "tools/list")
		case string(a.ID) == "3":
			var out struct {
				StructuredContent hostmcp.ExecOut `json:"structuredContent"`
			}
			if a.Error != nil || json.Unmarshal(a.Result, &out) != nil || out.StructuredContent.Stdout != "survived\n" {
				t.Fatalf("the call in flight: %+v %s", a.Error, a.Result)
			}
			order = append(order, "exec")
		default:
			t.Fatalf("unexpected answer %s: %+v %.200s", a.ID, a.Error, a.Result)
		}
	}
	// The command was still running when the bad lines and the list were
	// answered.
	if order[len(order)-1] != "exec" {
		t.Errorf("answers in the order %v: the exec was not in flight", order)
	}
	m.send(`{"jsonrpc":"2.0","id":9,"method":"ping"}`)
	if a := m.next(time.Minute); string(a.ID) != "9" || a.Error != nil {
		t.Fatalf("ping at the end: %s %+v", a.ID, a.Error)
	}
	if peak := peakMiB(t, m.cmd.Process.Pid); peak > 200 {
		t.Errorf("capsem mcp peaked at %d MiB reading a line over its bound, want under 200", peak)
	}
	m.send(toolCall(10, "capsem_delete", map[string]any{"id": "busy"}))
	if a := m.next(time.Minute); string(a.ID) != "10" || a.Error != nil {
		t.Fatalf("capsem_delete: %+v", a.Error)
	}
	m.stdin.Close()
	select {
	case <-m.exited:
		if m.exitErr != nil {
			t.Errorf("capsem mcp exited with %v when its input ended", m.exitErr)
		}
	case <-time.After(30 * time.Second):
		t.Error("capsem mcp did not exit when its input ended")
	}
}
