// Package guestchan is the channel between the host and a guest: logical
// ports with vsock-like semantics (many connections per port, either side
// may listen or dial), carried either by a stream multiplexer over one byte
// stream (a virtio-serial port on QEMU) or natively by AF_VSOCK.
//
// The multiplexed form (Session) runs hashicorp/yamux over the byte stream;
// each yamux stream starts with an 8-byte header naming its logical port and
// is answered with a 4-byte reply (see header.go). The host is the yamux
// server, the guest the client; both sides may Dial and Listen.
//
// This package is linked into the guest agent, so it must stay CGO-free and
// must not import anything host-only.
package guestchan

import (
	"container/list"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/capsem/capsem/core/logs"
)

// Channel is what the rest of Capsem sees of the guest channel, whatever
// carries it.
type Channel interface {
	// Dial opens a connection to the peer's listener on port.
	Dial(ctx context.Context, port uint32) (net.Conn, error)
	// Listen accepts the peer's connections to port.
	Listen(port uint32) (net.Listener, error)
	// Close closes the channel, its listeners and (for Session) every
	// stream.
	Close() error
	// Done is closed when the channel is closed or its carrier died.
	Done() <-chan struct{}
}

var (
	_ Channel = (*Session)(nil)
	_ Channel = (*Vsock)(nil)
)

// Timeouts tuned for a virtio-serial link to a guest that may be running
// under TCG on a loaded host: slow, but not lossy. The session has no
// timeout of its own that ends it: a peer that dies closes the carrier (its
// socket, its port), and a peer that stalls (a guest under a fork bomb, a
// host too loaded to run it for a while) is one to wait for, not to give
// up on, since nothing could bring the session back. Whoever needs an
// answer in time bounds its own wait (guestctl's heartbeat, a Dial's
// context).
const (
	// connectionWriteTimeout bounds the wait of one frame for the
	// session's writer; a TCG guest under load can stall for seconds.
	connectionWriteTimeout = 30 * time.Second
	// headerTimeout bounds how long the acceptor waits for a new stream's
	// header. The dialer sends it right after opening, so this only fires
	// for a broken or hostile peer, and it only resets that stream.
	headerTimeout = 10 * time.Second
	// acceptBacklog is how many streams the peer opened yamux holds until
	// the accept loop takes them; past it yamux resets new ones itself.
	acceptBacklog = 256
)

// Receive windows: how many bytes of one stream a side takes in before its
// reader has taken them (granted to the sender as the reader reads). A
// stream moves at most a window per round trip of the window update (a
// frame through the other side's send loop, QEMU and back: milliseconds
// under TCG, where 256 KiB capped transfers at a fraction of the port's
// rate), so the streams that carry bulk data need more.
//
// On the host a window is memory the guest, which is not trusted, can
// make it hold: a stream has HostReceiveWindow, as many as MaxPeerStreams
// of the guest's, unless the host raised it to HostDataWindow
// (RaiseReceiveWindow), which it does only for streams carrying data it
// asked for (an exec's output, a file it reads), so their number is
// bounded by its own requests. See flowGate. In the guest every stream has
// GuestReceiveWindow: what the trusted host sends costs only the guest's
// memory.
const (
	HostReceiveWindow  = yamuxInitialWindow
	HostDataWindow     = 2 << 20
	GuestReceiveWindow = 2 << 20
)

// ReceiveWindowRaiser is what the host's streams (a Session's) offer
// beyond net.Conn: RaiseReceiveWindow lets the stream hold HostDataWindow
// instead of HostReceiveWindow. Raise only a stream whose data this side
// asked for and reads as it comes: the raise is memory the peer may fill.
type ReceiveWindowRaiser interface {
	RaiseReceiveWindow()
}

