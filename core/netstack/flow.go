package netstack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/capsem/capsem/core/netpolicy"
)

// Connection kinds, by what the guest's first flight was.
const (
	KindTLS  = "tls"
	KindHTTP = "http"
	KindTCP  = "tcp" // allowed by address: no first flight read
)

// ConnEvent is one TCP connection attempt and how it ended.
type ConnEvent struct {
	Start time.Time
	// Name is the name the connection was decided by (SNI or Host), or ""
	// when it was refused before one was seen.
	Name string
	Addr netip.AddrPort
	Kind string
	netpolicy.Verdict
	// Method, Path and Status are the plain-HTTP request and response
	// line where the host saw them.
	Method, Path  string
	Status        int
	BytesSent     int64 // guest → destination
	BytesReceived int64 // destination → guest
	Duration      time.Duration
	// Err says how an allowed connection failed (the dial, a reset).
	Err string
	// Owner is the guest process that made the connection, as the guest
	// reported it (zero when not asked or not found).
	Owner
}

// Rules that are not policy entries.
const (
	RuleNotResolved  = "not-resolved"    // the address was not given by this VM's DNS
	RuleNameMismatch = "name-mismatch"   // SNI/Host not pinned to the address
	RuleNoName       = "no-name"         // no SNI or Host in the first flight
	RulePrivate      = "private-address" // not public, and the name may not be private
	RuleAddressName  = "address-as-name" // an IP address where a name belongs
	RuleECH          = "encrypted-client-hello"
	// RuleFlowLimit: a SYN reset because Limits.Flows connections were
	// open or being decided.
	RuleFlowLimit = "flow-limit"
)

