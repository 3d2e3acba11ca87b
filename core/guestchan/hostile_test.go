package guestchan

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hostileGuest is the guest side as root in the guest has it: the agent's
// Session on the channel, and a second writer on the same carrier (PID 1's
// descriptor, taken with pidfd_getfd) that writes frames of its own. As on
// a virtio-serial port, each write reaches the host whole.
type hostileGuest struct {
	host, guest *Session
	mu          sync.Mutex // one write at a time on the carrier
	toHost      net.Conn
}

func newHostileGuest(t *testing.T, hostLog *slog.Logger) *hostileGuest {
	hostEnd, toHost := socketPair(t)
	guestEnd, fromGuest := socketPair(t)
	host, err := Server(hostEnd, hostLog)
	if err != nil {
		t.Fatal(err)
	}
	guest, err := Client(guestEnd, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileGuest{host: host, guest: guest, toHost: toHost}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the host's frames all reach the agent, as they would
		defer wg.Done()
		io.Copy(fromGuest, toHost)
		fromGuest.Close()
	}()
	go func() { // the agent's frames reach the host whole
		defer wg.Done()
		defer toHost.Close()
		var hdr [yamuxHeaderSize]byte
		for {
			if _, err := io.ReadFull(fromGuest, hdr[:]); err != nil {
				return
			}
			frame := append([]byte(nil), hdr[:]...)
			if hdr[1] == yamuxTypeData {
				body := make([]byte, binary.BigEndian.Uint32(hdr[8:]))
				if _, err := io.ReadFull(fromGuest, body); err != nil {
					return
				}
				frame = append(frame, body...)
			}
			if err := h.write(frame); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		guest.Close()
		host.Close()
		toHost.Close()
		fromGuest.Close()
		wg.Wait()
	})
	return h
}

func (h *hostileGuest) write(b []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.toHost.Write(b)
	return err
}

// Raw frames of the attack (yamux's wire format).
func appendSYN(dst []byte, id uint32) []byte {
	dst = append(dst, 0, yamuxTypeWindowUpdate, 0, 1) // flags: SYN
	dst = binary.BigEndian.AppendUint32(dst, id)
	return binary.BigEndian.AppendUint32(dst, 0)
}

func appendData(dst []byte, id uint32, body []byte) []byte {
	dst = append(dst, 0, yamuxTypeData, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, id)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)))
	return append(dst, body...)
}

// attackFrames opens n streams from stream id first on: a quarter name no
// port (their header never comes), a quarter stall mid-header, a quarter
// name a port nobody listens on, and a quarter name port and then say
// nothing more.
func attackFrames(first uint32, n int, port uint32) []byte {
	var b []byte
	for i := range n {
		id := first + 2*uint32(i)
		b = appendSYN(b, id)
		switch i % 4 {
		case 1:
			b = appendData(b, id, []byte("CS\x01"))
		case 2:
			b = appendData(b, id, AppendHeader(nil, 7777))
		case 3:
			b = appendData(b, id, AppendHeader(nil, port))
		}
	}
	return b
}

// countingHandler counts the records logged at Warn or above.
type countingHandler struct {
	slog.Handler
	warns *atomic.Int64
}

func (c countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		c.warns.Add(1)
	}
	return c.Handler.Handle(ctx, r)
}

func (c countingHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return countingHandler{c.Handler.WithAttrs(a), c.warns}
}

