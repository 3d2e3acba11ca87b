package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/vmm"
)

// testPolicy is a small stand-in for netpolicy.Policy: allowed names
// exactly, ports, private names, fixed hosts and addresses allowed by IP.
type testPolicy struct {
	allow   map[string]bool
	ports   map[uint16]bool
	private map[string]bool
	fixed   map[string]netip.Addr
	byIP    map[netip.AddrPort]bool
	// creds, when set, gives the credentials (a compiled [net] policy).
	creds *netpolicy.Policy
}

func (p *testPolicy) Credential(n string) (netpolicy.CredentialRule, bool) {
	if p.creds == nil {
		return netpolicy.CredentialRule{}, false
	}
	return p.creds.Credential(n)
}
func (p *testPolicy) Credentials() []netpolicy.CredentialRule {
	if p.creds == nil {
		return nil
	}
	return p.creds.Credentials()
}

func (p *testPolicy) Name(n string) netpolicy.Verdict {
	if p.allow[n] {
		return netpolicy.Verdict{Allowed: true, Rule: n, Source: "test.toml"}
	}
	return netpolicy.Verdict{Rule: "net.default", Reason: n + " is not allowed"}
}
func (p *testPolicy) Port(port uint16) netpolicy.Verdict {
	if p.ports[port] {
		return netpolicy.Verdict{Allowed: true, Rule: "net.ports"}
	}
	return netpolicy.Verdict{Rule: "net.ports", Reason: fmt.Sprintf("port %d is not allowed", port)}
}
func (p *testPolicy) Address(a netip.AddrPort) netpolicy.Verdict {
	if p.byIP[a] {
		return netpolicy.Verdict{Allowed: true, Rule: a.Addr().String()}
	}
	return netpolicy.Verdict{Rule: "net.allow", Reason: "not allowed by address"}
}
func (p *testPolicy) PrivateAllowed(n string) bool { return p.private[n] }
func (p *testPolicy) FixedHost(n string) (netip.Addr, bool) {
	a, ok := p.fixed[n]
	return a, ok
}

// fakeResolver answers from a table; names absent are not found, names
// mapped to nil fail as a broken upstream would.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	rooted, ok := strings.CutSuffix(host, ".")
	if !ok {
		// The host's search domains would apply to it.
		return nil, fmt.Errorf("test resolver: %q is not rooted", host)
	}
	addrs, ok := r[rooted]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	if addrs == nil {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	return addrs, nil
}

// routeDialer sends each allowed destination to a loopback listener of
// the test and records every dial: a test never reaches off this machine.
type routeDialer struct {
	mu     sync.Mutex
	routes map[netip.AddrPort]string
	dials  []string
}

func (d *routeDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.mu.Lock()
	d.dials = append(d.dials, address)
	to, ok := d.routes[netip.MustParseAddrPort(address)]
	d.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("test dialer: no route to %s", address)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", to)
}

func (d *routeDialer) dialed() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dials...)
}

type events struct {
	mu     sync.Mutex
	conns  []ConnEvent
	dns    []DNSEvent
	models []ModelEvent
	ch     chan struct{}
}

func (e *events) Model(ev ModelEvent) {
	e.mu.Lock()
	e.models = append(e.models, ev)
	e.mu.Unlock()
}

func (e *events) Conn(ev ConnEvent) {
	e.mu.Lock()
	e.conns = append(e.conns, ev)
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}
func (e *events) DNS(ev DNSEvent) {
	e.mu.Lock()
	e.dns = append(e.dns, ev)
	e.mu.Unlock()
}

// count is the number of connection events matching f so far.
func (e *events) count(f func(ConnEvent) bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return countWhere(e.conns, f)
}

// countDNS is the number of DNS events matching f so far.
func (e *events) countDNS(f func(DNSEvent) bool) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return countWhere(e.dns, f)
}

func countWhere[E any](list []E, f func(E) bool) int {
	n := 0
	for _, ev := range list {
		if f(ev) {
			n++
		}
	}
	return n
}

// waitConn waits for a connection event matching f.
func (e *events) waitConn(t *testing.T, f func(ConnEvent) bool) ConnEvent {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		e.mu.Lock()
		for _, ev := range e.conns {
			if f(ev) {
				e.mu.Unlock()
				return ev
			}
		}
		e.mu.Unlock()
		select {
		case <-e.ch:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			e.mu.Lock()
			defer e.mu.Unlock()
			t.Fatalf("no matching connection event; have %+v", e.conns)
		}
	}
}

// rig is a host Stack wired to a second netstack that plays the guest,
// over a socket pair with the hypervisor's framing (qemu's stream unless
// the rig is built by newRigOver).
type rig struct {
	host      *Stack
	guest     *stack.Stack
	pol       *testPolicy
	dialer    *routeDialer
	ev        *events
	cancel    context.CancelFunc
	served    chan error
	guestConn net.Conn
	// guestLinked closes when the guest's switch stops delivering frames;
	// the guest stack may close only then.
	guestLinked chan struct{}
}

