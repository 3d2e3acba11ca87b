package netstack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/capsem/capsem/core/netpolicy"
)

// DNSEvent is one query and its answer.
type DNSEvent struct {
	Time     time.Time
	Name     string // as asked, normalized when it could be
	Type     string // "A", "AAAA", "HTTPS", …
	Answers  []netip.Addr
	RCode    string // "NOERROR", "NXDOMAIN", "SERVFAIL", "FORMERR", …
	Server   netip.Addr
	Duration time.Duration
	netpolicy.Verdict
}

// answerTTL is the TTL the guest is given: short, so a policy change shows
// soon; the pin itself lasts much longer (see pins).
const answerTTL = 60

// maxDNSMessage bounds a query over TCP (UDP is bounded by its datagram).
const maxDNSMessage = 4096

// RuleLookupLimit: a query dropped unanswered because Limits.Lookups
// queries were being answered.
const RuleLookupLimit = "lookup-limit"

// RCodeDropped is the DNSEvent.RCode of a query that got no answer.
const RCodeDropped = "(dropped)"

// takeLookup takes one of the Lookups slots (given back with <-s.dns), or
// counts the query refused at the bound, for the record too.
func (s *Stack) takeLookup() bool {
	select {
	case s.dns <- struct{}{}:
		return true
	default:
		s.overLimit("dns lookups", &s.overLookups)
		s.unrecordedDrops.Add(1)
		select {
		case s.dropNoted <- struct{}{}:
		default: // the recorder is already told
		}
		return false
	}
}

// recordDrops records the queries dropped at the lookup bound, one event
// each, from a goroutine of its own: a UDP query is dropped on the
// packet path, which must not wait for the recorder. It ends with the
// stack; Close records what is left.
func (s *Stack) recordDrops() {
	defer s.wg.Done()
	for {
		select {
		case <-s.dropNoted:
			s.recordDropped()
		case <-s.ctx.Done():
			return
		}
	}
}

// recordDropped records the drops counted and not yet recorded.
func (s *Stack) recordDropped() {
	for range s.unrecordedDrops.Swap(0) {
		s.cfg.Recorder.DNS(DNSEvent{Time: time.Now(), RCode: RCodeDropped, Verdict: netpolicy.Verdict{Rule: RuleLookupLimit,
			Reason: fmt.Sprintf("dropped unread: %d queries were being answered, the most one VM may have", cap(s.dns))}})
	}
}

func (s *Stack) handleUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	if id.LocalPort != 53 {
		// Not handled: the stack answers ICMP port unreachable, so the
		// guest fails at once instead of waiting.
		return false
	}
	if !s.takeLookup() {
		return true // dropped: the guest's resolver retries
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		<-s.dns
		return true
	}
	c := gonet.NewUDPConn(&wq, ep)
	if !s.track() {
		c.Close()
		<-s.dns
		return true
	}
	go func() {
		defer s.wg.Done()
		defer func() { <-s.dns }()
		defer c.Close()
		// Resolvers send several queries from one socket at once (A and
		// AAAA): the endpoint now owns that 4-tuple, so it answers them
		// all, until the guest is quiet for a moment or has sent a few.
		buf := make([]byte, 1500)
		for range udpQueriesPerFlow {
			c.SetReadDeadline(time.Now().Add(udpFlowIdle))
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if reply := s.answer(buf[:n], addrOf(id.LocalAddress), true); reply != nil {
				c.Write(reply)
			}
		}
	}()
	return true
}

// A UDP flow to port 53 is served until it is idle for udpFlowIdle or has
// sent udpQueriesPerFlow queries; the next query opens a new one.
const (
	udpFlowIdle       = 500 * time.Millisecond
	udpQueriesPerFlow = 16
)

