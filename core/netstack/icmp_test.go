package netstack

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// TestICMPGoesNowhere: an echo request from the guest to an address off
// the VM gets no reply (nothing answers for the world) and nothing is
// dialled; only the gateway's own address answers, from the stack itself.
func TestICMPGoesNowhere(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	// The allowed name's address is pinned first: being resolved does not
	// open it to ICMP.
	if m := r.query(t, gatewayAddr.String(), "allowed.example", dns.TypeA); len(m.Answer) == 0 {
		t.Fatalf("allowed.example did not resolve: %v", m)
	}
	tests := []struct {
		name      string
		to        netip.Addr
		wantReply bool
	}{
		{"an address off the VM", netip.MustParseAddr("203.0.113.10"), false},
		{"a resolved, allowed address", allowedIP, false},
		{"the metadata address", netip.MustParseAddr("169.254.169.254"), false},
		{"the host's loopback", netip.MustParseAddr("127.0.0.1"), false},
		{"the gateway", gatewayAddr, true},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			reply := guestPing(t, r, test.to, time.Second)
			if reply != test.wantReply {
				t.Fatalf("echo to %s answered: %v, want %v", test.to, reply, test.wantReply)
			}
		})
	}
	if d := r.dialer.dialed(); len(d) != 0 {
		t.Fatalf("ICMP made the host dial %v", d)
	}
}

// guestPing sends one echo request from the guest's stack and tells
// whether a reply came within wait.
func guestPing(t *testing.T, r *rig, to netip.Addr, wait time.Duration) bool {
	t.Helper()
	var wq waiter.Queue
	ep, e := r.guest.NewEndpoint(icmp.ProtocolNumber4, ipv4.ProtocolNumber, &wq)
	if e != nil {
		t.Fatal(e)
	}
	defer ep.Close()
	we, ready := waiter.NewChannelEntry(waiter.EventIn)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	echo := header.ICMPv4(make([]byte, header.ICMPv4MinimumSize+4))
	echo.SetType(header.ICMPv4Echo)
	echo.SetSequence(1)
	copy(echo.Payload(), "ping")
	dst := tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(to.AsSlice())}
	if _, e := ep.Write(bytes.NewReader(echo), tcpip.WriteOptions{To: &dst}); e != nil {
		t.Fatalf("sending an echo to %s: %v", to, e)
	}
	deadline := time.After(wait)
	for {
		var buf bytes.Buffer
		if _, e := ep.Read(&buf, tcpip.ReadOptions{}); e == nil {
			return true
		} else if _, again := e.(*tcpip.ErrWouldBlock); !again {
			t.Fatalf("reading the echo reply: %v", e)
		}
		select {
		case <-ready:
		case <-deadline:
			return false
		}
	}
}
