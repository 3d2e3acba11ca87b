package endpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/mcpframe"
)

// limitsServer serves an endpoint with lim on a Unix socket and returns
// its address, the endpoint and the session.db path.
func limitsServer(t *testing.T, inFlight int, lim Limits) (string, *Endpoint, string) {
	t.Helper()
	dir := t.TempDir()
	db := filepath.Join(dir, "session.db")
	led, err := ledger.Open(context.Background(), db, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ep := New(Config{Upstream: &fakeUpstream{}, Recorder: LedgerRecorder{Ledger: led}, InFlight: inFlight, Limits: lim})
	ln, err := net.Listen("unix", filepath.Join(dir, "ep.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { ep.Serve(ctx, ln); close(served) }()
	t.Cleanup(func() { cancel(); <-served; led.Close() })
	return ln.Addr().String(), ep, db
}

func dialFramed(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte(mcpframe.MetaPrefix + "client\n")); err != nil {
		t.Fatal(err)
	}
	return c
}

func sendFrame(t *testing.T, c net.Conn, stream uint32, payload string) {
	t.Helper()
	b, err := mcpframe.Encode(&mcpframe.Frame{StreamID: stream, Name: "client", Payload: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// closedByServer reports whether the server closed c within d: its end
// (io.Copy reports EOF as nil) or a reset (it closed with our bytes unread),
// not the deadline.
func closedByServer(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestUnreadAnswersStallOnlyTheirClient: a client sends 40 calls with 200 KB
// answers and never reads them. Its unanswered calls hold no shared slot
// (on 3809405 they held every one, and another client's ping waited until
// the first client read), so another client is served at once; the
// non-reading client is disconnected after the write timeout, and every
// call it got served has its row.
func TestUnreadAnswersStallOnlyTheirClient(t *testing.T) {
	addr, _, db := limitsServer(t, 8, Limits{WriteTimeout: 2 * time.Second})
	greedy := dialFramed(t, addr)
	for i := uint32(1); i <= 40; i++ {
		sendFrame(t, greedy, i, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"srv__200k","arguments":{}}}`, i))
	}
	// Wait until the greedy client has filled the in-flight cap with calls
	// whose answers it does not read: their rows are committed before the
	// answers are written.
	h := &harness{t: t, db: db}
	for deadline := time.Now().Add(30 * time.Second); h.rows(`SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'srv__200k' AND pending = 0`)[0][0].(int64) < 8; {
		if time.Now().After(deadline) {
			t.Fatal("the greedy calls never completed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	other := dialFramed(t, addr)
	sendFrame(t, other, 1, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	other.SetReadDeadline(time.Now().Add(1500 * time.Millisecond)) // less than the write timeout
	if _, err := mcpframe.NewReader(other).Read(); err != nil {
		t.Fatalf("another client's ping was not answered while the first did not read: %v", err)
	}
	// Not a byte read until the write timeout has passed: by then the
	// endpoint has closed the connection, and reading finds its end.
	time.Sleep(3500 * time.Millisecond)
	if !closedByServer(greedy, 10*time.Second) {
		t.Fatal("the client that does not read was not disconnected")
	}
	rows := h.rows(`SELECT COUNT(*), COALESCE(SUM(pending), 0) FROM mcp_calls WHERE tool_name = 'srv__200k'`)[0]
	if rows[0].(int64) < 8 || rows[1].(int64) != 0 {
		t.Fatalf("rows of the greedy client's calls: %v, want at least the 8 it got served, none pending", rows)
	}
}

// TestStalledFramesAreCutOff: connections that begin a big frame and stall
// hold their buffers only until the frame timeout, the bytes all
// connections may buffer are bounded (on 3809405, 300 such connections took
// the gateway from 18 to 347 MB, for ever), and connections past the bound
// on their number are refused at once. After all that, the endpoint serves.
func TestStalledFramesAreCutOff(t *testing.T) {
	const frame = 1 << 20
	addr, ep, _ := limitsServer(t, 8, Limits{FrameTimeout: 2 * time.Second, MaxBuffered: 3 * frame, MaxConns: 6})
	var stalled []net.Conn
	for range 4 {
		c := dialFramed(t, addr)
		var prefix [4]byte
		binary.BigEndian.PutUint32(prefix[:], frame)
		c.Write(prefix[:])
		c.Write(make([]byte, frame-1)) // all but the last byte, then nothing
		stalled = append(stalled, c)
	}
	// Three fit in the bound; the fourth is refused at once.
	refused := 0
	for _, c := range stalled {
		if closedByServer(c, 200*time.Millisecond) { // all four well within the frame timeout
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d of 4 stalled connections refused at once, want 1 (the bound holds 3 frames)", refused)
	}
	for i, c := range stalled {
		if !closedByServer(c, 5*time.Second) {
			t.Fatalf("stalled connection %d not cut off after the frame timeout", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for ep.buffered.Load() != 0 || ep.conns.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the cut: %d bytes still buffered, %d connections open", ep.buffered.Load(), ep.conns.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Idle connections are not cut off; one past MaxConns is refused.
	var idle []net.Conn
	for range 6 {
		idle = append(idle, dialFramed(t, addr))
	}
	extra, err := net.Dial("unix", addr) // no metadata: it may be closed before a byte is written
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if !closedByServer(extra, 2*time.Second) {
		t.Fatal("a connection past MaxConns was not refused")
	}
	sendFrame(t, idle[0], 1, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
	idle[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := mcpframe.NewReader(idle[0]).Read(); err != nil {
		t.Fatalf("an idle connection, then a ping: %v", err)
	}
}

// TestTraceFromTheMetadataLine: the trace id a relay's metadata line names
// is on every row of that connection's calls, and on no other
// connection's; a metadata line with a malformed trace id ends its own
// connection, not another's.
func TestTraceFromTheMetadataLine(t *testing.T) {
	addr, _, db := limitsServer(t, 8, Limits{})
	dial := func(meta mcpframe.Meta) net.Conn {
		c, err := net.Dial("unix", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(mcpframe.AppendMetaLine(nil, meta)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	traced, plain := dial(mcpframe.Meta{Name: "claude", TraceID: "run-7"}), dial(mcpframe.Meta{Name: "other"})
	for _, c := range []net.Conn{traced, plain} {
		sendFrame(t, c, 1, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		if _, err := mcpframe.NewReader(c).Read(); err != nil {
			t.Fatal(err)
		}
	}
	bad, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	bad.Write([]byte(mcpframe.MetaPrefix + "evil\ttrace=x y\n"))
	if !closedByServer(bad, 10*time.Second) {
		t.Fatal("a malformed trace id did not end its connection")
	}
	sendFrame(t, traced, 2, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if _, err := mcpframe.NewReader(traced).Read(); err != nil {
		t.Fatalf("another connection's bad metadata line broke this one: %v", err)
	}
	h := &harness{t: t, db: db}
	got := fmt.Sprint(h.rows(`SELECT process_name, COALESCE(trace_id, '-') FROM mcp_calls ORDER BY id`))
	if want := "[[client run-7] [client -] [client run-7]]"; got != want { // the frames name their process (sendFrame)
		t.Fatalf("rows %s, want %s", got, want)
	}
}
