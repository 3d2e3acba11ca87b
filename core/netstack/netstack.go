// Package netstack is the guest's network, owned by the per-VM process: a
// user-space TCP/IP stack (gVisor's netstack, with gvisor-tap-vsock's link
// endpoint and switch) on the other end of the VM's NIC. Nothing the guest
// sends leaves the host except through it, and it decides every connection
// by name before a byte goes out:
//
//   - DNS: every query to any address on port 53 (UDP or TCP) is answered
//     here. A name the policy blocks gets NXDOMAIN; an allowed name is
//     resolved on the host and answered with its IPv4 addresses only
//     (AAAA, HTTPS, SVCB: no data, so clients neither try IPv6 nor learn
//     ECH keys), and each address given is pinned to that name. An
//     upstream failure is SERVFAIL, never NXDOMAIN. Addresses that are not
//     public (loopback, private, link-local, CGNAT, metadata) are never
//     handed out unless the name may be private, which defeats DNS
//     rebinding.
//   - TCP: a SYN to a port the policy does not allow, or to an address this
//     VM's DNS never gave out (and the policy does not allow by IP), is
//     reset at once. Otherwise the guest's handshake completes here and its
//     first flight is read: the TLS ClientHello's SNI or the HTTP Host
//     names the destination, which must be allowed and pinned to that
//     address (an SNI naming another host on a shared IP is refused). The
//     host then dials the pinned address itself, never resolving again,
//     and splices the two connections. A client that does not speak first
//     is refused after a short deadline, unless its address is allowed by
//     IP and port. TLS is not terminated; every other stream spliced out
//     (plain HTTP, one allowed by address) is searched for credential
//     placeholders as it passes, and cut before one goes out.
//   - Everything else (UDP other than DNS, ICMP, IPv6) goes nowhere.
//
// Every connection and every query is reported to the Recorder, those
// refused at the bounds below included. The guest can cost the host only
// bounded resources: concurrent flows, handshakes in progress, DNS lookups
// in flight, pins and the bytes read before deciding are all capped, and a
// malformed frame is dropped and counted.
package netstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containers/gvisor-tap-vsock/pkg/tap"
	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/vmm"
)

// Policy is what the stack asks of the network policy (netpolicy.Policy).
type Policy interface {
	Name(name string) netpolicy.Verdict
	Port(port uint16) netpolicy.Verdict
	Address(addr netip.AddrPort) netpolicy.Verdict
	PrivateAllowed(name string) bool
	FixedHost(name string) (netip.Addr, bool)
	// Credential is the credential for a name; Credentials are all of
	// them (their placeholders are looked for where they may not go).
	Credential(name string) (netpolicy.CredentialRule, bool)
	Credentials() []netpolicy.CredentialRule
}

// Resolver looks names up on the host (net.Resolver is one).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer connects to an address on the host's network (net.Dialer is one).
// The stack passes it only addresses it has checked.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Recorder receives every decision; its methods may block (a ledger write)
// and are called from the flow's own goroutine.
type Recorder interface {
	Conn(ConnEvent)
	DNS(DNSEvent)
	Model(ModelEvent)
}

// Limits bound what one guest can make the host hold.
type Limits struct {
	// Flows is the most TCP connections open or being decided at once;
	// past it a SYN is reset.
	Flows int
	// Handshakes is the most guest handshakes in progress (gVisor's
	// forwarder drops SYNs past it, and the guest retries).
	Handshakes int
	// Lookups is the most DNS queries being answered at once; past it a
	// query is dropped (the guest's resolver retries).
	Lookups int
	// Pins is the most (name, address) pairs remembered.
	Pins int
	// FirstFlight is the most bytes read from the guest before deciding,
	// and FirstFlightWait how long a client has to send them.
	FirstFlight     int
	FirstFlightWait time.Duration
	// DialTimeout bounds connecting to the destination.
	DialTimeout time.Duration
	// LookupTimeout bounds resolving a name on the host.
	LookupTimeout time.Duration
	// Inbound is the most connections into the guest (DialGuest: the
	// host's published ports) open at once; past it a dial is refused.
	// They have their own bound: the guest's flows cannot starve them,
	// nor they the guest's.
	Inbound int
}

// DefaultLimits are the bounds a VM gets.
var DefaultLimits = Limits{
	Flows:           1024,
	Handshakes:      256,
	Lookups:         64,
	Pins:            8192,
	FirstFlight:     16 << 10,
	FirstFlightWait: 5 * time.Second,
	DialTimeout:     15 * time.Second,
	LookupTimeout:   10 * time.Second,
	Inbound:         1024,
}

// DefaultMTU is the link MTU when the config names none: over a stream to
// the hypervisor there is no checksum offload or segmentation offload, so
// the frame size sets the throughput.
const DefaultMTU = 65520

