package netstack

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

var (
	allowedIP = netip.MustParseAddr("203.0.113.10")
	otherIP   = netip.MustParseAddr("203.0.113.20")
)

func basePolicy() *testPolicy {
	return &testPolicy{
		allow:   map[string]bool{"allowed.example": true, "other.example": true, "private.example": true, "sneaky.example": true, "flaky.example": true},
		ports:   map[uint16]bool{80: true, 443: true},
		private: map[string]bool{"private.example": true},
		fixed:   map[string]netip.Addr{"private.example": netip.MustParseAddr("127.0.0.1")},
		byIP:    map[netip.AddrPort]bool{},
	}
}

func baseResolver() fakeResolver {
	return fakeResolver{
		"allowed.example": {allowedIP, netip.MustParseAddr("2001:db8::1")},
		"other.example":   {otherIP},
		"sneaky.example":  {netip.MustParseAddr("10.1.2.3")},
		"flaky.example":   nil,
		"blocked.example": {netip.MustParseAddr("203.0.113.66")},
	}
}

func testLimits() Limits {
	l := DefaultLimits
	l.FirstFlightWait = 300 * time.Millisecond
	return l
}

func TestDNS(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	tests := []struct {
		name, server string
		qtype        uint16
		rcode        int
		want         []string
	}{
		{"allowed.example", "192.168.127.1", dns.TypeA, dns.RcodeSuccess, []string{"203.0.113.10"}},
		{"ALLOWED.example.", "192.168.127.1", dns.TypeA, dns.RcodeSuccess, []string{"203.0.113.10"}},
		// A resolver hard-coded in the guest is answered here too.
		{"other.example", "8.8.8.8", dns.TypeA, dns.RcodeSuccess, []string{"203.0.113.20"}},
		{"blocked.example", "192.168.127.1", dns.TypeA, dns.RcodeNameError, nil},
		{"allowed.example", "192.168.127.1", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"allowed.example", "192.168.127.1", dns.TypeHTTPS, dns.RcodeSuccess, nil},
		{"flaky.example", "192.168.127.1", dns.TypeA, dns.RcodeServerFailure, nil},
		// Rebinding: a public name answered with a private address.
		{"sneaky.example", "192.168.127.1", dns.TypeA, dns.RcodeSuccess, nil},
		// Loopback would stay in the guest: it gets a stand-in address.
		{"private.example", "192.168.127.1", dns.TypeA, dns.RcodeSuccess, []string{"198.18.0.1"}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%s@%s", tc.name, dns.TypeToString[tc.qtype], tc.server), func(t *testing.T) {
			m := r.query(t, tc.server, tc.name, tc.qtype)
			if m.Rcode != tc.rcode {
				t.Errorf("rcode %s, want %s", dns.RcodeToString[m.Rcode], dns.RcodeToString[tc.rcode])
			}
			if got := answers(m); !slices.Equal(got, tc.want) {
				t.Errorf("answers %v, want %v", got, tc.want)
			}
		})
	}
	r.ev.mu.Lock()
	defer r.ev.mu.Unlock()
	byName := map[string]DNSEvent{}
	for _, ev := range r.ev.dns {
		byName[ev.Name+"/"+ev.Type] = ev
	}
	if ev := byName["blocked.example/A"]; ev.Allowed || ev.RCode != "NXDOMAIN" || ev.Reason == "" {
		t.Errorf("blocked query recorded as %+v", ev)
	}
	if ev := byName["sneaky.example/A"]; ev.Allowed || ev.Rule != RulePrivate {
		t.Errorf("rebinding answer recorded as %+v", ev)
	}
	if ev := byName["other.example/A"]; !ev.Allowed || ev.Server != netip.MustParseAddr("8.8.8.8") || len(ev.Answers) != 1 {
		t.Errorf("query to 8.8.8.8 recorded as %+v", ev)
	}
	if r.host.pins.has(netip.MustParseAddr("10.1.2.3"), "sneaky.example") {
		t.Error("a refused private answer was pinned")
	}
}

func TestDNSOverTCP(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := r.dial(ctx, "9.9.9.9:53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, name := range []string{"allowed.example", "blocked.example"} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		out, _ := m.Pack()
		framed := binary.BigEndian.AppendUint16(nil, uint16(len(out)))
		if _, err := c.Write(append(framed, out...)); err != nil {
			t.Fatal(err)
		}
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		reply := new(dns.Msg)
		if err := reply.Unpack(buf); err != nil {
			t.Fatal(err)
		}
		want := dns.RcodeSuccess
		if name == "blocked.example" {
			want = dns.RcodeNameError
		}
		if reply.Rcode != want {
			t.Errorf("%s over TCP: rcode %s", name, dns.RcodeToString[reply.Rcode])
		}
	}
}