func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrPortFrom(addrOf(id.LocalAddress), id.LocalPort)
	start := time.Now()
	if !s.track() {
		r.Complete(true)
		return
	}
	select {
	case s.flows <- struct{}{}:
		s.notePeakFlows()
	default:
		// Counted before the reset goes out, so whoever sees the
		// refusal sees it counted.
		s.overLimit("flows", &s.overFlows)
		r.Complete(true)
		// Recorded after the reset, off the packet path (the forwarder
		// gave this SYN its own goroutine): an attempt like any other.
		s.cfg.Recorder.Conn(ConnEvent{Start: start, Addr: dst, Kind: KindTCP, Duration: time.Since(start),
			Verdict: netpolicy.Verdict{Rule: RuleFlowLimit,
				Reason: fmt.Sprintf("%d connections were open or being decided, the most one VM may have", cap(s.flows))}})
		s.wg.Done()
		return
	}
	defer func() {
		<-s.flows
		s.wg.Done()
	}()
	if dst.Port() == 53 {
		s.serveDNSOverTCP(r)
		return
	}
	ev := ConnEvent{Start: start, Addr: dst, Kind: KindTCP}
	refuse := func(v netpolicy.Verdict) {
		r.Complete(true)
		ev.Verdict, ev.Duration = v, time.Since(start)
		s.cfg.Recorder.Conn(ev)
	}
	pol := s.policy()
	if v := pol.Port(dst.Port()); !v.Allowed {
		refuse(v)
		return
	}
	byAddr := pol.Address(dst)
	names := s.pins.names(dst.Addr())
	if len(names) == 0 && !byAddr.Allowed {
		refuse(netpolicy.Verdict{Rule: RuleNotResolved, Reason: fmt.Sprintf("%s was not given out by this VM's DNS for an allowed name", dst.Addr())})
		return
	}
	// Asked before the guest's handshake completes: the process is still
	// blocked in connect(), however short its life.
	ev.Owner = s.owner(id.RemotePort, dst)
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		ev.Verdict, ev.Duration, ev.Err = byAddr, time.Since(start), "guest handshake: "+terr.String()
		s.cfg.Recorder.Conn(ev)
		return
	}
	// The handshake is done: free the slot before the slow part, so
	// guests waiting on slow destinations do not hold up new SYNs.
	r.Complete(false)
	guest := gonet.NewTCPConn(&wq, ep)
	stop := context.AfterFunc(s.ctx, func() { ep.Abort(); guest.Close() })
	defer stop()
	abort := func(v netpolicy.Verdict, kind string) {
		ep.Abort()
		guest.Close()
		ev.Verdict, ev.Kind, ev.Duration = v, kind, time.Since(start)
		s.cfg.Recorder.Conn(ev)
	}
	if len(names) == 0 {
		// Allowed by address: whatever the protocol, no name to read.
		ev.Verdict = byAddr
		s.splice(guest, nil, dst, "", &ev)
		return
	}
	first, hello, err := s.readFirstFlight(guest)
	if err != nil {
		rule := RuleNoName
		if errors.Is(err, errECH) {
			rule = RuleECH
		}
		abort(netpolicy.Verdict{Rule: rule, Reason: err.Error()}, KindTCP)
		return
	}
	ev.Kind, ev.Name, ev.Method, ev.Path = hello.kind, hello.name, hello.method, hello.path
	if hello.kind == KindHTTP {
		// Plain HTTP is readable on every hop: a placeholder in it,
		// to any host, is an attempt to move a credential.
		if c, ok := placeholderIn(first, pol.Credentials()); ok {
			abort(netpolicy.Verdict{Rule: RuleExfiltration,
				Reason: fmt.Sprintf("the placeholder of %s (credential for %s) was sent over plain HTTP to %s", c.GuestEnv, c.Host, hello.name)}, hello.kind)
			return
		}
	}
	v := pol.Name(hello.name)
	if !v.Allowed {
		abort(v, hello.kind)
		return
	}
	if !s.pins.has(dst.Addr(), hello.name) {
		abort(netpolicy.Verdict{Rule: RuleNameMismatch,
			Reason: fmt.Sprintf("%s names %q, but %s was given out for %s", hello.kind, hello.name, dst.Addr(), strings.Join(names, ", "))}, hello.kind)
		return
	}
	real := netip.AddrPortFrom(s.realAddr(dst.Addr()), dst.Port())
	fixed, isFixed := pol.FixedHost(hello.name)
	switch {
	case isFixed && fixed != real.Addr():
		// A reload changed the name's fixed answer since it was given:
		// the old address is not the name's any more.
		abort(netpolicy.Verdict{Rule: RuleNameMismatch, Reason: fmt.Sprintf("%s was given out for %q, whose fixed answer is now %s", real.Addr(), hello.name, fixed)}, hello.kind)
		return
	case !isFixed && s.pins.fromHosts(dst.Addr(), hello.name):
		// A reload removed the hosts entry the address came from: no
		// lookup ever gave it for the name.
		abort(netpolicy.Verdict{Rule: RuleNameMismatch, Reason: fmt.Sprintf("%s was given out for %q by a hosts entry the policy no longer has", real.Addr(), hello.name)}, hello.kind)
		return
	}
	if !netpolicy.IsPublic(real.Addr()) && !pol.PrivateAllowed(hello.name) {
		abort(netpolicy.Verdict{Rule: RulePrivate, Reason: fmt.Sprintf("%s is a %s address and %q may not be private", real.Addr(), netpolicy.AddressClass(real.Addr()), hello.name)}, hello.kind)
		return
	}
	ev.Verdict, ev.Addr = v, real
	if _, ok := pol.Credential(hello.name); ok && hello.kind == KindTLS {
		s.intercept(guest, first, real, hello.name, &ev)
		return
	}
	s.splice(guest, first, real, hello.name, &ev)
}

// firstFlight is what the guest's first bytes said.
type firstFlight struct {
	kind         string
	name         string // normalized
	method, path string
}

var errNotTLSOrHTTP = errors.New("the first bytes are neither a TLS ClientHello nor an HTTP request")