// Config configures a Stack.
type Config struct {
	// Policy returns the policy in force; it is asked again for every
	// connection and every query, so a reload applies to the next one.
	Policy   func() Policy
	Resolver Resolver
	Dialer   Dialer
	Recorder Recorder
	Logger   *slog.Logger
	MTU      int
	Limits   Limits
	// CA terminates the guest's TLS to names with credentials; without
	// it, connections to such names are refused.
	CA CA
	// Attribute asks who in the guest owns a connection (its source port
	// and its destination as the guest addressed it), when AttributeWhen
	// says so (while a traced command runs): the owner is found before the
	// guest's handshake completes, when its process is still blocked in
	// connect(), so even one that lives for a single request is named.
	// Otherwise nobody is asked: the question costs the guest a look
	// through its processes' descriptors.
	Attribute     func(ctx context.Context, guestPort uint16, dst netip.AddrPort) (Owner, error)
	AttributeWhen func() bool
}

// Owner is the guest process a connection belongs to, by the guest's word.
type Owner struct {
	PID     int
	Process string
	TraceID string
}

// Attribution bounds: lookups in flight at once (past it a connection
// goes unattributed) and how long one may take.
const (
	maxAttributions = 8
	attributionWait = 2 * time.Second
)

// Stack is one VM's network.
type Stack struct {
	cfg    Config
	log    *slog.Logger
	stack  *stack.Stack
	link   *tap.LinkEndpoint
	sw     *tap.Switch
	pins   *pins
	flows  chan struct{} // one token per flow
	attrib chan struct{} // one token per attribution in flight
	dns    chan struct{} // one token per query being answered
	inward chan struct{} // one token per connection DialGuest made
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// serving counts running Serve calls: Close waits for them before it
	// closes the stack, because the switch delivers frames into the link
	// and a closed stack leaves the link without a dispatcher.
	serving sync.WaitGroup

	interceptOnce sync.Once
	intercepting  *interceptor // the credential path, once used
	interceptWG   sync.WaitGroup

	mu      sync.Mutex
	closed  bool // Close began: no new flow or query goroutine
	filters []*frameFilter
	// standIn maps the addresses DNS gave the guest in place of ones it
	// cannot reach as they are (see standIns) to the real ones, and real
	// back to stand-in.
	standIn map[netip.Addr]netip.Addr
	realTo  map[netip.Addr]netip.Addr

	overFlows   atomic.Int64 // SYNs reset because Flows was reached
	peakFlows   atomic.Int64 // the most flows open at once so far
	overLookups atomic.Int64 // queries dropped because Lookups was reached
	overInbound atomic.Int64 // DialGuest calls refused because Inbound was reached
	// unrecordedDrops are the queries dropped at the lookup bound not yet
	// given to the recorder; dropNoted wakes recordDrops for them.
	unrecordedDrops atomic.Int64
	dropNoted       chan struct{}
	lastWarn        atomic.Int64 // unix nanos of the last over-limit warning
}

// Stats are counters for diagnosis and tests.
type Stats struct {
	FlowsOverLimit   int64
	LookupsOverLimit int64
	FramesDropped    int64
	InboundOverLimit int64
	Pins             int
	OpenFlows        int
	PeakFlows        int // the most flows open at once since the stack started
	FlowLimit        int
	OpenInbound      int
}

var (
	gatewayAddr = netip.MustParseAddr(guestwire.NetGatewayIP)
	guestAddr   = netip.MustParseAddr(guestwire.NetGuestIP)
)

// standInPrefix holds the addresses given to the guest in place of
// addresses that would not leave it: the benchmarking range, which no
// public name resolves to.
var standInPrefix = netip.MustParsePrefix("198.18.0.0/16")

// maxStandIns bounds the stand-in table (the prefix holds 65534).
const maxStandIns = 4096

// standIns replaces each address the guest would keep to itself (its
// loopback, its own subnet, the unspecified address) with a stand-in it
// routes to the gateway; a connection to the stand-in is dialled to the
// real address. Only names allowed to be private get such answers.
func (s *Stack) standIns(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	guestNet := netip.PrefixFrom(gatewayAddr, guestwire.NetPrefixLen).Masked()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range addrs {
		if standInPrefix.Contains(a) {
			// A real answer in the stand-ins' range would be taken for
			// a stand-in (and dialled to another address): never given.
			continue
		}
		if !a.IsLoopback() && !guestNet.Contains(a) && !a.IsUnspecified() {
			out = append(out, a)
			continue
		}
		if st, ok := s.realTo[a]; ok {
			out = append(out, st)
			continue
		}
		if len(s.standIn) >= maxStandIns {
			continue
		}
		if s.standIn == nil {
			s.standIn, s.realTo = map[netip.Addr]netip.Addr{}, map[netip.Addr]netip.Addr{}
		}
		// The first free one: stand-ins restored after a suspend
		// (RestorePins) may leave gaps.
		st := standInPrefix.Addr().Next()
		for _, used := s.standIn[st]; used; _, used = s.standIn[st] {
			st = st.Next()
		}
		s.standIn[st], s.realTo[a] = a, st
		out = append(out, st)
	}
	return out
}

