package netstack

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestFlowLimit(t *testing.T) {
	lim := testLimits()
	lim.Flows = 4
	lim.FirstFlightWait = 5 * time.Second
	r := newRig(t, basePolicy(), baseResolver(), lim)
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Silent clients hold their flows while the host waits for a first
	// flight; past the bound new SYNs are reset.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for i := 0; i < 12; i++ {
		c, err := r.dial(ctx, "203.0.113.10:443")
		if err != nil {
			if !isRefused(err) {
				t.Fatalf("dial %d: %v", i, err)
			}
			refused++
			continue
		}
		held = append(held, c)
	}
	if len(held) != lim.Flows || refused != 12-lim.Flows {
		t.Fatalf("%d connections held, %d refused; want %d held", len(held), refused, lim.Flows)
	}
	// The counter counts SYNs: a guest that retransmits a SYN before its
	// reset arrives is refused again, so at least one per connection.
	if st := r.host.Stats(); st.FlowsOverLimit < int64(refused) || st.OpenFlows != lim.Flows || st.PeakFlows != lim.Flows || st.FlowLimit != lim.Flows {
		t.Errorf("stats %+v, %d connections refused", st, refused)
	}
	// Every SYN reset at the bound is an attempt like any other: one
	// event each, with its destination.
	deadline := time.Now().Add(10 * time.Second)
	for {
		atLimit := r.ev.count(func(e ConnEvent) bool {
			return e.Rule == RuleFlowLimit && !e.Allowed && e.Addr == netip.MustParseAddrPort("203.0.113.10:443")
		})
		over := r.host.Stats().FlowsOverLimit
		if int64(atLimit) == over && atLimit >= refused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d flow-limit events for %d SYNs reset at the bound (%d connections refused)", atLimit, over, refused)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Once the held flows end, new ones get through again.
	for _, c := range held {
		c.Close()
	}
	held = nil
	deadline = time.Now().Add(10 * time.Second)
	for r.host.Stats().OpenFlows > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if st := r.host.Stats(); st.OpenFlows != 0 || st.PeakFlows != lim.Flows {
		t.Fatalf("%d flows still open after the guest closed them all (the most at once: %d)", st.OpenFlows, st.PeakFlows)
	}
}

// heldResolver answers nothing until release is closed.
type heldResolver struct{ release chan struct{} }

func (h heldResolver) LookupNetIP(ctx context.Context, _, _ string) ([]netip.Addr, error) {
	select {
	case <-h.release:
		return []netip.Addr{allowedIP}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestLookupLimitDropsAreRecorded: queries past the lookup bound are
// dropped unanswered, and each is an event (not only a counter), though
// the packet path that drops them never waits for the recorder.
func TestLookupLimitDropsAreRecorded(t *testing.T) {
	lim := testLimits()
	lim.Lookups = 2
	held := heldResolver{release: make(chan struct{})}
	r := newRig(t, basePolicy(), held, lim)
	defer close(held.release)
	// A fixed answer needs no lookup: it settles ARP. Its flow keeps its
	// slot until the socket is idle.
	answers(r.query(t, "192.168.127.1", "private.example", dns.TypeA))
	for deadline := time.Now().Add(10 * time.Second); len(r.host.dns) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first query's flow never ended")
		}
	}
	m := new(dns.Msg)
	m.SetQuestion("allowed.example.", dns.TypeA)
	query, _ := m.Pack()
	const sent = 10
	for range sent {
		// A socket each: a flow each, so each query is decided apart.
		to := fullAddr(netip.MustParseAddrPort("192.168.127.1:53"))
		c, err := guestUDP(r, &to)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(query); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		dropped := r.ev.countDNS(func(e DNSEvent) bool { return e.Rule == RuleLookupLimit && !e.Allowed && e.RCode == RCodeDropped })
		over := r.host.Stats().LookupsOverLimit
		if over == sent-int64(lim.Lookups) && dropped == int(over) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queries sent with %d held: %d dropped at the bound, %d recorded", sent, lim.Lookups, over, dropped)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDNSFloodIsBounded(t *testing.T) {
	lim := testLimits()
	lim.Pins = 100
	r := newRig(t, basePolicy(), fakeResolver{}, lim)
	pol := r.pol
	// Names the guest resolves past the pin bound evict the oldest.
	for i := 0; i < 300; i++ {
		name := "flood" + itoa(i) + ".example"
		pol.allow[name] = true
		pol.fixed[name] = allowedIP
		r.query(t, "192.168.127.1", name, dns.TypeA)
	}
	if st := r.host.Stats(); st.Pins > lim.Pins {
		t.Errorf("%d pins held; the bound is %d", st.Pins, lim.Pins)
	}
	if r.host.pins.has(allowedIP, "flood0.example") || !r.host.pins.has(allowedIP, "flood299.example") {
		t.Error("eviction did not drop the oldest pin first")
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}

// TestHostileFrames sends frames a compromised hypervisor or guest could:
// shorter than an Ethernet header, and larger than the link. They are
// dropped and counted; the link keeps working.
func TestHostileFrames(t *testing.T) {
	f := newFrameFilter(nil, 1500)
	in, out := net.Pipe()
	f.Conn = out
	go func() {
		frame := func(size int, src [6]byte) []byte {
			b := binary.BigEndian.AppendUint32(nil, uint32(size))
			body := make([]byte, size)
			if size >= 12 {
				copy(body[6:12], src[:])
			}
			return append(b, body...)
		}
		in.Write(frame(0, guestMAC))
		in.Write(frame(5, guestMAC))
		in.Write(frame(1500+frameSlack+1, guestMAC))
		// Made-up source addresses would each stay in the switch's table.
		for i := range 1000 {
			in.Write(frame(64, [6]byte{0x02, 0, 0, 0, byte(i >> 8), byte(i)}))
		}
		in.Write(frame(64, guestMAC))
		in.Close()
	}()
	buf := make([]byte, 128)
	n, err := io.ReadFull(f, buf[:4+64])
	if err != nil || n != 4+64 || binary.BigEndian.Uint32(buf) != 64 {
		t.Fatalf("read %d bytes (%x), %v; want the 64-byte frame", n, buf[:min(n, 8)], err)
	}
	if d := f.dropped.Load(); d != 1003 {
		t.Errorf("%d frames dropped, want 1003", d)
	}
	if _, err := f.Read(buf); err == nil {
		t.Error("read past the end of the stream")
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	r := newRigNoCleanup(t, basePolicy(), baseResolver(), DefaultLimits)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	c, err := r.dial(ctx, "203.0.113.10:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r.shutdown(t)
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
