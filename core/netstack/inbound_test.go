package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/capsem/capsem/core/guestwire"
)

// guestListen listens on port in the rig's guest and answers each
// connection with "guest got " and what it read, until the host's end of
// its direction, then closes.
func (r *rig) guestListen(t *testing.T, port uint16) *gonet.TCPListener {
	t.Helper()
	ln, err := gonet.ListenTCP(r.guest, fullAddr(netip.AddrPortFrom(netip.MustParseAddr(guestwire.NetGuestIP), port)), ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				got, _ := io.ReadAll(c)
				c.Write(append([]byte("guest got "), got...))
			}()
		}
	}()
	return ln
}

func TestDialGuest(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	r.guestListen(t, 3000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := r.host.DialGuest(ctx, 3000)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The guest sees the connection come from the gateway.
	if got := c.LocalAddr().String(); got != guestwire.NetGatewayIP+":"+portOf(t, got) {
		t.Errorf("the connection comes from %s, want the gateway %s", got, guestwire.NetGatewayIP)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	// Half-closed: the guest reads to the end, then answers.
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "guest got hello" {
		t.Fatalf("read %q, %v; want the guest's answer", got, err)
	}
	if st := r.host.Stats(); st.OpenInbound != 1 {
		t.Errorf("%d inbound connections counted open, want 1", st.OpenInbound)
	}
	c.Close()
	c.Close() // twice is fine, and gives back one place
	if st := r.host.Stats(); st.OpenInbound != 0 {
		t.Errorf("%d inbound connections counted open after Close, want 0", st.OpenInbound)
	}
}

func portOf(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A port the guest does not listen on is refused at once (the guest's
// reset), not after a timeout.
func TestDialGuestRefused(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	c, err := r.host.DialGuest(ctx, 3001)
	if err == nil {
		c.Close()
		t.Fatal("dialing a port the guest does not listen on worked")
	}
	if !isRefused(err) || time.Since(start) > 5*time.Second {
		t.Fatalf("after %v: %v; want a prompt refusal", time.Since(start), err)
	}
	if st := r.host.Stats(); st.OpenInbound != 0 {
		t.Errorf("a failed dial holds a place: %+v", st)
	}
}

func TestDialGuestBound(t *testing.T) {
	lim := testLimits()
	lim.Inbound = 2
	r := newRig(t, basePolicy(), baseResolver(), lim)
	r.guestListen(t, 3000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var held []net.Conn
	for range lim.Inbound {
		c, err := r.host.DialGuest(ctx, 3000)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if _, err := r.host.DialGuest(ctx, 3000); !errors.Is(err, ErrInboundLimit) {
		t.Fatalf("a dial past the bound: %v, want ErrInboundLimit", err)
	}
	if st := r.host.Stats(); st.InboundOverLimit != 1 || st.OpenInbound != 2 {
		t.Errorf("stats %+v", st)
	}
	held[0].Close()
	c, err := r.host.DialGuest(ctx, 3000)
	if err != nil {
		t.Fatalf("a dial after one closed: %v", err)
	}
	c.Close()
	held[1].Close()
}

// Closing the stack ends the connections into the guest that are still
// open, and a dial after it fails.
func TestDialGuestEndsWithTheStack(t *testing.T) {
	r := newRigNoCleanup(t, basePolicy(), baseResolver(), testLimits())
	r.guestListen(t, 3000)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := r.host.DialGuest(ctx, 3000)
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		read <- err
	}()
	closed := make(chan struct{})
	go func() {
		r.shutdown(t)
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the stack waited for a connection into the guest its owner left open")
	}
	select {
	case err := <-read:
		if err == nil {
			t.Error("a read on a connection the stack's end closed worked")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a read on the connection did not end with the stack")
	}
	if _, err := r.host.DialGuest(ctx, 3000); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a dial after Close: %v, want net.ErrClosed", err)
	}
}