// realAddr is the address to dial for a destination the guest named.
func (s *Stack) realAddr(dst netip.Addr) netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if real, ok := s.standIn[dst]; ok {
		return real
	}
	return dst
}

// flowBuffer bounds each direction of a flow's buffering in the stack.
const flowBuffer = 256 << 10

func ptr[T any](v T) *T { return &v }

// nicID is the stack's one NIC, toward the guest.
const nicID tcpip.NICID = 1

// New builds the stack; Serve attaches the VM's NIC to it.
func New(cfg Config) (*Stack, error) {
	if cfg.Policy == nil || cfg.Resolver == nil || cfg.Dialer == nil || cfg.Recorder == nil {
		return nil, errors.New("netstack: Policy, Resolver, Dialer and Recorder are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < 1280 || cfg.MTU > 65520 {
		return nil, fmt.Errorf("netstack: MTU %d: want 1280..65520", cfg.MTU)
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	l := cfg.Limits
	if l.Flows < 1 || l.Handshakes < 1 || l.Lookups < 1 || l.Pins < 1 || l.Inbound < 1 || l.FirstFlight < 512 ||
		l.FirstFlightWait <= 0 || l.DialTimeout <= 0 || l.LookupTimeout <= 0 {
		return nil, fmt.Errorf("netstack: limits %+v: every bound must be set", l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Stack{
		cfg: cfg, log: cfg.Logger.With("component", "netstack"),
		pins:  newPins(l.Pins),
		flows: make(chan struct{}, l.Flows), dns: make(chan struct{}, l.Lookups),
		attrib: make(chan struct{}, maxAttributions), inward: make(chan struct{}, l.Inbound),
		dropNoted: make(chan struct{}, 1),
		ctx:       ctx, cancel: cancel,
	}
	if err := s.build(); err != nil {
		cancel()
		return nil, err
	}
	s.wg.Add(1)
	go s.recordDrops()
	return s, nil
}

func (s *Stack) build() error {
	link, err := tap.NewLinkEndpoint(false, uint32(s.cfg.MTU), guestwire.NetGatewayMAC, guestwire.NetGatewayIP, nil)
	if err != nil {
		return fmt.Errorf("netstack: link endpoint: %w", err)
	}
	sw := tap.NewSwitch(false)
	link.Connect(sw)
	sw.Connect(link)
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	fail := func(what string, e tcpip.Error) error {
		st.Close()
		return fmt.Errorf("netstack: %s: %s", what, e)
	}
	if e := st.CreateNIC(nicID, link); e != nil {
		return fail("creating the NIC", e)
	}
	prefix := netip.PrefixFrom(gatewayAddr, guestwire.NetPrefixLen)
	if e := st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddrFromSlice(gatewayAddr.AsSlice()).WithPrefix(),
	}, stack.AddressProperties{}); e != nil {
		return fail("adding the gateway address", e)
	}
	// The guest may address anything: the NIC takes every packet
	// (promiscuous) and answers from whatever address it was sent to
	// (spoofing), so the forwarders below see each flow's destination.
	if e := st.SetPromiscuousMode(nicID, true); e != nil {
		return fail("promiscuous mode", e)
	}
	if e := st.SetSpoofing(nicID, true); e != nil {
		return fail("spoofing", e)
	}
	subnet, e2 := tcpip.NewSubnet(tcpip.AddrFromSlice(prefix.Masked().Addr().AsSlice()), tcpip.MaskFromBytes(net.CIDRMask(guestwire.NetPrefixLen, 32)))
	if e2 != nil {
		st.Close()
		return fmt.Errorf("netstack: subnet: %w", e2)
	}
	st.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: nicID}})
	// A flow's buffers in the stack are bounded (gVisor's defaults let
	// each grow to 4 MiB a side), and a connection the guest stops
	// acknowledging is given up in seconds rather than minutes, so
	// neither the bytes nor the endpoints a guest can leave behind
	// outgrow the flow bound.
	for _, opt := range []tcpip.SettableTransportProtocolOption{
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: flowBuffer, Max: flowBuffer},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: flowBuffer, Max: flowBuffer},
		ptr(tcpip.TCPLingerTimeoutOption(10 * time.Second)),
		ptr(tcpip.TCPTimeWaitTimeoutOption(5 * time.Second)),
		ptr(tcpip.TCPMaxRetriesOption(8)),
	} {
		if e := st.SetTransportProtocolOption(tcp.ProtocolNumber, opt); e != nil {
			return fail(fmt.Sprintf("TCP option %T", opt), e)
		}
	}
	tcpFwd := tcp.NewForwarder(st, flowBuffer, s.cfg.Limits.Handshakes, s.handleTCP)
	st.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(st, s.handleUDP)
	st.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	s.stack, s.link, s.sw = st, link, sw
	return nil
}