// Bounds on the streams the peer opens. On the host the peer is the guest,
// which is not trusted (its root can open streams on the channel behind the
// agent's back): without them every stream it opens costs the host memory
// and a goroutine for as long as it likes. A stream past a bound is reset
// at once, on this side too: yamux alone would keep it until the peer
// closes its end, which a hostile peer never does. The memory a stream can
// cost is bounded by the host's receive window (HostReceiveWindow) while
// nobody reads it.
const (
	// MaxPendingStreams bounds the streams in their handshake (waiting for
	// their header, or answering it); past it the one that has waited
	// longest for its header is reset to make room. A well-behaved dialer
	// sends its header right behind the stream's first frame, so a new
	// stream is the likeliest to be a real one.
	MaxPendingStreams = 64
	// MaxPortStreams bounds the open streams the peer opened to one port,
	// accepted or waiting for Accept; past it the oldest is reset, so that
	// streams a peer leaves idle cannot lock a port for good. It is below
	// the MCP endpoint's own connection bound (256), so that a stream
	// reset here makes room there too.
	MaxPortStreams = 128
	// MaxPeerStreams bounds all the open streams the peer opened; past it
	// a new stream is refused.
	MaxPeerStreams = 1024
)

// Session multiplexes logical-port streams over one byte stream.
type Session struct {
	conn   io.ReadWriteCloser // what the session runs on
	mux    *yamux.Session
	frames *frameReader
	gate   *flowGate // the host's per-stream receive windows; nil in the guest
	log    *slog.Logger
	// peerLog logs what the peer can cause at will, at a bounded rate.
	peerLog *slog.Logger

	mu        sync.Mutex
	listeners map[uint32]*listener
	pending   list.List // *pendingStream whose header has not arrived, oldest first
	// handshakeSlots holds a token per running handshake (MaxPendingStreams).
	handshakeSlots chan struct{}
	ports          map[uint32]*list.List // *conn the peer opened, per port, oldest first
	peerOpen       int                   // streams in pending and ports

	localClose atomic.Bool
	closeOnce  sync.Once
	acceptDone chan struct{}
	handshakes sync.WaitGroup
	granting   sync.WaitGroup
}

// Server starts the host side of a session over conn (the yamux server).
// The session owns conn and closes it on Close or when it fails.
func Server(conn io.ReadWriteCloser, log *slog.Logger) (*Session, error) {
	return newSession(conn, log, true)
}

// Client starts the guest side of a session over conn (the yamux client).
func Client(conn io.ReadWriteCloser, log *slog.Logger) (*Session, error) {
	return newSession(conn, log, false)
}