// servers starts an HTTP and an HTTPS server on loopback and routes the
// pinned addresses to them.
func (r *rig) servers(t *testing.T) (httpSrv, tlsSrv *httptest.Server) {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("X-Host", req.Host)
		fmt.Fprintf(w, "hello %s %s", req.Host, req.URL.Path)
	})
	httpSrv, tlsSrv = httptest.NewServer(h), httptest.NewTLSServer(h)
	t.Cleanup(httpSrv.Close)
	t.Cleanup(tlsSrv.Close)
	for _, ip := range []netip.Addr{allowedIP, otherIP} {
		r.dialer.routes[netip.AddrPortFrom(ip, 80)] = httpSrv.Listener.Addr().String()
		r.dialer.routes[netip.AddrPortFrom(ip, 443)] = tlsSrv.Listener.Addr().String()
	}
	return httpSrv, tlsSrv
}

// guestHTTP makes one request from the guest to addr with the given Host
// (and SNI, over TLS).
func (r *rig) guestHTTP(ctx context.Context, addr, host string, overTLS bool) (*http.Response, string, error) {
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dial(ctx, addr) },
		TLSClientConfig:   &tls.Config{ServerName: host, InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	scheme := "http"
	if overTLS {
		scheme = "https"
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", scheme+"://"+host+"/path", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

func TestConnections(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	r.servers(t)
	// The guest resolves first, as any client does: that pins the names.
	for _, n := range []string{"allowed.example", "other.example"} {
		if got := answers(r.query(t, "192.168.127.1", n, dns.TypeA)); len(got) != 1 {
			t.Fatalf("%s: %v", n, got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("http by Host", func(t *testing.T) {
		resp, body, err := r.guestHTTP(ctx, "203.0.113.10:80", "allowed.example", false)
		if err != nil || resp.StatusCode != 200 || body != "hello allowed.example /path" {
			t.Fatalf("resp %v body %q err %v", resp, body, err)
		}
		ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Kind == KindHTTP && e.Name == "allowed.example" })
		if !ev.Allowed || ev.Status != 200 || ev.Method != "GET" || ev.Path != "/path" || ev.BytesReceived == 0 || ev.BytesSent == 0 {
			t.Errorf("event %+v", ev)
		}
	})
	t.Run("https by SNI", func(t *testing.T) {
		resp, body, err := r.guestHTTP(ctx, "203.0.113.10:443", "allowed.example", true)
		if err != nil || resp.StatusCode != 200 || body != "hello allowed.example /path" {
			t.Fatalf("resp %v body %q err %v", resp, body, err)
		}
		ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Kind == KindTLS && e.Name == "allowed.example" })
		if !ev.Allowed || ev.BytesReceived == 0 {
			t.Errorf("event %+v", ev)
		}
	})
	t.Run("SNI of another pinned name onto this IP", func(t *testing.T) {
		before := len(r.dialer.dialed())
		_, _, err := r.guestHTTP(ctx, "203.0.113.10:443", "other.example", true)
		if err == nil {
			t.Fatal("a spoofed SNI got through")
		}
		ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "other.example" && e.Rule == RuleNameMismatch })
		if ev.Allowed || !strings.Contains(ev.Reason, "allowed.example") {
			t.Errorf("event %+v", ev)
		}
		if len(r.dialer.dialed()) != before {
			t.Errorf("the host dialled for a refused connection: %v", r.dialer.dialed())
		}
	})
	t.Run("blocked Host on a pinned IP", func(t *testing.T) {
		_, _, err := r.guestHTTP(ctx, "203.0.113.10:80", "blocked.example", false)
		if err == nil {
			t.Fatal("a blocked Host got through")
		}
		r.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "blocked.example" && !e.Allowed && e.Rule == "net.default" })
	})
	t.Run("address never resolved is reset at SYN", func(t *testing.T) {
		before := len(r.dialer.dialed())
		_, err := r.dial(ctx, "203.0.113.99:443")
		if !isRefused(err) {
			t.Fatalf("dial to an unresolved IP: %v", err)
		}
		r.ev.waitConn(t, func(e ConnEvent) bool {
			return e.Rule == RuleNotResolved && e.Addr.Addr() == netip.MustParseAddr("203.0.113.99")
		})
		if len(r.dialer.dialed()) != before {
			t.Errorf("the host dialled: %v", r.dialer.dialed())
		}
	})
	t.Run("metadata address is reset at SYN", func(t *testing.T) {
		_, err := r.dial(ctx, "169.254.169.254:80")
		if !isRefused(err) {
			t.Fatalf("dial to the metadata address: %v", err)
		}
	})
	t.Run("port not allowed is reset at SYN", func(t *testing.T) {
		_, err := r.dial(ctx, "203.0.113.10:22")
		if !isRefused(err) {
			t.Fatalf("dial to port 22: %v", err)
		}
		r.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == "net.ports" && e.Addr.Port() == 22 })
	})
	t.Run("client that does not speak first", func(t *testing.T) {
		c, err := r.dial(ctx, "203.0.113.10:443")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isDeadlineErr(err) {
			t.Fatalf("a silent client was not cut off: %v", err)
		}
		ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleNoName })
		if !strings.Contains(ev.Reason, "in time") {
			t.Errorf("event %+v", ev)
		}
	})
	t.Run("garbage first flight", func(t *testing.T) {
		c, err := r.dial(ctx, "203.0.113.10:80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("\x00\x01\x02 not http\r\n\r\n"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || isDeadlineErr(err) {
			t.Fatalf("garbage was not refused: %v", err)
		}
	})
	t.Run("UDP other than DNS goes nowhere", func(t *testing.T) {
		to := fullAddr(netip.MustParseAddrPort("203.0.113.10:123"))
		c, err := guestUDP(r, &to)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("ntp?"))
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Fatalf("UDP/123 got a %d-byte answer", n)
		}
	})
}