// Serve carries the NIC's frames between conn (the hypervisor's end of the
// link) and the stack until conn fails or ctx ends; conn is closed then.
func (s *Stack) Serve(ctx context.Context, conn net.Conn, framing vmm.Framing) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return errors.New("netstack: serve on a closed stack")
	}
	s.serving.Add(1)
	s.mu.Unlock()
	defer s.serving.Done()
	proto := types.QemuProtocol
	switch framing {
	case vmm.FramingStream4BE:
		f := newFrameFilter(conn, s.cfg.MTU)
		s.mu.Lock()
		s.filters = append(s.filters, f)
		s.mu.Unlock()
		conn = f
	case vmm.FramingDatagram:
		proto = types.VfkitProtocol
		f := &frameFilter{max: s.cfg.MTU + frameSlack}
		s.mu.Lock()
		s.filters = append(s.filters, f)
		s.mu.Unlock()
		conn = datagramFilter{Conn: conn, max: f.max, dropped: &f.dropped}
	default:
		conn.Close()
		return fmt.Errorf("netstack: unknown framing %v", framing)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		conn.Close()
	}()
	err := s.sw.Accept(ctx, conn, proto)
	if ctx.Err() != nil || s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Close stops every flow and the stack, and waits for them.
func (s *Stack) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.serving.Wait()
	s.stack.Close()
	s.wg.Wait()
	// No flow is left to start the credential path now.
	s.interceptOnce.Do(func() {})
	if s.intercepting != nil {
		s.intercepting.close()
	}
	s.interceptWG.Wait()
	s.stack.Wait()
	// Queries dropped while the stack stopped.
	s.recordDropped()
}

// Stats reports the stack's counters.
func (s *Stack) Stats() Stats {
	st := Stats{
		FlowsOverLimit:   s.overFlows.Load(),
		LookupsOverLimit: s.overLookups.Load(),
		OpenFlows:        len(s.flows),
		PeakFlows:        int(s.peakFlows.Load()),
		FlowLimit:        cap(s.flows),
		InboundOverLimit: s.overInbound.Load(),
		OpenInbound:      len(s.inward),
	}
	s.mu.Lock()
	for _, f := range s.filters {
		st.FramesDropped += f.dropped.Load()
	}
	s.mu.Unlock()
	s.pins.mu.Lock()
	st.Pins = s.pins.n
	s.pins.mu.Unlock()
	return st
}

// notePeakFlows raises PeakFlows to the flows open now, once a flow
// holds its token.
func (s *Stack) notePeakFlows() {
	n := int64(len(s.flows))
	for {
		peak := s.peakFlows.Load()
		if n <= peak || s.peakFlows.CompareAndSwap(peak, n) {
			return
		}
	}
}

// overLimit logs that a bound was reached, at most once every 10 s: a
// guest that floods gets refusals, not a flood of log lines.
func (s *Stack) overLimit(what string, counter *atomic.Int64) {
	n := counter.Add(1)
	now := time.Now().UnixNano()
	last := s.lastWarn.Load()
	if now-last < int64(10*time.Second) || !s.lastWarn.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn("the guest reached a network bound; refusing past it", "bound", what, "refused_so_far", n)
}

func (s *Stack) policy() Policy { return s.cfg.Policy() }

// owner asks who in the guest made a connection (its source port, its
// destination as the guest addressed it), waiting at most attributionWait;
// the zero Owner when nobody is asked, too many questions are in flight, or
// none came.
func (s *Stack) owner(guestPort uint16, dst netip.AddrPort) Owner {
	if s.cfg.Attribute == nil || s.cfg.AttributeWhen == nil || !s.cfg.AttributeWhen() {
		return Owner{}
	}
	select {
	case s.attrib <- struct{}{}:
		defer func() { <-s.attrib }()
	default:
		return Owner{}
	}
	ctx, cancel := context.WithTimeout(s.ctx, attributionWait)
	defer cancel()
	o, err := s.cfg.Attribute(ctx, guestPort, dst)
	if err != nil {
		return Owner{}
	}
	return o
}

// track counts a goroutine Close must wait for; false once Close began.
func (s *Stack) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	return true
}

func addrOf(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}