func newSession(conn io.ReadWriteCloser, log *slog.Logger, server bool) (*Session, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	role := "client"
	if server {
		role = "server"
	}
	log = log.With("component", "guestchan", "role", role)
	peerLog := logs.Limited(log, logs.LimitBurst, logs.LimitInterval)
	cfg := yamux.DefaultConfig()
	cfg.AcceptBacklog = acceptBacklog
	// yamux's keepalive and stream-open timeout both close the whole
	// session when the peer is slow to answer (see above).
	cfg.EnableKeepAlive = false
	cfg.StreamOpenTimeout = 0
	cfg.ConnectionWriteTimeout = connectionWriteTimeout
	cfg.MaxStreamWindowSize = GuestReceiveWindow
	var gate *flowGate
	if server {
		cfg.MaxStreamWindowSize = HostDataWindow
		gate = newFlowGate() // caps each stream below that (see flowGate)
	}
	cfg.LogOutput = nil
	// yamux logs per frame of the peer's (a frame for a stream it does
	// not know, say): at the peer's rate unless limited.
	cfg.Logger = yamuxLogger{peerLog}
	var (
		mux *yamux.Session
		err error
	)
	frames := &frameReader{r: conn}
	w := &wire{Reader: frames, coalescingConn: coalescingConn{ReadWriteCloser: conn}}
	if gate != nil {
		frames.onHeader = gate.incoming
		w.gate = gate
	}
	if server {
		mux, err = yamux.Server(w, cfg)
	} else {
		mux, err = yamux.Client(w, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("guestchan: starting yamux %s: %w", role, err)
	}
	s := &Session{conn: conn,
		mux:        mux,
		frames:     frames,
		gate:       gate,
		log:        log,
		peerLog:    peerLog,
		listeners:  map[uint32]*listener{},
		ports:      map[uint32]*list.List{},
		acceptDone: make(chan struct{}),

		handshakeSlots: make(chan struct{}, MaxPendingStreams),
	}
	go s.acceptLoop()
	if gate != nil {
		s.granting.Add(1)
		go s.grant(w)
	}
	return s, nil
}

// grant sends the window updates the flow gate held back, as their
// streams are read.
func (s *Session) grant(w *wire) {
	defer s.granting.Done()
	for {
		select {
		case <-s.gate.wake:
			if frames := s.gate.takeGrants(); len(frames) > 0 {
				// A failed write fails yamux's next one too: the session
				// reports it.
				w.writeFrames(frames)
			}
		case <-s.mux.CloseChan():
			return
		}
	}
}

// Conn is the connection the session runs on (the agent parks the
// serial channel's port under it).
func (s *Session) Conn() io.ReadWriteCloser { return s.conn }

// Done is closed when the session is closed or the underlying connection
// died.
func (s *Session) Done() <-chan struct{} { return s.mux.CloseChan() }

// Err is nil while the session is up, then an error wrapping ErrClosed that
// says whether Close was called or the connection to the peer was lost.
func (s *Session) Err() error {
	if !s.mux.IsClosed() {
		return nil
	}
	return s.closedErr()
}

func (s *Session) closedErr() error {
	if s.localClose.Load() {
		return fmt.Errorf("%w (closed locally)", ErrClosed)
	}
	return fmt.Errorf("%w: connection to peer lost", ErrClosed)
}

// NumStreams is the number of open streams, for diagnostics and tests.
func (s *Session) NumStreams() int { return s.mux.NumStreams() }

// Ping measures one round trip of the multiplexer itself (no stream).
func (s *Session) Ping() (time.Duration, error) {
	d, err := s.mux.Ping()
	if err != nil {
		if s.mux.IsClosed() {
			return 0, s.closedErr()
		}
		return 0, fmt.Errorf("guestchan: ping: %w", err)
	}
	return d, nil
}

// Close closes every listener and stream and the underlying connection, and
// waits for the session's goroutines. It is safe to call more than once.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		s.localClose.Store(true)
		s.mu.Lock()
		ls := make([]*listener, 0, len(s.listeners))
		for _, l := range s.listeners {
			ls = append(ls, l)
		}
		s.mu.Unlock()
		for _, l := range ls {
			l.Close()
		}
		s.mux.Close()
		<-s.acceptDone
		s.handshakes.Wait()
		s.granting.Wait()
	})
	return nil
}

// Dial opens a stream to the peer's listener on port and waits for the peer
// to accept it (one round trip), bounded by ctx. A stream the peer drops
// before it answers (it had too many streams waiting: a flood of them, say)
// is dialled again, with backoff, until ctx ends.
func (s *Session) Dial(ctx context.Context, port uint32) (net.Conn, error) {
	delay := dialRetryMin
	for {
		c, err := s.dialOnce(ctx, port)
		if !errors.Is(err, errDropped) {
			return c, err
		}
		s.peerLog.Info("the peer dropped a new stream before answering; dialling again", "port", port, "err", err)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("guestchan: dial port %d: %w (the peer dropped every attempt, the last: %w)", port, ctx.Err(), err)
		case <-s.mux.CloseChan():
			return nil, fmt.Errorf("guestchan: dial port %d: %w", port, s.closedErr())
		case <-time.After(delay):
		}
		delay = min(2*delay, dialRetryMax)
	}
}

// Backoff of Dial's attempts after the peer dropped a stream.
const (
	dialRetryMin = 10 * time.Millisecond
	dialRetryMax = 500 * time.Millisecond
)

// errDropped: the peer reset or closed a stream before answering its
// header, which it does only when it had too many (yamux's accept backlog,
// MaxPendingStreams, MaxPeerStreams).
var errDropped = errors.New("the peer dropped the stream before answering")