func isDeadlineErr(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestHostLoopbackThroughStandIn: a fixed answer on the host's loopback
// reaches the host's loopback, for a name allowed to be private, through
// the stand-in address the guest was given.
func TestHostLoopbackThroughStandIn(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { fmt.Fprint(w, "host loopback") }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	r.pol.ports[port] = true
	r.pol.fixed["private.example"] = netip.MustParseAddr("127.0.0.1")
	r.dialer.routes[netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)] = srv.Listener.Addr().String()
	got := answers(r.query(t, "192.168.127.1", "private.example", dns.TypeA))
	if len(got) != 1 || !standInPrefix.Contains(netip.MustParseAddr(got[0])) {
		t.Fatalf("answer %v: want one stand-in address", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, body, err := r.guestHTTP(ctx, netip.AddrPortFrom(netip.MustParseAddr(got[0]), port).String(), "private.example", false)
	if err != nil || body != "host loopback" {
		t.Fatalf("body %q, %v", body, err)
	}
	ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "private.example" })
	if !ev.Allowed || ev.Addr.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("event %+v: want the real address dialled", ev)
	}
	// A reload moves the name's fixed answer: the address given before is
	// not the name's any more.
	r.pol.fixed["private.example"] = netip.MustParseAddr("127.0.0.2")
	if _, _, err := r.guestHTTP(ctx, netip.AddrPortFrom(netip.MustParseAddr(got[0]), port).String(), "private.example", false); err == nil {
		t.Fatal("the old fixed answer still reaches the name after a reload moved it")
	}
	r.ev.waitConn(t, func(e ConnEvent) bool {
		return e.Name == "private.example" && e.Rule == RuleNameMismatch && strings.Contains(e.Reason, "fixed answer is now 127.0.0.2")
	})
	r.pol.fixed["private.example"] = netip.MustParseAddr("127.0.0.1")
	// The same loopback for a name not allowed to be private: no answer.
	r.pol.fixed["allowed.example"] = netip.MustParseAddr("127.0.0.1")
	if got := answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA)); len(got) != 0 {
		t.Errorf("loopback handed to a public name: %v", got)
	}
}