// serveDNSOverTCP answers length-prefixed queries on one connection (any
// address, port 53) until the guest stops or is idle for a few seconds.
func (s *Stack) serveDNSOverTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		return
	}
	r.Complete(false)
	c := gonet.NewTCPConn(&wq, ep)
	// Reset, not closed gracefully: a guest that never acknowledges our
	// FIN would keep the endpoint long after its flow ended.
	defer func() { ep.Abort(); c.Close() }()
	stop := context.AfterFunc(s.ctx, func() { c.Close() })
	defer stop()
	server := addrOf(id.LocalAddress)
	var lenBuf [2]byte
	msg := make([]byte, maxDNSMessage)
	for {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		if n > len(msg) {
			return
		}
		if _, err := io.ReadFull(c, msg[:n]); err != nil {
			return
		}
		if !s.takeLookup() {
			return
		}
		reply := s.answer(msg[:n], server, false)
		<-s.dns
		if reply == nil {
			return
		}
		out := make([]byte, 2+len(reply))
		binary.BigEndian.PutUint16(out, uint16(len(reply)))
		copy(out[2:], reply)
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// answer decides one query and returns the reply (nil: none, the query was
// not even a DNS header). udp truncates a reply too big for a datagram.
func (s *Stack) answer(query []byte, server netip.Addr, overUDP bool) []byte {
	start := time.Now()
	q := new(dns.Msg)
	if err := q.Unpack(query); err != nil {
		if len(query) < 12 {
			return nil
		}
		// Enough of a header to answer: tell the client its query was bad.
		m := new(dns.Msg)
		m.Id = binary.BigEndian.Uint16(query)
		m.Response, m.Rcode = true, dns.RcodeFormatError
		out, _ := m.Pack()
		s.cfg.Recorder.DNS(DNSEvent{Time: start, RCode: "FORMERR", Server: server, Duration: time.Since(start),
			Verdict: netpolicy.Verdict{Reason: "malformed query: " + err.Error()}})
		return out
	}
	reply, ev := s.resolve(q)
	ev.Time, ev.Server, ev.Duration = start, server, time.Since(start)
	ev.RCode = dns.RcodeToString[reply.Rcode]
	s.cfg.Recorder.DNS(ev)
	if overUDP {
		size := 512
		if opt := q.IsEdns0(); opt != nil {
			size = max(512, min(int(opt.UDPSize()), 1232))
		}
		reply.Truncate(size)
	}
	out, err := reply.Pack()
	if err != nil {
		m := new(dns.Msg)
		m.SetRcode(q, dns.RcodeServerFailure)
		out, _ = m.Pack()
	}
	return out
}

// resolve builds the reply to a parsed query.
func (s *Stack) resolve(q *dns.Msg) (*dns.Msg, DNSEvent) {
	reply := new(dns.Msg)
	var ev DNSEvent
	if q.Response || q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
		reply.SetRcode(q, dns.RcodeFormatError)
		ev.Reason = "not a single-question query"
		if len(q.Question) > 0 {
			ev.Name = q.Question[0].Name
		}
		return reply, ev
	}
	question := q.Question[0]
	ev.Type = dns.TypeToString[question.Qtype]
	if ev.Type == "" {
		ev.Type = fmt.Sprintf("TYPE%d", question.Qtype)
	}
	ev.Name = strings.TrimSuffix(question.Name, ".")
	if question.Qclass != dns.ClassINET {
		reply.SetRcode(q, dns.RcodeNotImplemented)
		ev.Reason = "only class IN is answered"
		return reply, ev
	}
	name, err := netpolicy.NormalizeHost(ev.Name)
	if err != nil {
		reply.SetRcode(q, dns.RcodeNameError)
		ev.Reason = err.Error()
		return reply, ev
	}
	ev.Name = name
	if _, err := netip.ParseAddr(name); err == nil {
		// An address is not a name: the resolver would hand it back as
		// its own answer, pinning any address to itself. Connections to
		// an address are decided by the policy's address entries.
		reply.SetRcode(q, dns.RcodeNameError)
		ev.Rule, ev.Reason = RuleAddressName, name+" is an address, not a name"
		return reply, ev
	}
	pol := s.policy()
	v := pol.Name(name)
	ev.Verdict = v
	if !v.Allowed {
		reply.SetRcode(q, dns.RcodeNameError)
		return reply, ev
	}
	reply.SetReply(q)
	reply.RecursionAvailable = true
	if question.Qtype != dns.TypeA {
		// The guest network is IPv4 only, and HTTPS/SVCB records would
		// carry ECH keys that hide the SNI: no data for all of them.
		return reply, ev
	}
	addrs, fromHosts, err := s.lookup(pol, name)
	if err != nil {
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
			reply.SetRcode(q, dns.RcodeNameError)
		} else {
			reply.SetRcode(q, dns.RcodeServerFailure)
		}
		ev.Err(err)
		return reply, ev
	}
	var given []netip.Addr
	private := pol.PrivateAllowed(name)
	for _, a := range addrs {
		if !a.Is4() {
			continue
		}
		if !netpolicy.IsPublic(a) && !private {
			ev.Allowed = false
			ev.Rule = RulePrivate
			ev.Reason = fmt.Sprintf("%s resolves to %s, a %s address, and may not be private", name, a, netpolicy.AddressClass(a))
			reply.Answer = nil
			return reply, ev
		}
		given = append(given, a)
	}
	given = s.standIns(given)
	s.pins.add(name, given, fromHosts)
	for _, a := range given {
		reply.Answer = append(reply.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: answerTTL},
			A:   net.IP(a.AsSlice()),
		})
	}
	ev.Answers = given
	return reply, ev
}

// Err records why an allowed query got no answer.
func (e *DNSEvent) Err(err error) { e.Reason = err.Error() }

// lookup resolves name: a fixed answer from the policy's hosts (fromHosts),
// else the host's resolver.
func (s *Stack) lookup(pol Policy, name string) (addrs []netip.Addr, fromHosts bool, err error) {
	if a, ok := pol.FixedHost(name); ok {
		return []netip.Addr{a}, true, nil
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Limits.LookupTimeout)
	defer cancel()
	// Rooted: the host's search domains must not turn the guest's name
	// into another one.
	addrs, err = s.cfg.Resolver.LookupNetIP(ctx, "ip4", name+".")
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, false, err
}
