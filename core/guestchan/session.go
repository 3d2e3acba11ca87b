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
// under TCG on a loaded host: slow, but not lossy. Keepalive exists to notice
// a hung guest, not a dead QEMU (its socket closes), so it can be lazy.
const (
	// keepAliveInterval is how often each side pings the other.
	keepAliveInterval = 30 * time.Second
	// connectionWriteTimeout bounds one frame write and one keepalive ping
	// round trip; a TCG guest under load can stall for seconds.
	connectionWriteTimeout = 30 * time.Second
	// headerTimeout bounds how long the acceptor waits for a new stream's
	// header. The dialer sends it right after opening, so this only fires
	// for a broken or hostile peer, and it only closes that stream.
	headerTimeout = 30 * time.Second
	// listenBacklog is the number of handshaken connections a listener
	// holds before Accept.
	listenBacklog = 128
)

// Session multiplexes logical-port streams over one byte stream.
type Session struct {
	mux *yamux.Session
	log *slog.Logger

	mu        sync.Mutex
	listeners map[uint32]*listener

	localClose atomic.Bool
	closeOnce  sync.Once
	acceptDone chan struct{}
	handshakes sync.WaitGroup
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
	cfg := yamux.DefaultConfig()
	cfg.EnableKeepAlive = true
	cfg.KeepAliveInterval = keepAliveInterval
	cfg.ConnectionWriteTimeout = connectionWriteTimeout
	// A stream the peer never acknowledges means the peer is gone; yamux
	// then closes the whole session, which is what we want, but give a TCG
	// guest the same slack as a ping.
	cfg.StreamOpenTimeout = 2 * connectionWriteTimeout
	cfg.LogOutput = nil
	cfg.Logger = yamuxLogger{log}
	var (
		mux *yamux.Session
		err error
	)
	cc := &coalescingConn{ReadWriteCloser: conn}
	if server {
		mux, err = yamux.Server(cc, cfg)
	} else {
		mux, err = yamux.Client(cc, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("guestchan: starting yamux %s: %w", role, err)
	}
	s := &Session{
		mux:        mux,
		log:        log,
		listeners:  map[uint32]*listener{},
		acceptDone: make(chan struct{}),
	}
	go s.acceptLoop()
	return s, nil
}

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
	})
	return nil
}

// Dial opens a stream to the peer's listener on port and waits for the peer
// to accept it (one round trip), bounded by ctx.
func (s *Session) Dial(ctx context.Context, port uint32) (net.Conn, error) {
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
		st.Close()
		return nil, err
	}
	return &conn{Stream: st, port: port}, nil
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
		_, err = io.ReadFull(st, buf[:ReplySize])
	}
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("guestchan: dial port %d: %w", port, ctx.Err())
		case s.mux.IsClosed():
			return fmt.Errorf("guestchan: dial port %d: %w", port, s.closedErr())
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return fmt.Errorf("guestchan: dial port %d: peer closed the stream during the handshake", port)
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
		s:      s,
		port:   port,
		queue:  make(chan net.Conn, listenBacklog),
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
		// The accept loop is the only place that adds, and Close waits for
		// it to return before waiting on the group.
		s.handshakes.Add(1)
		go s.acceptHandshake(st)
	}
}

// acceptHandshake reads a new stream's header and routes it to its port's
// listener. Anything wrong closes this stream only.
func (s *Session) acceptHandshake(st *yamux.Stream) {
	defer s.handshakes.Done()
	st.SetReadDeadline(time.Now().Add(headerTimeout))
	var buf [HeaderSize]byte
	if _, err := io.ReadFull(st, buf[:]); err != nil {
		if !s.mux.IsClosed() {
			s.log.Warn("stream closed before its header", "stream", st.StreamID(), "err", err)
		}
		st.Close()
		return
	}
	port, err := ParseHeader(buf[:])
	if err != nil {
		s.log.Warn("rejecting stream", "stream", st.StreamID(), "err", err)
		st.Write(appendReply(nil, replyBadHeader))
		st.Close()
		return
	}
	st.SetReadDeadline(time.Time{})
	s.mu.Lock()
	l := s.listeners[port]
	s.mu.Unlock()
	if l == nil {
		s.log.Debug("stream to a port nobody listens on", "port", port)
		st.Write(appendReply(nil, replyNoListener))
		st.Close()
		return
	}
	// Reply before the connection is visible to Accept: otherwise the
	// accepting application could write first and its bytes would precede
	// the reply on the wire.
	if _, err := st.Write(appendReply(nil, replyOK)); err != nil {
		st.Close()
		return
	}
	c := &conn{Stream: st, port: port}
	select {
	case l.queue <- c:
		// A Close that raced with the send may have drained already.
		select {
		case <-l.closed:
			l.drain()
		default:
		}
	case <-l.closed:
		st.Close()
	case <-s.mux.CloseChan():
		st.Close()
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
}

// CloseWrite ends this side's half of the stream: a yamux Close is a half
// close, so the peer reads EOF and may still answer on the stream.
func (c *conn) CloseWrite() error { return c.Stream.Close() }

func (c *conn) LocalAddr() net.Addr  { return Addr{Port: c.port} }
func (c *conn) RemoteAddr() net.Addr { return Addr{Port: c.port} }

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
	case strings.HasPrefix(msg, "[ERR]"):
		level = slog.LevelWarn // the session error is reported by its owner
	case strings.HasPrefix(msg, "[WARN]"):
		level = slog.LevelWarn
	case strings.HasPrefix(msg, "[DEBUG]"):
		level = slog.LevelDebug
	}
	y.log.Log(context.Background(), level, msg)
}

// coalescingConn merges each yamux data-frame header with the body that
// follows it into one Write. yamux writes a frame's 12-byte header and its
// body in two calls; on a virtio-serial port every write is a separate
// buffer and a separate notification of the other side, which under TCG
// costs more than the copy.
type coalescingConn struct {
	io.ReadWriteCloser
	pending bool
	buf     []byte
}

// yamuxHeaderSize, the data type and the length offset follow yamux's wire
// format (version, type, flags u16, stream id u32, length u32).
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

func (c *coalescingConn) Write(p []byte) (int, error) {
	// Only yamux's send loop writes, one call at a time, so no lock.
	if c.pending {
		c.pending = false
		c.buf = append(c.buf[:yamuxHeaderSize], p...)
		n, err := c.ReadWriteCloser.Write(c.buf)
		if len(c.buf) > 1<<20 {
			c.buf = nil // do not pin a huge frame's buffer
		}
		return max(0, n-yamuxHeaderSize), err
	}
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.buf = append(c.buf[:0], p...)
		c.pending = true
		return len(p), nil
	}
	return c.ReadWriteCloser.Write(p)
}