// TestRemovedHostsEntry: a reload that removes a name's hosts entry, the
// name still allowed and allowed to be private, takes the entry's address
// from it: no lookup ever gave that address for the name. The flag that
// says so survives a suspend (Pins, RestorePins).
func TestRemovedHostsEntry(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { fmt.Fprint(w, "host loopback") }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	loopback := netip.MustParseAddr("127.0.0.1")
	r.pol.ports[port] = true
	r.pol.fixed["private.example"] = loopback
	r.dialer.routes[netip.AddrPortFrom(loopback, port)] = srv.Listener.Addr().String()
	got := answers(r.query(t, "192.168.127.1", "private.example", dns.TypeA))
	if len(got) != 1 {
		t.Fatalf("answer %v", got)
	}
	standIn := netip.AddrPortFrom(netip.MustParseAddr(got[0]), port)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, body, err := r.guestHTTP(ctx, standIn.String(), "private.example", false); err != nil || body != "host loopback" {
		t.Fatalf("before the reload: %q, %v", body, err)
	}
	saved := r.host.Pins()
	if !slices.Contains(saved, Pin{Name: "private.example", Addr: standIn.Addr(), Real: loopback, Hosts: true}) {
		t.Fatalf("pins %+v: the hosts answer is not marked", saved)
	}

	delete(r.pol.fixed, "private.example")
	if !r.pol.PrivateAllowed("private.example") || !r.pol.Name("private.example").Allowed {
		t.Fatal("the test's reload must keep the name allowed and private")
	}
	dials := len(r.dialer.dialed())
	if _, body, err := r.guestHTTP(ctx, standIn.String(), "private.example", false); err == nil {
		t.Fatalf("the removed hosts entry's address still reaches the name: %q", body)
	}
	ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "private.example" && e.Rule == RuleNameMismatch })
	if ev.Allowed || !strings.Contains(ev.Reason, "hosts entry the policy no longer has") {
		t.Fatalf("event %+v", ev)
	}
	if d := r.dialer.dialed(); len(d) != dials {
		t.Fatalf("the host dialled %v for a refused connection", d[dials:])
	}

	// A stack resumed with the saved pins knows the same.
	resumed := fuzzStack(t)
	resumed.RestorePins(saved)
	if !resumed.pins.fromHosts(standIn.Addr(), "private.example") {
		t.Fatal("the restored pin forgot it came from a hosts entry")
	}
	// A lookup's pin is not one.
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	if r.host.pins.fromHosts(allowedIP, "allowed.example") {
		t.Fatal("a looked-up answer is marked as a hosts entry's")
	}
}

func TestAllowedByAddress(t *testing.T) {
	pol := basePolicy()
	pol.ports[5432] = true
	direct := netip.MustParseAddrPort("203.0.113.50:5432")
	pol.byIP[direct] = true
	r := newRig(t, pol, baseResolver(), testLimits())
	// A server that speaks first, as databases and SSH do.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("SERVER FIRST\n"))
			c.Close()
		}
	}()
	r.dialer.routes[direct] = ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := r.dial(ctx, direct.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "SERVER FIRST\n" {
		t.Fatalf("read %q, %v", line, err)
	}
	c.Close() // the connection is recorded once both directions end
	ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Addr == direct })
	if !ev.Allowed || ev.Kind != KindTCP {
		t.Errorf("event %+v", ev)
	}
}

func TestPolicyReloadAppliesToTheNextConnection(t *testing.T) {
	pol := basePolicy()
	r := newRig(t, pol, baseResolver(), testLimits())
	r.servers(t)
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, _, err := r.guestHTTP(ctx, "203.0.113.10:80", "allowed.example", false); err != nil {
		t.Fatal(err)
	}
	// The policy object is read per connection: close the door.
	delete(pol.allow, "allowed.example")
	if _, _, err := r.guestHTTP(ctx, "203.0.113.10:80", "allowed.example", false); err == nil {
		t.Fatal("a name no longer allowed still connects")
	}
	if m := r.query(t, "192.168.127.1", "allowed.example", dns.TypeA); m.Rcode != dns.RcodeNameError {
		t.Errorf("a name no longer allowed still resolves: %s", dns.RcodeToString[m.Rcode])
	}
}

// TestDNSQueriesOnOneSocket: resolvers send A and AAAA at once from one
// socket; both are answered at once, not the second after a retry.
func TestDNSQueriesOnOneSocket(t *testing.T) {
	r := newRig(t, basePolicy(), baseResolver(), testLimits())
	r.query(t, "192.168.127.1", "allowed.example", dns.TypeA) // ARP settled
	to := fullAddr(netip.MustParseAddrPort("192.168.127.1:53"))
	c, err := guestUDP(r, &to)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m := new(dns.Msg)
		m.SetQuestion("allowed.example.", qt)
		m.Id = uint16(100 + i)
		b, _ := m.Pack()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint16]bool{}
	// Neither query is sent again: without the fix the second answer
	// never comes, whatever the wait.
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(got) < 2 {
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("answers %v, then %v", got, err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			t.Fatal(err)
		}
		got[m.Id] = true
	}
}

