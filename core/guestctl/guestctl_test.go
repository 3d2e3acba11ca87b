package guestctl

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestctl/memchan"
	"github.com/capsem/capsem/core/guestwire"
)

var quiet = slog.New(slog.DiscardHandler)

// fakeGuest is a scripted guest: it connects, says hello, and hands each
// request to the test.
type fakeGuest struct {
	ch   *memchan.End
	conn net.Conn
	r    *guestwire.Reader
	w    *guestwire.Writer
}

func dialHost(t *testing.T, guest *memchan.End) net.Conn {
	t.Helper()
	for range 1000 {
		c, err := guest.Dial(context.Background(), guestchan.PortControl)
		if err == nil {
			return c
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the host never listened on the control port")
	return nil
}

// connect runs Accept against a fake guest that sends hello (if non-nil).
func connect(t *testing.T, hello *guestwire.Message, opts Options) (*Client, *fakeGuest, error) {
	t.Helper()
	host, guest := memchan.Pair()
	return connectOn(t, host, guest, hello, opts)
}

// connectOn is connect over a given channel, seen by the host as host.
func connectOn(t *testing.T, host Channel, guest *memchan.End, hello *guestwire.Message, opts Options) (*Client, *fakeGuest, error) {
	t.Helper()
	t.Cleanup(func() { host.Close() })
	g := &fakeGuest{ch: guest}
	ready := make(chan struct{})
	go func() {
		defer close(ready)
		g.conn = dialHost(t, guest)
		g.r = guestwire.NewReader(g.conn)
		g.w = guestwire.NewWriter(g.conn)
		if hello != nil {
			g.w.Write(hello)
		}
	}()
	if opts.Log == nil {
		opts.Log = quiet
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Accept(ctx, host, opts)
	<-ready
	if c != nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, g, err
}

func goodHello() *guestwire.Message {
	return &guestwire.Message{Type: guestwire.TypeHello, Hello: &guestwire.Hello{ProtocolVersion: guestwire.ProtocolVersion, AgentVersion: "fake"}}
}

func (g *fakeGuest) next(t *testing.T) *guestwire.Message {
	t.Helper()
	var m guestwire.Message
	if err := g.r.Read(&m); err != nil {
		t.Errorf("fake guest read: %v", err)
		return nil
	}
	return &m
}

// drain reads requests and never answers, until the connection ends.
func (g *fakeGuest) drain() {
	var m guestwire.Message
	for g.r.Read(&m) == nil {
	}
}

func TestHelloChecks(t *testing.T) {
	c, _, err := connect(t, goodHello(), Options{})
	if err != nil || c.Hello().AgentVersion != "fake" {
		t.Fatalf("%v", err)
	}
	bad := goodHello()
	bad.Hello.ProtocolVersion = guestwire.ProtocolVersion + 1
	if _, _, err := connect(t, bad, Options{}); err == nil || !strings.Contains(err.Error(), "protocol") {
		t.Fatalf("version mismatch: %v", err)
	}
	if _, _, err := connect(t, &guestwire.Message{Type: guestwire.TypePong, ID: 1}, Options{}); err == nil || !strings.Contains(err.Error(), "hello") {
		t.Fatalf("not a hello: %v", err)
	}
	start := time.Now()
	if _, _, err := connect(t, nil, Options{HelloTimeout: 100 * time.Millisecond}); err == nil || !strings.Contains(err.Error(), "no hello within") {
		t.Fatalf("silent guest: %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("the hello timeout was not applied")
	}
}

func TestAcceptBoundedByContext(t *testing.T) {
	host, _ := memchan.Pair()
	defer host.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Accept(ctx, host, Options{Log: quiet}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	// The listeners are gone, so a retry can listen again.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := Accept(ctx2, host, Options{Log: quiet}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second accept: %v", err)
	}
}

func TestOutOfOrderAnswers(t *testing.T) {
	c, g, err := connect(t, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.Ping(context.Background())
			results <- err
		}()
	}
	a, b := g.next(t), g.next(t)
	// Answer the second first.
	g.w.Write(&guestwire.Message{Type: guestwire.TypePong, ID: b.ID})
	g.w.Write(&guestwire.Message{Type: guestwire.TypePong, ID: a.ID})
	for range 2 {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
}

func TestGuestErrorsAndUnreadableAnswers(t *testing.T) {
	c, g, err := connect(t, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		m := g.next(t)
		g.w.Write(&guestwire.Message{Type: guestwire.TypeError, ID: m.ID, Error: guestwire.Errorf(guestwire.CodeNotFound, "read /x: no such file or directory")})
		m = g.next(t)
		// An answer whose payload does not decode still reaches its caller.
		frame := []byte{0x83, 0xa4, 't', 'y', 'p', 'e', 0xa4, 'p', 'o', 'n', 'g', 0xa2, 'i', 'd', byte(m.ID), 0xa5, 'e', 'r', 'r', 'o', 'r', 0x05}
		g.conn.Write(append([]byte{0, 0, 0, byte(len(frame))}, frame...))
	}()
	_, err = c.ReadFileTo(context.Background(), &guestwire.FileRequest{Path: "/x"}, io.Discard)
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != "read /x: no such file or directory" {
		t.Fatalf("guest error: %v", err)
	}
	if _, err := c.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "did not decode") {
		t.Fatalf("undecodable answer: %v", err)
	}
	// Bad input is refused before anything is sent.
	for _, p := range []string{"relative", "/a/../b", ""} {
		if _, err := c.Stat(context.Background(), p); err == nil {
			t.Errorf("path %q accepted", p)
		}
	}
}

func TestContextAndDeathFailPendingCallsAtOnce(t *testing.T) {
	c, g, err := connect(t, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go g.drain() // never answer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Ping(ctx)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("cancel did not fail the call at once")
	}
	pending := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), &guestwire.Exec{Argv: []string{"sleep", "1000"}}, nil, nil)
		pending <- err
	}()
	time.Sleep(20 * time.Millisecond)
	g.ch.Close()
	select {
	case err := <-pending:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the channel's death did not fail the call at once")
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
		t.Fatal("Done not closed")
	}
	if _, err := c.Ping(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after death: %v", err)
	}
}

