package guestchan

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/mdlayher/vsock"
)

// HostCID is the vsock context ID of the host as seen from a guest.
const HostCID uint32 = vsock.Host

// DialVsock connects to port on the vsock peer cid (HostCID from a guest).
// The logical port is the vsock port; there is no header and no multiplexer.
func DialVsock(ctx context.Context, cid, port uint32) (net.Conn, error) {
	c, err := vsock.DialContext(ctx, cid, port, nil)
	if err != nil {
		return nil, fmt.Errorf("guestchan: vsock dial cid %d port %d: %w", cid, port, err)
	}
	return c, nil
}

// ListenVsock listens on a vsock port of this machine.
func ListenVsock(port uint32) (net.Listener, error) {
	l, err := vsock.Listen(port, nil)
	if err != nil {
		return nil, fmt.Errorf("guestchan: vsock listen port %d: %w", port, err)
	}
	return l, nil
}

// Vsock is a Channel over AF_VSOCK, for backends with a native vsock device
// (vz on macOS). Unlike Session there is no single connection whose death
// could close it: Done closes only on Close, and a dead peer shows up as
// failing dials and connections.
type Vsock struct {
	peer uint32
	log  *slog.Logger

	mu        sync.Mutex
	listeners map[*vsockListener]struct{}
	closed    bool
	done      chan struct{}
}

// NewVsock returns a Channel whose Dial reaches peerCID (HostCID from a
// guest) and whose Listen binds local vsock ports.
func NewVsock(peerCID uint32, log *slog.Logger) *Vsock {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Vsock{
		peer:      peerCID,
		log:       log.With("component", "guestchan", "transport", "vsock"),
		listeners: map[*vsockListener]struct{}{},
		done:      make(chan struct{}),
	}
}

// Dial connects to port on the peer.
func (v *Vsock) Dial(ctx context.Context, port uint32) (net.Conn, error) {
	select {
	case <-v.done:
		return nil, fmt.Errorf("guestchan: vsock dial port %d: %w", port, ErrClosed)
	default:
	}
	return DialVsock(ctx, v.peer, port)
}

// Listen binds port; Close of the channel closes the listener.
func (v *Vsock) Listen(port uint32) (net.Listener, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, fmt.Errorf("guestchan: vsock listen port %d: %w", port, ErrClosed)
	}
	l, err := ListenVsock(port)
	if err != nil {
		return nil, err
	}
	vl := &vsockListener{Listener: l, v: v}
	v.listeners[vl] = struct{}{}
	return vl, nil
}

// Close closes every listener made by Listen and closes Done.
func (v *Vsock) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return nil
	}
	v.closed = true
	ls := v.listeners
	v.listeners = nil
	close(v.done)
	v.mu.Unlock()
	for l := range ls {
		l.Listener.Close()
	}
	return nil
}

// Done is closed by Close.
func (v *Vsock) Done() <-chan struct{} { return v.done }

type vsockListener struct {
	net.Listener
	v *Vsock
}

func (l *vsockListener) Close() error {
	l.v.mu.Lock()
	delete(l.v.listeners, l)
	l.v.mu.Unlock()
	return l.Listener.Close()
}