func newRig(t *testing.T, pol *testPolicy, res Resolver, lim Limits, configure ...func(*Config)) *rig {
	t.Helper()
	r := newRigNoCleanup(t, pol, res, lim, configure...)
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

// shutdown ends the guest's side, then the host stack, and checks that
// Serve returned.
func (r *rig) shutdown(t *testing.T) {
	r.cancel()
	r.guestConn.Close()
	select {
	case <-r.served:
	case <-time.After(10 * time.Second):
		t.Error("Serve did not return after its context ended")
	}
	r.host.Close()
	<-r.guestLinked
	r.guest.Close()
	r.guest.Wait()
}

func newRigNoCleanup(t *testing.T, pol *testPolicy, res Resolver, lim Limits, configure ...func(*Config)) *rig {
	t.Helper()
	return newRigOverNoCleanup(t, vmm.FramingStream4BE, pol, res, lim, configure...)
}

// newRigOver is newRig over a link of the given framing: a stream socket
// pair for FramingStream4BE, a datagram one (vz's) for FramingDatagram.
func newRigOver(t *testing.T, framing vmm.Framing, pol *testPolicy, res Resolver, lim Limits, configure ...func(*Config)) *rig {
	t.Helper()
	r := newRigOverNoCleanup(t, framing, pol, res, lim, configure...)
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

func newRigOverNoCleanup(t *testing.T, framing vmm.Framing, pol *testPolicy, res Resolver, lim Limits, configure ...func(*Config)) *rig {
	t.Helper()
	r := &rig{pol: pol, dialer: &routeDialer{routes: map[netip.AddrPort]string{}}, ev: &events{ch: make(chan struct{}, 1)}}
	var current Policy = pol
	var polMu sync.Mutex
	cfg := Config{
		Policy:   func() Policy { polMu.Lock(); defer polMu.Unlock(); return current },
		Resolver: res, Dialer: r.dialer, Recorder: r.ev, MTU: 1500, Limits: lim,
	}
	for _, f := range configure {
		f(&cfg)
	}
	host, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.host = host
	sockType, proto := unix.SOCK_STREAM, types.QemuProtocol
	if framing == vmm.FramingDatagram {
		sockType, proto = unix.SOCK_DGRAM, types.VfkitProtocol
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, sockType|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hostConn, guestConn := fileConn(t, fds[0]), fileConn(t, fds[1])
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.served = make(chan error, 1)
	go func() { r.served <- host.Serve(ctx, hostConn, framing) }()
	r.guest, r.guestLinked = guestStack(t, ctx, guestConn, proto)
	r.guestConn = guestConn
	return r
}

func fileConn(t *testing.T, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// guestStack is a netstack configured as the agent configures the guest:
// its address, a default route via the gateway; its frames go over conn
// as proto frames them. The channel closes when the switch has stopped
// delivering frames into the stack (conn closed or ctx ended).
func guestStack(t *testing.T, ctx context.Context, conn net.Conn, proto types.Protocol) (*stack.Stack, chan struct{}) {
	t.Helper()
	link, err := tap.NewLinkEndpoint(false, 1500, guestwire.NetGuestMAC, guestwire.NetGuestIP, nil)
	if err != nil {
		t.Fatal(err)
	}
	sw := tap.NewSwitch(false)
	link.Connect(sw)
	sw.Connect(link)
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	if e := st.CreateNIC(1, link); e != nil {
		t.Fatal(e)
	}
	guest := netip.MustParseAddr(guestwire.NetGuestIP)
	if e := st.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFromSlice(guest.AsSlice()), PrefixLen: guestwire.NetPrefixLen}},
		stack.AddressProperties{}); e != nil {
		t.Fatal(e)
	}
	st.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFromSlice(gatewayAddr.AsSlice()), NIC: 1}})
	linked := make(chan struct{})
	go func() {
		defer close(linked)
		sw.Accept(ctx, conn, proto)
	}()
	return st, linked
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(ap.Addr().AsSlice()), Port: ap.Port()}
}

// dial connects from the guest.
func (r *rig) dial(ctx context.Context, to string) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, r.guest, fullAddr(netip.MustParseAddrPort(to)), ipv4.ProtocolNumber)
}

// query sends one DNS query from the guest over UDP to server:53.
func (r *rig) query(t *testing.T, server, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	out, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	to := fullAddr(netip.AddrPortFrom(netip.MustParseAddr(server), 53))
	c, err := gonet.DialUDP(r.guest, nil, &to, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var reply *dns.Msg
	for attempt := 0; attempt < 5 && reply == nil; attempt++ {
		if _, err := c.Write(out); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // the first query may wait for ARP
			}
			t.Fatalf("query %s: %v", name, err)
		}
		reply = new(dns.Msg)
		if err := reply.Unpack(buf[:n]); err != nil {
			t.Fatal(err)
		}
	}
	if reply == nil {
		t.Fatalf("query %s to %s: no reply", name, server)
	}
	return reply
}

func answers(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

func isRefused(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "reset"))
}

func guestUDP(r *rig, to *tcpip.FullAddress) (*gonet.UDPConn, error) {
	return gonet.DialUDP(r.guest, nil, to, ipv4.ProtocolNumber)
}