// TestEvasions: what a hostile guest tries to get a name decided that is
// not the destination.
func TestEvasions(t *testing.T) {
	pol := basePolicy()
	pol.allow["203.0.113.10"] = true // allowed as a name by a careless default
	pol.allow["collide.example"] = true
	pol.private["collide.example"] = true
	pol.fixed["collide.example"] = netip.MustParseAddr("198.18.0.1")
	r := newRig(t, pol, baseResolver(), testLimits())
	r.servers(t)
	t.Run("an address asked as a name", func(t *testing.T) {
		m := r.query(t, "192.168.127.1", "203.0.113.10", dns.TypeA)
		if m.Rcode != dns.RcodeNameError || len(answers(m)) != 0 {
			t.Fatalf("rcode %s, answers %v", dns.RcodeToString[m.Rcode], answers(m))
		}
		if r.host.pins.has(allowedIP, "203.0.113.10") {
			t.Error("an address was pinned to itself")
		}
	})
	t.Run("a real answer in the stand-ins' range", func(t *testing.T) {
		// private.example takes stand-in 198.18.0.1 for the host's
		// loopback; collide.example's real 198.18.0.1 must not become a
		// way to it.
		answers(r.query(t, "192.168.127.1", "private.example", dns.TypeA))
		if got := answers(r.query(t, "192.168.127.1", "collide.example", dns.TypeA)); len(got) != 0 {
			t.Fatalf("collide.example answered %v", got)
		}
	})
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t.Run("HTTP in proxy form", func(t *testing.T) {
		c, err := r.dial(ctx, "203.0.113.10:80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, "GET http://allowed.example/ HTTP/1.1\r\nHost: blocked.example\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Fatalf("a proxy-form request got %d bytes back", n)
		}
	})
	t.Run("TLS with an encrypted ClientHello", func(t *testing.T) {
		c, err := r.dial(ctx, "203.0.113.10:443")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hello := clientHelloWithECH(t, "allowed.example")
		c.Write(hello)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Fatalf("an ECH ClientHello got %d bytes back", n)
		}
		r.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleECH && strings.Contains(e.Reason, "ECH") })
	})
}

// clientHelloWithECH is a real ClientHello for name (Go's client) with an
// outer encrypted_client_hello extension added, as a client hiding its
// real destination sends.
func clientHelloWithECH(t *testing.T, name string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go tls.Client(a, &tls.Config{ServerName: name, InsecureSkipVerify: true}).Handshake()
	defer a.Close()
	defer b.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(b, head); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(head[3:]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	// body: handshake type, length(3), version(2), random(32), session id,
	// cipher suites, compression methods, extensions.
	p := 4 + 2 + 32
	p += 1 + int(body[p])
	p += 2 + int(binary.BigEndian.Uint16(body[p:]))
	p += 1 + int(body[p])
	ext := []byte{0xfe, 0x0d, 0, 11, 0, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0}
	extLen := binary.BigEndian.Uint16(body[p:])
	binary.BigEndian.PutUint16(body[p:], extLen+uint16(len(ext)))
	body = append(body, ext...)
	hsLen := len(body) - 4
	body[1], body[2], body[3] = byte(hsLen>>16), byte(hsLen>>8), byte(hsLen)
	binary.BigEndian.PutUint16(head[3:], uint16(len(body)))
	return append(head, body...)
}

// TestAttribution: each connection's events carry the owner the guest
// reports for its source port, asked while the connection is decided.
func TestAttribution(t *testing.T) {
	type ask struct {
		port uint16
		dst  netip.AddrPort
	}
	asked := make(chan ask, 16)
	var traced atomic.Bool
	r := newRig(t, basePolicy(), baseResolver(), testLimits(), func(c *Config) {
		c.Attribute = func(_ context.Context, port uint16, dst netip.AddrPort) (Owner, error) {
			asked <- ask{port, dst}
			return Owner{PID: 42, Process: "curl", TraceID: "trace-7"}, nil
		}
		c.AttributeWhen = func() bool { return traced.Load() }
	})
	r.servers(t)
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// No traced command: nobody is asked.
	if _, _, err := r.guestHTTP(ctx, "203.0.113.10:80", "allowed.example", false); err != nil {
		t.Fatal(err)
	}
	if ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Path == "/path" }); ev.PID != 0 || len(asked) != 0 {
		t.Fatalf("attributed without a traced command: %+v", ev)
	}
	traced.Store(true)
	c, err := r.dial(ctx, "203.0.113.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	fmt.Fprint(c, "GET /x HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n")
	c.CloseWrite()
	io.ReadAll(c)
	ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Path == "/x" })
	if ev.PID != 42 || ev.Process != "curl" || ev.TraceID != "trace-7" {
		t.Fatalf("event %+v: no owner", ev)
	}
	got := <-asked
	if got.port != local.Port() || got.dst != netip.MustParseAddrPort("203.0.113.10:80") {
		t.Fatalf("asked about %+v, want the guest's port %d to 203.0.113.10:80", got, local.Port())
	}
}

