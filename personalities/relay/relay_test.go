package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/mcpframe"
)

// fakeEndpoint accepts relay connections and hands each received frame to
// the test.
type fakeEndpoint struct {
	ln     net.Listener
	conns  chan *fakeConn
	closed sync.Once
}

type fakeConn struct {
	c      net.Conn
	meta   string
	frames chan mcpframe.Frame
}

func newFakeEndpoint(t *testing.T) *fakeEndpoint {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ep.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeEndpoint{ln: ln, conns: make(chan *fakeConn, 8)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fc := &fakeConn{c: c, frames: make(chan mcpframe.Frame, 64)}
			go func() {
				br := bufio.NewReader(c)
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				fc.meta = line
				f.conns <- fc
				r := mcpframe.NewReader(br)
				for {
					fr, err := r.Read()
					if err != nil {
						close(fc.frames)
						return
					}
					fr.Payload = append([]byte(nil), fr.Payload...)
					fc.frames <- fr
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return f
}

func (f *fakeEndpoint) dialer() Dialer {
	addr := f.ln.Addr().String()
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", addr)
	}
}

func (fc *fakeConn) next(t *testing.T) mcpframe.Frame {
	t.Helper()
	select {
	case f, ok := <-fc.frames:
		if !ok {
			t.Fatal("connection closed")
		}
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no frame")
	}
	return mcpframe.Frame{}
}

func (fc *fakeConn) reply(t *testing.T, stream uint32, payload string) {
	t.Helper()
	b, err := mcpframe.Encode(&mcpframe.Frame{StreamID: stream, Name: "x", Payload: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	fc.c.Write(b)
}

// relayUnderTest runs a Relay with stdin/stdout pipes.
type relayUnderTest struct {
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
}

func startRelay(t *testing.T, dial Dialer) *relayUnderTest {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &Relay{Dial: dial, Name: "claude", Out: outW}
	rt := &relayUnderTest{in: inW, out: bufio.NewReader(outR), done: make(chan error, 1)}
	go func() { rt.done <- r.Run(context.Background(), inR); outW.Close() }()
	t.Cleanup(func() { inW.Close() })
	return rt
}

func (rt *relayUnderTest) send(t *testing.T, line string) {
	t.Helper()
	if _, err := rt.in.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
}

func (rt *relayUnderTest) recv(t *testing.T) map[string]any {
	t.Helper()
	type res struct {
		line string
		err  error
	}
	ch := make(chan res, 1)
	go func() { l, err := rt.out.ReadString('\n'); ch <- res{l, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("reading relay output: %v", r.err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(r.line), &m); err != nil {
			t.Fatalf("relay wrote a non-JSON line %q", r.line)
		}
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("relay wrote nothing")
	}
	return nil
}

func TestRelayFramesRequestsAndNotifications(t *testing.T) {
	ep := newFakeEndpoint(t)
	rt := startRelay(t, ep.dialer())
	rt.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
	fc := <-ep.conns
	if fc.meta != "\x00CAPSEM_META:claude\n" {
		t.Fatalf("meta line %q", fc.meta)
	}
	f := fc.next(t)
	if f.StreamID != 1 || f.Flags != 0 || f.Name != "claude" || !strings.Contains(string(f.Payload), `"initialize"`) {
		t.Fatalf("first frame %+v", f)
	}
	rt.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	rt.send(t, `{"jsonrpc":"2.0","id":"b","method":"tools/list"}`)
	rt.send(t, `not json at all`)
	rt.send(t, ``) // blank lines are ignored
	n := fc.next(t)
	if n.StreamID != 0 || n.Flags != mcpframe.FlagNotification {
		t.Fatalf("notification frame %+v", n)
	}
	if f := fc.next(t); f.StreamID != 2 {
		t.Fatalf("second request on stream %d", f.StreamID)
	}
	if f := fc.next(t); f.StreamID != 3 || string(f.Payload) != "not json at all" {
		t.Fatalf("invalid JSON must be forwarded as a request: %+v", f)
	}
	// Answers come back out of order, each as one line.
	fc.reply(t, 2, `{"jsonrpc":"2.0","id":"b","result":{"tools":[]}}`)
	fc.reply(t, 1, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	if m := rt.recv(t); m["id"] != "b" {
		t.Fatalf("got %v", m)
	}
	if m := rt.recv(t); m["id"] != float64(1) {
		t.Fatalf("got %v", m)
	}
}

func TestRelayOversizedLineIsAnsweredLocally(t *testing.T) {
	ep := newFakeEndpoint(t)
	rt := startRelay(t, ep.dialer())
	rt.send(t, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	fc := <-ep.conns
	fc.next(t)
	fc.reply(t, 1, `{"jsonrpc":"2.0","id":1,"result":{}}`)
	rt.recv(t)
	big := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"a__b","arguments":{"pad":"` + strings.Repeat("x", 1100*1024) + `"}}}`
	rt.send(t, big)
	m := rt.recv(t)
	e, _ := m["error"].(map[string]any)
	if m["id"] != float64(7) || e == nil || !strings.Contains(e["message"].(string), "too large") {
		t.Fatalf("oversized: %v", m)
	}
	// Same connection, next request still works.
	rt.send(t, `{"jsonrpc":"2.0","id":8,"method":"ping"}`)
	if f := fc.next(t); f.StreamID != 2 {
		t.Fatalf("stream %d", f.StreamID)
	}
	select {
	case <-ep.conns:
		t.Fatal("relay reconnected after a local error")
	default:
	}
}

func TestRelayDisconnectAnswersPendingAndReconnects(t *testing.T) {
	ep := newFakeEndpoint(t)
	rt := startRelay(t, ep.dialer())
	rt.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__slow"}}`)
	rt.send(t, `{"jsonrpc":"2.0","id":"two","method":"resources/read","params":{"uri":"capsem://a/b"}}`)
	fc := <-ep.conns
	fc.next(t)
	fc.next(t)
	fc.c.Close()
	got := map[any]string{}
	for i := 0; i < 2; i++ {
		m := rt.recv(t)
		e := m["error"].(map[string]any)
		if e["code"] != float64(CodeTransport) {
			t.Fatalf("code %v", e["code"])
		}
		got[m["id"]] = e["message"].(string)
	}
	if !strings.Contains(got[float64(1)], "before tools/call response") || !strings.Contains(got["two"], "before resources/read response") {
		t.Fatalf("disconnect errors must name the method: %v", got)
	}
	// The next line reconnects, and stream ids start over.
	rt.send(t, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	fc2 := <-ep.conns
	if f := fc2.next(t); f.StreamID != 1 {
		t.Fatalf("stream after reconnect %d", f.StreamID)
	}
}

func TestRelayWaitsForSlowCalls(t *testing.T) {
	ep := newFakeEndpoint(t)
	rt := startRelay(t, ep.dialer())
	rt.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__slow"}}`)
	fc := <-ep.conns
	fc.next(t)
	// Nothing arrives for a while: no receive timeout may fire.
	time.Sleep(2 * time.Second)
	fc.reply(t, 1, `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`)
	if m := rt.recv(t); m["error"] != nil {
		t.Fatalf("slow call failed: %v", m)
	}
	// stdin EOF: the relay half-closes, waits for answers, then exits.
	rt.send(t, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	fc.next(t)
	rt.in.Close()
	fc.reply(t, 2, `{"jsonrpc":"2.0","id":2,"result":{}}`)
	if m := rt.recv(t); m["id"] != float64(2) {
		t.Fatalf("answer after stdin EOF: %v", m)
	}
	fc.c.Close()
	select {
	case err := <-rt.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("relay did not exit")
	}
}

func TestRelayUnreachableEndpoint(t *testing.T) {
	dial, err := DialerFromEnv("unix:" + filepath.Join(t.TempDir(), "missing.sock"))
	if err != nil {
		t.Fatal(err)
	}
	rt := startRelay(t, dial)
	rt.send(t, `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`)
	m := rt.recv(t)
	if m["id"] != float64(5) || !strings.Contains(m["error"].(map[string]any)["message"].(string), "unreachable") {
		t.Fatalf("got %v", m)
	}
}

func TestDialerFromEnv(t *testing.T) {
	for _, bad := range []string{"tcp:1.2.3.4:5", "unix:", "/path"} {
		if _, err := DialerFromEnv(bad); err == nil || !strings.Contains(err.Error(), envvars.MCPEndpoint.Name()) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := DialerFromEnv(""); err == nil {
		t.Error("no guest channel and no override must be an error")
	}
}

func TestParentProcessName(t *testing.T) {
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if got := ParentProcessName(cmd.Process.Pid); got != "sleep" {
		t.Fatalf("got %q", got)
	}
	if got := ParentProcessName(1 << 30); got != "unknown" {
		t.Fatalf("missing process: %q", got)
	}
}

// FuzzReadLine: lines come back in order without their line endings, never
// longer than the limit, and a line within the limit comes back whole.
func FuzzReadLine(f *testing.F) {
	f.Add("a\nbb\r\n\nccc", 2)
	f.Add(strings.Repeat("x", 100)+"\nshort\n", 16)
	f.Add("no newline", 64)
	f.Fuzz(func(t *testing.T, input string, limit int) {
		if limit < 1 || limit > 1<<16 {
			return
		}
		// A 16-byte buffer makes long lines arrive in many chunks.
		br := bufio.NewReaderSize(strings.NewReader(input), 16)
		want := strings.Split(input, "\n")
		if strings.HasSuffix(input, "\n") {
			want = want[:len(want)-1]
		}
		for i := 0; ; i++ {
			line, tooLong, err := readLine(br, limit)
			if err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if err == io.EOF && len(line) == 0 && i >= len(want) {
				return
			}
			if i >= len(want) {
				t.Fatalf("line %d %q past the %d in the input", i, line, len(want))
			}
			if len(line) > limit {
				t.Fatalf("line of %d bytes past the limit %d", len(line), limit)
			}
			expect := strings.TrimRight(want[i], "\r\n")
			if content := strings.TrimSuffix(want[i], "\r"); len(content) <= limit {
				if tooLong || string(line) != expect {
					t.Fatalf("line %d: %q (tooLong %v), want %q", i, line, tooLong, expect)
				}
			} else if !tooLong || !strings.HasPrefix(want[i], string(line)) {
				t.Fatalf("long line %d: %q (tooLong %v)", i, line, tooLong)
			}
			if err == io.EOF {
				if i != len(want)-1 {
					t.Fatalf("EOF after line %d of %d", i, len(want))
				}
				return
			}
		}
	})
}

// countingConn counts the writes the relay makes to the endpoint.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// countingWriter counts the relay's writes to stdout.
type countingWriter struct {
	w      io.Writer
	mu     sync.Mutex
	writes int
}

func (c *countingWriter) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	c.mu.Unlock()
	return c.w.Write(b)
}

// Lines read together go to the endpoint in one write, and answers read
// together go to stdout in one write; a line or a frame still arriving
// holds back nothing that came before it.
func TestRelayBatchesWhatArrivesTogether(t *testing.T) {
	ep := newFakeEndpoint(t)
	var conn *countingConn
	dial := func(ctx context.Context) (net.Conn, error) {
		c, err := ep.dialer()(ctx)
		if err != nil {
			return nil, err
		}
		conn = &countingConn{Conn: c}
		return conn, nil
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stdout := &countingWriter{w: outW}
	r := &Relay{Dial: dial, Name: "claude", Out: stdout}
	go func() { r.Run(context.Background(), inR); outW.Close() }()
	t.Cleanup(func() { inW.Close() })
	rt := &relayUnderTest{in: inW, out: bufio.NewReader(outR)}

	req := func(id int) string {
		return `{"jsonrpc":"2.0","id":` + string(rune('0'+id)) + `,"method":"tools/call"}` + "\n"
	}
	// Three whole lines and the start of a fourth in one write.
	fourth := req(4)
	if _, err := inW.Write([]byte(req(1) + req(2) + req(3) + fourth[:10])); err != nil {
		t.Fatal(err)
	}
	fc := <-ep.conns
	for want := uint32(1); want <= 3; want++ {
		if f := fc.next(t); f.StreamID != want {
			t.Fatalf("frame %d has stream %d", want, f.StreamID)
		}
	}
	conn.mu.Lock()
	writes := conn.writes
	conn.mu.Unlock()
	if writes != 2 { // the metadata line, then the three frames together
		t.Fatalf("%d writes to the endpoint for the metadata line and three requests read together, want 2", writes)
	}
	if _, err := inW.Write([]byte(fourth[10:])); err != nil {
		t.Fatal(err)
	}
	if f := fc.next(t); f.StreamID != 4 {
		t.Fatalf("fourth frame has stream %d", f.StreamID)
	}

	// Three whole answers and the start of a fourth in one write.
	var answers []byte
	for id := uint32(1); id <= 4; id++ {
		b, _ := mcpframe.Encode(&mcpframe.Frame{StreamID: id, Name: "x", Payload: []byte(`{"jsonrpc":"2.0","id":` + string(rune('0'+id)) + `,"result":{}}`)})
		answers = append(answers, b...)
	}
	cut := len(answers) - 5
	fc.c.Write(answers[:cut])
	for id := 1; id <= 3; id++ {
		if m := rt.recv(t); m["id"] != float64(id) {
			t.Fatalf("answer %d: %v", id, m)
		}
	}
	stdout.mu.Lock()
	writes = stdout.writes
	stdout.mu.Unlock()
	if writes != 1 {
		t.Fatalf("%d writes to stdout for three answers read together, want 1", writes)
	}
	fc.c.Write(answers[cut:])
	if m := rt.recv(t); m["id"] != float64(4) {
		t.Fatalf("answer 4: %v", m)
	}
}

func TestProgramName(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"/usr/local/bin/claude", "-p", "hi"}, "claude"},
		{[]string{"node", "/usr/local/bin/gemini", "-p", "hi"}, "gemini"},
		{[]string{"/usr/local/bin/node", "--no-warnings", "/usr/local/lib/node_modules/@google/gemini-cli/bundle/gemini.js"}, "gemini"},
		{[]string{"python3", "-u", "agent.py"}, "agent.py"},
		{[]string{"python3", "-c", "import x"}, "python3"},
		{[]string{"node"}, "node"},
		{[]string{"bash", "-e", "run.sh"}, "run.sh"},
		{[]string{"bash", "-c", "claude -p x"}, "bash"},
		{[]string{"node", "-e", "1"}, "node"},
		{[]string{"sh", "/opt/tool"}, "tool"},
		{[]string{"node", "client.mjs", "/bin/capsem-mcp-server"}, "client"},
		{[]string{""}, ""},
		{nil, ""},
	} {
		if got := programName(tc.argv); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.argv, got, tc.want)
		}
	}
}