func (s *Session) dialOnce(ctx context.Context, port uint32) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("guestchan: dial port %d: %w", port, err)
	}
	st, err := s.mux.OpenStream()
	if err != nil {
		if s.mux.IsClosed() {
			return nil, fmt.Errorf("guestchan: dial port %d: %w", port, s.closedErr())
		}
		return nil, fmt.Errorf("guestchan: dial port %d: opening stream: %w", port, err)
	}
	if err := s.dialHandshake(ctx, st, port); err != nil {
		s.reset(st)
		return nil, err
	}
	return &conn{Stream: st, port: port, s: s}, nil
}

func (s *Session) dialHandshake(ctx context.Context, st *yamux.Stream, port uint32) error {
	// ctx ending (cancel or deadline) unblocks the handshake by expiring
	// the stream's deadline; copying ctx's deadline onto the stream instead
	// would race with ctx.Err() becoming set.
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	var buf [HeaderSize]byte
	_, err := st.Write(AppendHeader(buf[:0], port))
	if err == nil {
		var n int
		n, err = io.ReadFull(st, buf[:ReplySize])
		s.consumed(st, n)
	}
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("guestchan: dial port %d: %w", port, ctx.Err())
		case s.mux.IsClosed():
			return fmt.Errorf("guestchan: dial port %d: %w", port, s.closedErr())
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, yamux.ErrConnectionReset):
			return fmt.Errorf("guestchan: dial port %d: %w (%v)", port, errDropped, err)
		default:
			return fmt.Errorf("guestchan: dial port %d: handshake: %w", port, err)
		}
	}
	if err := parseReply(buf[:ReplySize], port); err != nil {
		return fmt.Errorf("guestchan: dial port %d: %w", port, err)
	}
	if !stop() {
		// ctx fired after the reply arrived: the deadline may be set, and
		// the caller asked to give up anyway.
		return fmt.Errorf("guestchan: dial port %d: %w", port, context.Cause(ctx))
	}
	st.SetDeadline(time.Time{})
	return nil
}

// Listen registers a listener for port. One listener per port; every stream
// the peer opens to that port is handed to it.
func (s *Session) Listen(port uint32) (net.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mux.IsClosed() {
		return nil, fmt.Errorf("guestchan: listen port %d: %w", port, s.closedErr())
	}
	if _, ok := s.listeners[port]; ok {
		return nil, fmt.Errorf("guestchan: listen port %d: %w", port, ErrPortInUse)
	}
	l := &listener{
		s:    s,
		port: port,
		// Every queued connection counts against MaxPortStreams, so the
		// queue never fills while the counts hold.
		queue:  make(chan net.Conn, MaxPortStreams),
		closed: make(chan struct{}),
	}
	s.listeners[port] = l
	return l, nil
}

func (s *Session) acceptLoop() {
	defer close(s.acceptDone)
	for {
		st, err := s.mux.AcceptStream()
		if err != nil {
			if !s.localClose.Load() {
				s.log.Info("guest channel down", "err", err)
			}
			return
		}
		if !s.takeHandshakeSlot() {
			s.reset(st)
			return
		}
		// Before the stream is in pending, where takeHandshakeSlot may cut
		// its wait short.
		st.SetReadDeadline(time.Now().Add(headerTimeout))
		s.mu.Lock()
		full := s.peerOpen >= MaxPeerStreams
		p := &pendingStream{st: st}
		if !full {
			s.peerOpen++
			p.elem = s.pending.PushBack(p)
		}
		s.mu.Unlock()
		if full {
			<-s.handshakeSlots
			s.peerLog.Warn("refusing a stream: the peer has too many open", "stream", st.StreamID(), "max_streams", MaxPeerStreams)
			s.reset(st)
			continue
		}
		// The accept loop is the only place that adds, and Close waits for
		// it to return before waiting on the group.
		s.handshakes.Add(1)
		go s.acceptHandshake(p)
	}
}