// TestAttributionFirst: while a traced command runs, the guest's connect
// completes only once its owner is known (its process cannot have exited).
func TestAttributionFirst(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, basePolicy(), baseResolver(), testLimits(), func(c *Config) {
		c.Attribute = func(ctx context.Context, _ uint16, _ netip.AddrPort) (Owner, error) {
			select {
			case <-release:
			case <-ctx.Done():
			}
			return Owner{PID: 7, Process: "quick", TraceID: "t-first"}, nil
		}
		c.AttributeWhen = func() bool { return true }
	})
	r.servers(t)
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		c, err := r.dial(ctx, "203.0.113.10:80")
		if err == nil {
			fmt.Fprint(c, "GET /q HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n")
			c.CloseWrite()
			io.ReadAll(c)
			c.Close()
		}
		dialed <- err
	}()
	select {
	case err := <-dialed:
		t.Fatalf("the connection completed before its owner was known: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Path == "/q" })
	if ev.TraceID != "t-first" || ev.Process != "quick" {
		t.Fatalf("event %+v", ev)
	}
}

// TestPinsOutliveTheStack: the pins a stack lists (Pins) and another
// restores (RestorePins), as a suspend and its resume do, keep the
// addresses the guest resolved reachable, stand-ins included; a restored
// stand-in is not handed out again for another address, and a pin on a
// stand-in that does not say what it stands for is dropped.
func TestPinsOutliveTheStack(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { fmt.Fprint(w, "host loopback") }))
	defer srv.Close()
	port := netip.MustParseAddrPort(srv.Listener.Addr().String()).Port()
	pol := basePolicy()
	pol.ports[port] = true
	pol.allow["second.example"], pol.private["second.example"] = true, true
	pol.fixed["second.example"] = netip.MustParseAddr("127.0.0.2")
	before := newRig(t, pol, baseResolver(), testLimits())
	first := answers(before.query(t, "192.168.127.1", "second.example", dns.TypeA))
	got := answers(before.query(t, "192.168.127.1", "private.example", dns.TypeA))
	if len(first) != 1 || len(got) != 1 || got[0] == first[0] {
		t.Fatalf("answers %v and %v: want two stand-ins", first, got)
	}
	pins := before.host.Pins()
	// Only private.example's pin goes over, so its stand-in (the second)
	// leaves a gap before it; and one stand-in pin without its address.
	var kept []Pin
	for _, p := range pins {
		if p.Name == "private.example" {
			if p.Real != netip.MustParseAddr("127.0.0.1") {
				t.Fatalf("the pin %+v does not carry its real address", p)
			}
			kept = append(kept, p)
		}
	}
	kept = append(kept, Pin{Name: "allowed.example", Addr: netip.MustParseAddr("198.18.0.77")})

	after := newRig(t, pol, baseResolver(), testLimits())
	after.dialer.routes[netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)] = srv.Listener.Addr().String()
	after.host.RestorePins(kept)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// No lookup on this stack: the restored pin alone names the address.
	_, body, err := after.guestHTTP(ctx, netip.AddrPortFrom(netip.MustParseAddr(got[0]), port).String(), "private.example", false)
	if err != nil || body != "host loopback" {
		t.Fatalf("the restored pin's address: body %q, %v", body, err)
	}
	ev := after.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "private.example" })
	if !ev.Allowed || ev.Addr.Addr() != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("event %+v: want the real address dialled", ev)
	}
	for _, p := range after.host.Pins() {
		if p.Addr == netip.MustParseAddr("198.18.0.77") {
			t.Errorf("a stand-in pin with no real address was restored: %+v", p)
		}
	}
	// A new lookup takes a free stand-in, never the restored one.
	again := answers(after.query(t, "192.168.127.1", "second.example", dns.TypeA))
	if len(again) != 1 || again[0] == got[0] {
		t.Errorf("second.example got %v after %s was restored for private.example", again, got[0])
	}
}