func TestHeartbeatClosesOnSilence(t *testing.T) {
	c, g, err := connect(t, goodHello(), Options{HeartbeatInterval: 20 * time.Millisecond, HeartbeatTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go g.drain()
	select {
	case <-c.Done():
		if !strings.Contains(c.Err().Error(), "heartbeat") {
			t.Fatalf("reason %v", c.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a silent guest was not noticed")
	}
}

// openOutput opens an exec output stream the way the guest does.
func (g *fakeGuest) openOutput(t *testing.T, id uint64, which string) net.Conn {
	t.Helper()
	c, err := g.ch.Dial(context.Background(), guestchan.PortExecOutput)
	if err != nil {
		t.Fatal(err)
	}
	if err := guestwire.WriteStreamHeader(c, guestwire.StreamHeader{ID: id, Which: which}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestExecRoutesOutputByID(t *testing.T) {
	c, g, err := connect(t, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		m := g.next(t)
		if m == nil || m.Exec == nil || m.Exec.StreamID != m.ID {
			t.Errorf("exec request %+v", m)
			return
		}
		// A stream for an exec nobody waits for is closed by the host.
		stray := g.openOutput(t, 999, guestwire.StreamStdout)
		if _, err := io.ReadAll(stray); err != nil {
			t.Errorf("stray stream: %v", err)
		}
		out := g.openOutput(t, m.ID, guestwire.StreamStdout)
		errs := g.openOutput(t, m.ID, guestwire.StreamStderr)
		errs.Write([]byte("to stderr"))
		out.Write([]byte("to stdout"))
		out.Close()
		errs.Close()
		g.w.Write(&guestwire.Message{Type: guestwire.TypeExecResult, ID: m.ID, ExecResult: &guestwire.ExecResult{
			ExitCode: 2, StdoutBytes: 9, StdoutSent: 9, StderrBytes: 9, StderrSent: 9}})
	}()
	var stdout, stderr bytes.Buffer
	res, err := c.Exec(context.Background(), &guestwire.Exec{Argv: []string{"x"}}, &stdout, &stderr)
	if err != nil || res.ExitCode != 2 || stdout.String() != "to stdout" || stderr.String() != "to stderr" {
		t.Fatalf("%v %+v %q %q", err, res, stdout.String(), stderr.String())
	}
}

func TestExecReportsLostOutput(t *testing.T) {
	c, g, err := connect(t, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		m := g.next(t)
		out := g.openOutput(t, m.ID, guestwire.StreamStdout)
		g.openOutput(t, m.ID, guestwire.StreamStderr).Close()
		out.Write([]byte("abc"))
		out.Close()
		// The result claims more than the stream carried.
		g.w.Write(&guestwire.Message{Type: guestwire.TypeExecResult, ID: m.ID, ExecResult: &guestwire.ExecResult{StdoutBytes: 5, StdoutSent: 5}})
	}()
	res, err := c.Exec(context.Background(), &guestwire.Exec{Argv: []string{"x"}}, io.Discard, io.Discard)
	if res == nil || err == nil || !strings.Contains(err.Error(), "sent 5 bytes of stdout but 3 arrived") {
		t.Fatalf("%v %+v", err, res)
	}
}

func TestExecRefusesBadInputBeforeSending(t *testing.T) {
	c, _, err := connect(t, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(context.Background(), &guestwire.Exec{Argv: []string{"true"}, Env: map[string]string{"LD_PRELOAD": "/x.so"}}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "LD_PRELOAD") {
		t.Fatalf("got %v", err)
	}
	if err := c.SendBootConfig(context.Background(), &guestwire.BootConfig{Env: map[string]string{"BASH_ENV": "/x"}}); err == nil || !strings.Contains(err.Error(), "BASH_ENV") {
		t.Fatalf("got %v", err)
	}
}

// raiseRecorder is a host channel whose streams record whether the host
// raised their receive window (guestchan.ReceiveWindowRaiser).
type raiseRecorder struct {
	Channel
	mu     sync.Mutex
	raised map[uint64]string // stream header id → which, per raised stream
}

type raisableListener struct {
	net.Listener
	r *raiseRecorder
}

type raisableConn struct {
	net.Conn
	r      *raiseRecorder
	header bytes.Buffer // what the host read first: the stream header
}

func (r *raiseRecorder) Listen(port uint32) (net.Listener, error) {
	l, err := r.Channel.Listen(port)
	return raisableListener{l, r}, err
}

func (l raisableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &raisableConn{Conn: c, r: l.r}, nil
}

func (c *raisableConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.header.Len() < 64 {
		c.header.Write(p[:n])
	}
	return n, err
}

func (c *raisableConn) RaiseReceiveWindow() {
	h, err := guestwire.ReadStreamHeader(bytes.NewReader(c.header.Bytes()))
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if err != nil {
		c.r.raised[0] = "a stream whose header was not read yet"
		return
	}
	c.r.raised[h.ID] += h.Which + " "
}

// TestDataStreamsAreRaised: the host raises the receive window of the data
// streams it asked for, an exec's outputs and a file read's stream, once
// it has matched them to its request, and of no other.
func TestDataStreamsAreRaised(t *testing.T) {
	memHost, guest := memchan.Pair()
	host := &raiseRecorder{Channel: memHost, raised: map[uint64]string{}}
	c, g, err := connectOn(t, host, guest, goodHello(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids := make(chan uint64, 2) // the exec's, then the read's
	go func() {
		m := g.next(t)
		ids <- m.ID
		stray := g.openOutput(t, 999, guestwire.StreamStdout)
		io.ReadAll(stray)
		out := g.openOutput(t, m.ID, guestwire.StreamStdout)
		errs := g.openOutput(t, m.ID, guestwire.StreamStderr)
		out.Write([]byte("out"))
		out.Close()
		errs.Close()
		g.w.Write(&guestwire.Message{Type: guestwire.TypeExecResult, ID: m.ID, ExecResult: &guestwire.ExecResult{StdoutBytes: 3, StdoutSent: 3}})
		m = g.next(t)
		ids <- m.ID
		data := g.openOutput(t, m.ID, guestwire.StreamFile)
		data.Write([]byte("file"))
		data.Close()
		g.w.Write(&guestwire.Message{Type: guestwire.TypeFileResult, ID: m.ID, FileResult: &guestwire.FileResult{Bytes: 4}})
	}()
	if _, err := c.Exec(context.Background(), &guestwire.Exec{Argv: []string{"x"}}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadFileTo(context.Background(), &guestwire.FileRequest{Path: "/f"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	execID, readID := <-ids, <-ids
	host.mu.Lock()
	defer host.mu.Unlock()
	want := map[uint64]string{execID: "stdout stderr ", readID: "file "}
	if len(host.raised) != len(want) || host.raised[readID] != want[readID] ||
		(host.raised[execID] != want[execID] && host.raised[execID] != "stderr stdout ") {
		t.Errorf("raised %v, want %v (and nothing for the stray stream)", host.raised, want)
	}
}