// takeHandshakeSlot waits for one of the MaxPendingStreams handshake slots,
// making room when they are all taken by cutting short the wait of the
// stream that has waited longest for its header. False when the session
// closed first.
func (s *Session) takeHandshakeSlot() bool {
	select {
	case s.handshakeSlots <- struct{}{}:
		return true
	default:
	}
	s.mu.Lock()
	if e := s.pending.Front(); e != nil {
		oldest := e.Value.(*pendingStream)
		s.pending.Remove(e)
		oldest.elem = nil
		oldest.st.SetReadDeadline(time.Now()) // its handshake resets it
	}
	s.mu.Unlock()
	select {
	case s.handshakeSlots <- struct{}{}:
		return true
	case <-s.mux.CloseChan():
		return false
	}
}

// pendingStream is a stream the peer opened whose header has not arrived.
type pendingStream struct {
	st   *yamux.Stream
	elem *list.Element // in Session.pending; nil once out of it; guarded by Session.mu
}

// acceptHandshake reads a new stream's header and routes it to its port's
// listener. Anything wrong resets this stream only.
func (s *Session) acceptHandshake(p *pendingStream) {
	defer s.handshakes.Done()
	defer func() { <-s.handshakeSlots }()
	st := p.st
	var buf [HeaderSize]byte
	n, readErr := io.ReadFull(st, buf[:])
	s.consumed(st, n)
	s.mu.Lock()
	evicted := p.elem == nil
	if !evicted {
		s.pending.Remove(p.elem)
		p.elem = nil
	}
	s.mu.Unlock()
	if readErr != nil {
		s.dropPeerStream()
		switch {
		case s.mux.IsClosed():
		case evicted:
			s.peerLog.Warn("resetting a stream that sent no header yet: too many streams wait for theirs",
				"stream", st.StreamID(), "max_pending", MaxPendingStreams)
		default:
			s.peerLog.Warn("resetting a stream that sent no header", "stream", st.StreamID(), "err", readErr)
		}
		s.reset(st)
		return
	}
	port, err := ParseHeader(buf[:])
	if err != nil {
		s.dropPeerStream()
		s.peerLog.Warn("rejecting stream", "stream", st.StreamID(), "err", err)
		s.refuse(st, replyBadHeader)
		return
	}
	c := &conn{Stream: st, port: port, s: s}
	var evictedConn *conn
	s.mu.Lock()
	l := s.listeners[port]
	if l != nil {
		q := s.ports[port]
		if q == nil {
			q = list.New()
			s.ports[port] = q
		}
		if q.Len() >= MaxPortStreams {
			evictedConn = q.Front().Value.(*conn)
			q.Remove(evictedConn.elem)
			evictedConn.elem = nil
			s.peerOpen--
		}
		c.elem = q.PushBack(c)
	} else {
		s.peerOpen--
	}
	s.mu.Unlock()
	if l == nil {
		// A guest that dials before the host listens retries: not a warning.
		s.log.Debug("stream to a port nobody listens on", "port", port)
		s.refuse(st, replyNoListener)
		return
	}
	if evictedConn != nil {
		s.peerLog.Warn("resetting the oldest stream on a port: too many are open", "port", port, "max_port_streams", MaxPortStreams)
		evictedConn.Close()
	}
	st.SetReadDeadline(time.Time{})
	// Reply before the connection is visible to Accept: otherwise the
	// accepting application could write first and its bytes would precede
	// the reply on the wire.
	if _, err := st.Write(appendReply(nil, replyOK)); err != nil {
		c.Close()
		return
	}
	select {
	case l.queue <- c:
		// A Close that raced with the send may have drained already.
		select {
		case <-l.closed:
			l.drain()
		default:
		}
	default:
		// Only streams reset since they were queued can fill the queue,
		// and only while nobody accepts.
		s.peerLog.Warn("resetting a stream: nobody accepts on its port", "port", port)
		c.Close()
	}
}

