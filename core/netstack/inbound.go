package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
)

// ErrInboundLimit refuses a DialGuest past Limits.Inbound.
var ErrInboundLimit = errors.New("netstack: too many connections into the guest are open")

// DialGuest connects to a TCP port of the guest through the stack, from
// the gateway's address: the host end of a published port. The guest's
// policy does not apply (it decides what the guest reaches, and this is
// the host reaching the guest). Connections are bounded (Limits.Inbound);
// each ends when it is closed or when the stack closes, whichever comes
// first, and Close waits for them.
func (s *Stack) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	if !s.track() {
		return nil, fmt.Errorf("netstack: dialing guest port %d: %w", port, net.ErrClosed)
	}
	select {
	case s.inward <- struct{}{}:
	default:
		s.overInbound.Add(1)
		s.wg.Done()
		return nil, fmt.Errorf("dialing guest port %d: %w (%d)", port, ErrInboundLimit, s.cfg.Limits.Inbound)
	}
	release := sync.OnceFunc(func() {
		<-s.inward
		s.wg.Done()
	})
	// Closing the stack ends a dial in progress.
	ctx, cancel := context.WithCancel(ctx)
	stopDial := context.AfterFunc(s.ctx, cancel)
	to := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(guestAddr.AsSlice()), Port: port}
	c, err := gonet.DialContextTCP(ctx, s.stack, to, ipv4.ProtocolNumber)
	stopDial()
	cancel()
	if err != nil {
		release()
		return nil, fmt.Errorf("dialing guest port %d: %w", port, err)
	}
	g := &guestConn{TCPConn: c, release: release}
	stop := context.AfterFunc(s.ctx, func() { g.Close() })
	g.mu.Lock()
	g.stop = stop
	g.mu.Unlock()
	return g, nil
}

// guestConn is a connection DialGuest made: closing it gives back its
// place under the bound.
type guestConn struct {
	*gonet.TCPConn
	release func()
	once    sync.Once
	err     error

	mu   sync.Mutex
	stop func() bool // unregisters the close on the stack's end
}

func (g *guestConn) Close() error {
	g.once.Do(func() {
		g.mu.Lock()
		stop := g.stop
		g.mu.Unlock()
		if stop != nil {
			stop()
		}
		g.err = g.TCPConn.Close()
		g.release()
	})
	return g.err
}