// readFirstFlight reads the guest's first bytes (bounded in size and time)
// until they name the destination, and returns them for replay.
func (s *Stack) readFirstFlight(c net.Conn) ([]byte, firstFlight, error) {
	lim := s.cfg.Limits
	c.SetReadDeadline(time.Now().Add(lim.FirstFlightWait))
	defer c.SetReadDeadline(time.Time{})
	var buf bytes.Buffer
	src := &cappedReader{r: c, left: lim.FirstFlight, buf: &buf}
	br := bufio.NewReaderSize(src, 4096)
	b, err := br.Peek(1)
	if err != nil {
		return nil, firstFlight{}, fmt.Errorf("no first flight: %w", errOrDeadline(err))
	}
	var ff firstFlight
	if b[0] == 0x16 {
		ff.kind = KindTLS
		name, err := clientHelloServerName(br)
		if err != nil {
			return nil, ff, err
		}
		ff.name = name
	} else {
		ff.kind = KindHTTP
		req, err := http.ReadRequest(br)
		if err != nil {
			if isDeadline(err) || errors.Is(err, errFirstFlightTooLong) {
				return nil, ff, errOrDeadline(err)
			}
			return nil, ff, errNotTLSOrHTTP
		}
		if req.URL.Host != "" || req.Method == http.MethodConnect {
			// A proxy's request form names its target apart from the
			// Host header: only origin-form requests are decided.
			return nil, ff, errors.New("an HTTP request in proxy form (absolute URL or CONNECT): the guest's network is not a proxy")
		}
		ff.method, ff.path = req.Method, req.URL.Path
		host := req.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if host == "" {
			return nil, ff, errors.New("the HTTP request has no Host")
		}
		ff.name = host
	}
	name, err := netpolicy.NormalizeHost(ff.name)
	if err != nil {
		return nil, ff, fmt.Errorf("%s name: %w", ff.kind, err)
	}
	ff.name = name
	// Everything read from the guest so far, including what bufio read
	// ahead, goes to the destination first.
	return buf.Bytes(), ff, nil
}

var errFirstFlightTooLong = errors.New("the first flight names no destination within its size bound")

// cappedReader reads at most left bytes and keeps a copy of them.
type cappedReader struct {
	r    io.Reader
	left int
	buf  *bytes.Buffer
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errFirstFlightTooLong
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= n
	c.buf.Write(p[:n])
	return n, err
}

func isDeadline(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func errOrDeadline(err error) error {
	if isDeadline(err) {
		return errors.New("the client sent nothing to decide by in time (a protocol that does not speak first is allowed only by address and port)")
	}
	return err
}

var errHelloRead = errors.New("stop after the ClientHello")

// extensionECH is TLS's encrypted_client_hello extension.
const extensionECH = 0xfe0d

var errECH = errors.New("the TLS ClientHello encrypts its real server name (ECH), so the name it shows decides nothing")

// clientHelloServerName reads a TLS ClientHello from br (it may span
// records and segments: crypto/tls assembles it) and returns its SNI.
func clientHelloServerName(br *bufio.Reader) (string, error) {
	var name string
	var seen bool
	var ech bool
	cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name, seen, ech = h.ServerName, true, slices.Contains(h.Extensions, extensionECH)
		return nil, errHelloRead
	}}
	err := tls.Server(readOnlyConn{br}, cfg).Handshake()
	if !seen {
		if isDeadline(err) || errors.Is(err, errFirstFlightTooLong) {
			return "", errOrDeadline(err)
		}
		return "", fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	if name == "" {
		return "", errors.New("the TLS ClientHello has no server name (SNI)")
	}
	if ech {
		// The name that decides would be the outer one, and the real
		// destination hidden: refused.
		return "", errECH
	}
	return name, nil
}

// readOnlyConn lets crypto/tls read the ClientHello; whatever it would
// write (an alert) goes nowhere.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return nil }
func (readOnlyConn) RemoteAddr() net.Addr             { return nil }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }

// copyBufs are the splice buffers, shared across flows.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// splice dials dst, replays first and carries bytes both ways until both
// directions end, then records the connection.
func (s *Stack) splice(guest *gonet.TCPConn, first []byte, dst netip.AddrPort, name string, ev *ConnEvent) {
	defer func() {
		ev.Duration = time.Since(ev.Start)
		s.cfg.Recorder.Conn(*ev)
	}()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Limits.DialTimeout)
	up, err := s.cfg.Dialer.DialContext(ctx, "tcp4", dst.String())
	cancel()
	if err != nil {
		guest.Close()
		ev.Err = "dial: " + err.Error()
		return
	}
	stop := context.AfterFunc(s.ctx, func() { up.Close(); guest.Close() })
	defer stop()
	cut := func() { up.Close(); guest.Close() }
	if ev.Kind == KindHTTP {
		s.spliceHTTP(guest, up, s.newExfiltrationGuard(up, ev, cut), first, name, ev)
		return
	}
	// Only TLS goes out unread: the rest is plaintext to whoever reads
	// it on the way.
	var toUp io.Writer = up
	if ev.Kind != KindTLS {
		toUp = s.newExfiltrationGuard(up, ev, cut)
	}
	if len(first) > 0 {
		if _, err := up.Write(first); err != nil {
			up.Close()
			guest.Close()
			ev.Err = "writing the first flight: " + err.Error()
			return
		}
		ev.BytesSent += int64(len(first))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var sent int64
	go func() {
		defer wg.Done()
		sent = copyHalf(toUp, guest)
	}()
	received := copyHalf(guest, up)
	wg.Wait()
	up.Close()
	guest.Close()
	ev.BytesSent += sent
	ev.BytesReceived = received
}

// spliceHTTP carries a plain-HTTP connection: requests checked one by one
// on the way out (httpRequests), the answers spliced back.
func (s *Stack) spliceHTTP(guest *gonet.TCPConn, up net.Conn, toUp io.Writer, first []byte, name string, ev *ConnEvent) {
	var wg sync.WaitGroup
	var sent int64
	wg.Go(func() {
		// A refused request ends the requests, not the answers to
		// those before it: the destination sees the end of the
		// guest's side either way.
		sent = s.httpRequests(toUp, io.MultiReader(bytes.NewReader(first), guest), name, ev)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	})
	status := statusSniffer{w: guest}
	received := copyHalf(halfCloser{&status, guest}, up)
	wg.Wait()
	up.Close()
	guest.Close()
	ev.BytesSent, ev.BytesReceived, ev.Status = sent, received, status.code
}

// halfCloser writes to w and half-closes c.
type halfCloser struct {
	w io.Writer
	c interface{ CloseWrite() error }
}

func (h halfCloser) Write(p []byte) (int, error) { return h.w.Write(p) }
func (h halfCloser) CloseWrite() error           { return h.c.CloseWrite() }

// copyHalf copies src to dst until src ends, then half-closes dst so the
// other side sees the end of this direction.
func copyHalf(dst io.Writer, src io.Reader) int64 {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	n, _ := io.CopyBuffer(onlyWriter{dst}, onlyReader{src}, *bp)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	return n
}

// onlyWriter and onlyReader keep io.CopyBuffer from using ReadFrom or
// WriteTo, which would bypass the pooled buffer.
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

// statusSniffer passes bytes on and takes the status code from the first
// response line ("HTTP/1.1 200 OK").
type statusSniffer struct {
	w    io.Writer
	head []byte
	done bool
	code int
}

func (s *statusSniffer) Write(p []byte) (int, error) {
	if !s.done {
		s.head = append(s.head, p[:min(len(p), 64-len(s.head))]...)
		if i := bytes.IndexByte(s.head, '\n'); i >= 0 || len(s.head) >= 64 {
			s.done = true
			f := strings.Fields(string(s.head))
			if len(f) >= 2 && strings.HasPrefix(f[0], "HTTP/") {
				s.code, _ = strconv.Atoi(f[1])
			}
		}
	}
	return s.w.Write(p)
}