// dropPeerStream uncounts a stream the peer opened that never reached a
// port.
func (s *Session) dropPeerStream() {
	s.mu.Lock()
	s.peerOpen--
	s.mu.Unlock()
}

// refuse answers a stream's header with status and resets the stream.
func (s *Session) refuse(st *yamux.Stream, status byte) {
	st.SetWriteDeadline(time.Now().Add(connectionWriteTimeout))
	st.Write(appendReply(nil, status))
	s.reset(st)
}

// reset ends st on both sides now: the peer sees the end of the stream
// (after what was written to it), and this side forgets the stream without
// waiting for the peer to close its end.
func (s *Session) reset(st *yamux.Stream) {
	// Whatever blocks on st here (a handshake) returns at once.
	st.SetDeadline(time.Now())
	st.Close()
	s.frames.reset(st.StreamID())
	if s.gate != nil {
		s.gate.forget(st.StreamID())
	}
}

// consumed tells the flow gate that n bytes of st were read.
func (s *Session) consumed(st *yamux.Stream, n int) {
	if s.gate != nil {
		s.gate.consumed(st.StreamID(), n)
	}
}

type listener struct {
	s         *Session
	port      uint32
	queue     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *listener) Accept() (net.Conn, error) {
	// A queued connection wins over a concurrent close of the session only
	// if it is still alive; its reads fail at once otherwise.
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.closed:
		if l.s.mux.IsClosed() {
			return nil, fmt.Errorf("guestchan: accept port %d: %w", l.port, l.s.closedErr())
		}
		return nil, fmt.Errorf("guestchan: accept port %d: %w", l.port, net.ErrClosed)
	case <-l.s.mux.CloseChan():
		return nil, fmt.Errorf("guestchan: accept port %d: %w", l.port, l.s.closedErr())
	}
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		l.s.mu.Lock()
		if l.s.listeners[l.port] == l {
			delete(l.s.listeners, l.port)
		}
		l.s.mu.Unlock()
		close(l.closed)
		l.drain()
	})
	return nil
}

// drain closes connections nobody will accept now.
func (l *listener) drain() {
	for {
		select {
		case c := <-l.queue:
			c.Close()
		default:
			return
		}
	}
}

func (l *listener) Addr() net.Addr { return Addr{Port: l.port} }

// Addr is a logical port as a net.Addr.
type Addr struct{ Port uint32 }

// Network is "guestchan".
func (Addr) Network() string { return "guestchan" }

func (a Addr) String() string { return fmt.Sprintf("guestchan:%d", a.Port) }

// conn is a stream that reports its logical port as both addresses.
type conn struct {
	*yamux.Stream
	port uint32
	s    *Session

	elem      *list.Element // in s.ports[port] while it counts; guarded by s.mu
	closeOnce sync.Once
}

func (c *conn) LocalAddr() net.Addr  { return Addr{Port: c.port} }
func (c *conn) RemoteAddr() net.Addr { return Addr{Port: c.port} }

func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Stream.Read(p)
	c.s.consumed(c.Stream, n)
	return n, err
}

// RaiseReceiveWindow lets the stream hold HostDataWindow on the host
// (ReceiveWindowRaiser); in the guest every stream has its full window.
func (c *conn) RaiseReceiveWindow() {
	if c.s.gate != nil {
		c.s.gate.raise(c.Stream.StreamID())
	}
}

// CloseWrite ends this side's half of the stream: the peer reads the end
// after what was written, and reads here go on until the peer ends its
// half. Close must still follow.
func (c *conn) CloseWrite() error { return c.Stream.Close() }

// Close closes the stream on both sides at once (see Session.reset): after
// Close nothing reads it here, and a hostile peer would never close its end.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.s.mu.Lock()
		if c.elem != nil {
			c.s.ports[c.port].Remove(c.elem)
			c.elem = nil
			c.s.peerOpen--
		}
		c.s.mu.Unlock()
		c.s.reset(c.Stream)
	})
	return nil
}

