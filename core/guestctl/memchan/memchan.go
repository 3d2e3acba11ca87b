// Package memchan is an in-process guest channel for tests: two connected
// ends with vsock-like Dial/Listen per logical port, each stream a Unix
// socketpair (kernel-buffered, half-closable, with deadlines), so the host
// control client and the guest agent can be tested without a VM.
package memchan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNoListener is returned by Dial when the other end has no listener on
// the port (like a vsock connection refused).
var ErrNoListener = errors.New("memchan: no listener on port")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("memchan: channel closed")

// shared is the state both ends see: closing either closes both, as a dead
// transport would.
type shared struct {
	mu     sync.Mutex
	closed bool
	done   chan struct{}
	conns  map[*conn]struct{}
}

// End is one side of the channel.
type End struct {
	s         *shared
	peer      *End
	mu        sync.Mutex
	listeners map[uint32]*listener
}

// Pair returns two connected ends: what one Dials, the other Accepts.
func Pair() (host, guest *End) {
	s := &shared{done: make(chan struct{}), conns: map[*conn]struct{}{}}
	host = &End{s: s, listeners: map[uint32]*listener{}}
	guest = &End{s: s, listeners: map[uint32]*listener{}}
	host.peer, guest.peer = guest, host
	return host, guest
}

// Dial opens a stream to the peer's listener on port.
func (e *End) Dial(ctx context.Context, port uint32) (net.Conn, error) {
	e.peer.mu.Lock()
	l := e.peer.listeners[port]
	e.peer.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("%w %d", ErrNoListener, port)
	}
	mine, theirs, err := e.s.pair()
	if err != nil {
		return nil, err
	}
	select {
	case l.queue <- theirs:
		return mine, nil
	case <-l.closed:
		mine.Close()
		theirs.Close()
		return nil, fmt.Errorf("%w %d", ErrNoListener, port)
	case <-e.s.done:
		mine.Close()
		theirs.Close()
		return nil, ErrClosed
	case <-ctx.Done():
		mine.Close()
		theirs.Close()
		return nil, ctx.Err()
	}
}

// Listen accepts streams the peer dials to port.
func (e *End) Listen(port uint32) (net.Listener, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.s.isClosed() {
		return nil, ErrClosed
	}
	if e.listeners[port] != nil {
		return nil, fmt.Errorf("memchan: port %d already has a listener", port)
	}
	l := &listener{end: e, port: port, queue: make(chan net.Conn, 64), closed: make(chan struct{})}
	e.listeners[port] = l
	return l, nil
}

// Close closes both ends and every stream, like a transport that died.
func (e *End) Close() error {
	s := e.s
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	return nil
}

// Done is closed when the channel is closed.
func (e *End) Done() <-chan struct{} { return e.s.done }

func (s *shared) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *shared) pair() (net.Conn, net.Conn, error) {
	// SOCK_CLOEXEC is Linux-only; hold ForkLock as the standard library
	// does so no child inherits the pair between the two calls.
	syscall.ForkLock.RLock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err == nil {
		unix.CloseOnExec(fds[0])
		unix.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("memchan: socketpair: %w", err)
	}
	a, err := s.fileConn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	b, err := s.fileConn(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		a.Close()
		b.Close()
		return nil, nil, ErrClosed
	}
	s.conns[a] = struct{}{}
	s.conns[b] = struct{}{}
	return a, b, nil
}

func (s *shared) fileConn(fd int) (*conn, error) {
	f := os.NewFile(uintptr(fd), "memchan")
	defer f.Close() // FileConn dups it
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("memchan: %w", err)
	}
	return &conn{UnixConn: c.(*net.UnixConn), s: s}, nil
}

// conn forgets itself on Close so a long test does not pile up streams.
type conn struct {
	*net.UnixConn
	s *shared
}

func (c *conn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	return c.UnixConn.Close()
}

type listener struct {
	end       *End
	port      uint32
	queue     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.queue:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.end.s.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.end.mu.Lock()
		if l.end.listeners[l.port] == l {
			delete(l.end.listeners, l.port)
		}
		l.end.mu.Unlock()
	})
	return nil
}

func (l *listener) Addr() net.Addr { return addr(l.port) }

type addr uint32

func (addr) Network() string  { return "memchan" }
func (a addr) String() string { return fmt.Sprintf("port %d", uint32(a)) }