// TestHostileGuestStreamsAreBounded: 30,000 bare streams written behind the
// agent's back (no header, a stalled header, no listener, a port held
// idle) cost the host a bounded number of streams and goroutines and a
// bounded log, and the agent's own streams work during and after.
func TestHostileGuestStreamsAreBounded(t *testing.T) {
	var logged bytes.Buffer
	var logMu sync.Mutex
	var warns atomic.Int64
	hostLog := slog.New(countingHandler{slog.NewTextHandler(lockedWriter{&logMu, &logged}, nil), &warns})
	var echoes sync.WaitGroup
	t.Cleanup(echoes.Wait) // after the sessions close, which ends the echoes
	h := newHostileGuest(t, hostLog)
	l, err := h.host.Listen(PortMCP)
	if err != nil {
		t.Fatal(err)
	}
	serveEcho(l, &echoes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := echoOnce(ctx, h.guest, PortMCP, []byte("before")); err != nil {
		t.Fatal(err)
	}
	goroutines := runtime.NumGoroutine()

	var maxStreams, maxGoroutines atomic.Int64
	sample := func() {
		if n := int64(h.host.NumStreams()); n > maxStreams.Load() {
			maxStreams.Store(n)
		}
		if n := int64(runtime.NumGoroutine()); n > maxGoroutines.Load() {
			maxGoroutines.Store(n)
		}
	}
	attackDone := make(chan struct{})
	var legitOK, legitFailed atomic.Int64
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-attackDone:
				return
			case <-time.After(time.Millisecond):
				sample()
			}
		}
	}()
	go func() { // the agent keeps using the channel meanwhile
		defer bg.Done()
		for {
			select {
			case <-attackDone:
				return
			default:
			}
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			if err := echoOnce(dctx, h.guest, PortMCP, []byte("during")); err != nil {
				legitFailed.Add(1)
			} else {
				legitOK.Add(1)
			}
			dcancel()
		}
	}()
	const streams, batch = 30000, 64
	first := uint32(1<<31 + 1) // odd, as the client's ids are, far above the agent's
	attackStart := time.Now()
	for i := 0; i < streams; i += batch {
		if err := h.write(attackFrames(first+2*uint32(i), batch, PortMCP)); err != nil {
			t.Fatalf("attack write: %v", err)
		}
	}
	t.Logf("attack written in %v", time.Since(attackStart))
	// The agent's traffic after the attack brings the resets in.
	if err := echoOnce(ctx, h.guest, PortMCP, []byte("after")); err != nil {
		t.Fatalf("the agent's stream after the attack: %v", err)
	}
	close(attackDone)
	bg.Wait()
	sample()
	t.Logf("attack of %d streams: at most %d streams and %d goroutines (%d before) on the host; %d of the agent's streams worked during it, %d failed; %d warnings logged",
		streams, maxStreams.Load(), maxGoroutines.Load(), goroutines, legitOK.Load(), legitFailed.Load(), warns.Load())
	if limit := int64(MaxPeerStreams + acceptBacklog + 64); maxStreams.Load() > limit {
		t.Errorf("the host held up to %d streams, want at most %d", maxStreams.Load(), limit)
	}
	if limit := int64(goroutines + MaxPendingStreams + MaxPortStreams + 64); maxGoroutines.Load() > limit { // the echo server holds a goroutine per stream
		t.Errorf("up to %d goroutines, want at most %d", maxGoroutines.Load(), limit)
	}
	if legitOK.Load() == 0 {
		t.Errorf("none of the agent's %d streams worked during the attack", legitFailed.Load())
	}
	// Resets reach yamux with the peer's next frame: one more round trip.
	deadline := time.Now().Add(10 * time.Second)
	for h.host.NumStreams() > MaxPortStreams+MaxPendingStreams && time.Now().Before(deadline) {
		echoOnce(ctx, h.guest, PortMCP, []byte("x"))
	}
	if n := h.host.NumStreams(); n > MaxPortStreams+MaxPendingStreams {
		t.Errorf("%d streams still open on the host after the attack", n)
	}
	if err := echoOnce(ctx, h.guest, PortMCP, []byte("after")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.host.Done():
		t.Fatal("the attack closed the session")
	default:
	}
	// Each kind of misbehaviour is logged at a bounded rate.
	if n := warns.Load(); n > 100 {
		logMu.Lock()
		text := logged.String()
		logMu.Unlock()
		t.Errorf("%d warnings for one attack, want at most 100:\n%.3000s", n, text)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logged.String(), "resetting a stream that sent no header") {
		t.Errorf("the misbehaviour was not logged:\n%.3000s", logged.String())
	}
}

// TestHostileGuestCannotOverrunTheWindow: data the guest sends past the
// host's receive window on a stream nobody reads is never taken in: the
// host ends the session instead (yamux's check), so a stream costs the
// host at most HostReceiveWindow whatever the guest writes.
func TestHostileGuestCannotOverrunTheWindow(t *testing.T) {
	h := newHostileGuest(t, testLog(t))
	l, err := h.host.Listen(PortMCP)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const id = 1<<31 + 1
	if err := h.write(appendData(appendSYN(nil, id), id, AppendHeader(nil, PortMCP))); err != nil {
		t.Fatal(err)
	}
	// Accepted, the stream has its full window (yamux grants it on
	// accept, before the handshake's reply); then nobody reads it.
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var frames []byte
	chunk := make([]byte, 64<<10)
	for sent := 0; sent <= HostReceiveWindow; sent += len(chunk) {
		frames = appendData(frames, id, chunk)
	}
	// The host may end the session before all of it is written.
	h.write(frames)
	select {
	case <-h.host.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("the host took %d bytes past its %d-byte receive window on one stream and kept the session", len(frames), HostReceiveWindow)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