// yamuxLogger sends yamux's printf-style lines to slog, at the level their
// "[ERR]"/"[WARN]" prefix names.
type yamuxLogger struct{ log *slog.Logger }

func (y yamuxLogger) Print(v ...any)                 { y.emit(fmt.Sprint(v...)) }
func (y yamuxLogger) Println(v ...any)               { y.emit(fmt.Sprintln(v...)) }
func (y yamuxLogger) Printf(format string, v ...any) { y.emit(fmt.Sprintf(format, v...)) }

func (y yamuxLogger) emit(msg string) {
	msg = strings.TrimSpace(msg)
	level := slog.LevelInfo
	switch {
	case strings.Contains(msg, "frame for missing stream") || strings.Contains(msg, "Discarding data for stream"):
		// Expected: a stream this side reset (Session.reset) may still
		// get the peer's frames that crossed the reset.
		level = slog.LevelDebug
	case strings.HasPrefix(msg, "[ERR]"):
		level = slog.LevelWarn // the session error is reported by its owner
	case strings.HasPrefix(msg, "[WARN]"):
		level = slog.LevelWarn
	case strings.HasPrefix(msg, "[DEBUG]"):
		level = slog.LevelDebug
	}
	// The limit counts by message: numbers (stream ids, lengths) would
	// make every line a message of its own, so they stay in an attribute.
	y.log.Log(context.Background(), level, strings.Map(dropDigits, msg), "line", msg)
}

func dropDigits(r rune) rune {
	if r >= '0' && r <= '9' {
		return -1
	}
	return r
}

// wire is the byte stream yamux runs over: the peer's bytes through a
// frameReader, ours through a coalescingConn, whose window updates the
// flow gate (on the host) passes on.
type wire struct {
	io.Reader
	coalescingConn
}

func (w *wire) Read(p []byte) (int, error) { return w.Reader.Read(p) }

// coalescingConn merges each yamux data-frame header with the start of the
// body that follows it into one Write. yamux writes a frame's 12-byte
// header and its body in two calls; on a virtio-serial port every write is
// a separate buffer and a separate notification of the other side, which
// under TCG costs more than the copy. Only what fits one port write with
// the header (portWriteMax) is copied: the guest's driver cuts every write
// at that size anyway, so the rest of a large body goes as it is.
type coalescingConn struct {
	io.ReadWriteCloser
	gate *flowGate // nil: window updates go as yamux writes them

	// mu orders yamux's writes (its send loop, one call at a time) and the
	// session's grants, which go between two of yamux's frames.
	mu      sync.Mutex
	pending bool // buf holds a data frame's header, its body comes next
	buf     []byte
}

// writeFrames writes whole frames of the session's own between yamux's.
func (c *coalescingConn) writeFrames(frames []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A data frame's header held back is not on the wire yet: the frames
	// go before it.
	_, err := c.ReadWriteCloser.Write(frames)
	return err
}

// portWriteMax is the most one write to a virtio-serial port carries: the
// guest's driver (virtio_console) sends at most 32 KiB of a write as one
// buffer and returns, so a larger write is several, each a notification
// of the host.
const portWriteMax = 32 << 10

func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending {
		c.pending = false
		first := min(len(p), portWriteMax-yamuxHeaderSize)
		c.buf = append(c.buf[:yamuxHeaderSize], p[:first]...)
		n, err := c.ReadWriteCloser.Write(c.buf)
		if err != nil || first == len(p) {
			return max(0, n-yamuxHeaderSize), err
		}
		n, err = c.ReadWriteCloser.Write(p[first:])
		return first + n, err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.buf = append(c.buf[:0], p...)
		c.pending = true
		return len(p), nil
	}
	if c.gate != nil && len(p) == yamuxHeaderSize {
		hdr := c.gate.outgoing(p)
		if hdr == nil {
			return len(p), nil // the gate holds the whole grant back
		}
		if _, err := c.ReadWriteCloser.Write(hdr); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.ReadWriteCloser.Write(p)
}
