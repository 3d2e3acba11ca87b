package vmhost

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/netstack"
	"github.com/capsem/capsem/core/printable"
	"github.com/capsem/capsem/vmm"
)

// network is the VM's NIC's other end: its own TCP/IP stack (netstack),
// deciding by the [net] policy in force and recording in the ledger. One
// stack serves every machine the VM starts (a boot that is saved, then its
// resume), so its DNS pins live as long as the VM.
type network struct {
	rec   *ledgerRecorder
	stack *netstack.Stack
	// ports are the VM's published ports, carried through stack.
	ports *publisher
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// recordTimeout bounds waiting for a network row's commit; past it the
// row still commits, the connection just stops waiting for it.
const recordTimeout = 10 * time.Second

// openNetwork builds the stack; nothing is attached before serve.
func openNetwork(v *VM) (*network, error) {
	// What the guest can make the stack (or its recorder) log is
	// rate-limited.
	limited := logs.Limited(v.log, logs.LimitBurst, logs.LimitInterval)
	dialer := &net.Dialer{Timeout: netstack.DefaultLimits.DialTimeout, KeepAlive: 30 * time.Second}
	if v.opts.NetLoopbackOnly {
		// A test's world: every destination is a server of its own on
		// loopback, and any other address the stack would dial is
		// refused at connect() and logged, so a regression shows as a
		// refused dial, never as a packet off this machine.
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !ap.Addr().IsLoopback() {
				limited.Warn("net: refused a dial outside loopback (--net-loopback-only)", "address", address)
				return fmt.Errorf("dial %s refused: this VM may reach loopback only", address)
			}
			return nil
		}
	}
	rec := &ledgerRecorder{v: v, log: limited}
	rec.refusals, rec.exfiltrations = newRefusalBudget(rec.summary), newRefusalBudget(rec.summary)
	st, err := netstack.New(netstack.Config{
		Policy:    v.netPolicy,
		Resolver:  net.DefaultResolver,
		Dialer:    dialer,
		Recorder:  rec,
		MTU:       v.opts.NetMTU,
		Logger:    limited,
		CA:        &v.netCA,
		Attribute: v.socketOwner,
		// While a traced command runs, connections are attributed.
		AttributeWhen: func() bool { return v.tracedExecs.Load() > 0 },
	})
	if err != nil {
		return nil, err
	}
	ports := newPublisher(st.DialGuest, limited)
	ports.record = rec.inbound
	return &network{stack: st, ports: ports, rec: rec}, nil
}

// socketOwner asks the guest agent which process made a connection.
func (v *VM) socketOwner(ctx context.Context, guestPort uint16, dst netip.AddrPort) (netstack.Owner, error) {
	c := v.control()
	if c == nil || v.unresponsive() != "" {
		return netstack.Owner{}, errors.New("the guest does not answer")
	}
	o, err := c.SocketOwner(ctx, &guestwire.SocketQuery{LocalPort: guestPort, RemoteIP: dst.Addr().String(), RemotePort: dst.Port()})
	if err != nil {
		return netstack.Owner{}, err
	}
	// The guest's word, bounded before it reaches the ledger: a name of
	// at most 64 bytes, a trace id only as the API would accept it.
	owner := netstack.Owner{PID: o.PID, Process: printable.Text(o.Process)}
	if len(owner.Process) > maxProcessName {
		owner.Process = owner.Process[:maxProcessName]
	}
	if api.CheckTraceID(o.TraceID) == nil {
		owner.TraceID = o.TraceID
	}
	return owner, nil
}

// maxProcessName bounds a process name the guest reports.
const maxProcessName = 64

// netPolicy is the [net] policy in force; before the gateway loaded the
// configuration, nothing is allowed.
func (v *VM) netPolicy() netstack.Policy {
	if gw := v.gateway(); gw != nil {
		if p := gw.Config().Net; p != nil {
			return p
		}
	}
	return notLoaded{}
}

// notLoaded refuses everything, saying why.
type notLoaded struct{}

func (notLoaded) verdict() netpolicy.Verdict {
	return netpolicy.Verdict{Rule: "not-loaded", Reason: "the network policy is not loaded yet"}
}
func (n notLoaded) Name(string) netpolicy.Verdict            { return n.verdict() }
func (n notLoaded) Port(uint16) netpolicy.Verdict            { return n.verdict() }
func (n notLoaded) Address(netip.AddrPort) netpolicy.Verdict { return n.verdict() }
func (notLoaded) PrivateAllowed(string) bool                 { return false }
func (notLoaded) FixedHost(string) (netip.Addr, bool)        { return netip.Addr{}, false }
func (notLoaded) Credential(string) (netpolicy.CredentialRule, bool) {
	return netpolicy.CredentialRule{}, false
}
func (notLoaded) Credentials() []netpolicy.CredentialRule { return nil }

// serve attaches a machine's NIC to the stack until the machine ends; a
// later machine of the same VM attaches its own.
func (n *network) serve(ctx context.Context, v *VM, m vmm.Machine) error {
	nh, ok := m.(vmm.NetworkHolder)
	if !ok {
		return errors.New("the VM backend gives no network attachment")
	}
	conn, framing, ok := nh.NetworkConn()
	if !ok {
		return errors.New("the VM backend gave no network attachment")
	}
	n.end()
	ctx, n.stop = context.WithCancel(context.WithoutCancel(ctx))
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.stack.Serve(ctx, conn, framing); err != nil {
			v.log.Warn("the network attachment ended", "err", err)
		}
	}()
	return nil
}

func (n *network) end() {
	if n.stop != nil {
		n.stop()
		n.stop = nil
	}
	n.wg.Wait()
}

func (n *network) close() {
	n.ports.close()
	n.end()
	n.stack.Close()
	n.rec.refusals.close()
	n.rec.exfiltrations.close()
}

// ledgerRecorder writes the stack's decisions as net_events and
// dns_events rows, each committed before the connection or answer goes on.
type ledgerRecorder struct {
	v        *VM
	log      *slog.Logger
	refusals *refusalBudget
	// exfiltrations bounds the rows of attempts to move a credential.
	exfiltrations *refusalBudget
}

// summary writes the row that counts refusals past the budget.
func (r *ledgerRecorder) summary(kind refusalKind, n int64, since time.Time) {
	reason := summaryReason(kind, n, since)
	if kind == refusedQueries {
		r.write(&ledger.DNSEvent{Timestamp: since, Name: "(refused queries)", RCode: "(summary)", Decision: string(ledger.DecisionDenied),
			PolicyRule: ruleRateLimited, PolicyReason: reason})
		return
	}
	domain := "(refused connections)"
	if kind == exfiltrationAttempts {
		domain = "(credential exfiltration attempts)"
	}
	r.write(&ledger.NetEvent{Timestamp: since, Domain: domain, Decision: string(ledger.DecisionDenied),
		PolicyAction: "deny", MatchedRule: ruleRateLimited, PolicyRule: ruleRateLimited, PolicyReason: reason,
		ConnType: "tcp", Source: ledger.SourceGuest, ProcessName: "guest"})
}

// inbound records a host connection to a published port.
func (r *ledgerRecorder) inbound(e inboundEvent) {
	if e.refused != "" && !r.refusals.take(refusedConnections) {
		return
	}
	ip := e.peer
	if h, _, err := net.SplitHostPort(e.peer); err == nil {
		ip = h
	}
	row := &ledger.NetEvent{
		Timestamp: e.start, Domain: "published " + e.port.Listen(), IP: ip, Port: int64(e.port.Guest),
		Decision: decisionOf(e.refused == ""), MatchedRule: "ports", PolicyRule: "ports",
		BytesSent: e.toGuest, BytesReceived: e.fromGuest, DurationMS: time.Since(e.start).Milliseconds(),
		ErrorMessage: e.err, ConnType: "inbound", Source: ledger.SourcePublished, ProcessName: "host",
		PolicyReason: e.refused,
	}
	row.PolicyAction = "allow"
	if e.refused != "" {
		row.PolicyAction = "deny"
	}
	r.write(row)
}

// ruleRateLimited marks a summary row of refusals.
const ruleRateLimited = "rate-limited"

func (r *ledgerRecorder) write(row ledger.Row) {
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	if err := r.v.ledger.Write(ctx, row); err != nil {
		r.log.Warn("net: recording in the ledger", "err", err)
	}
}

func (r *ledgerRecorder) Conn(e netstack.ConnEvent) {
	if !e.Allowed {
		budget, kind := r.refusals, refusedConnections
		if e.Rule == netstack.RuleExfiltration {
			budget, kind = r.exfiltrations, exfiltrationAttempts
		}
		if !budget.take(kind) {
			return
		}
	}
	row := &ledger.NetEvent{
		Timestamp:     e.Start,
		Domain:        e.Name,
		IP:            e.Addr.Addr().String(),
		Port:          int64(e.Addr.Port()),
		Decision:      decisionOf(e.Allowed),
		Method:        e.Method,
		Path:          e.Path,
		StatusCode:    int64(e.Status),
		BytesSent:     e.BytesSent,
		BytesReceived: e.BytesReceived,
		DurationMS:    e.Duration.Milliseconds(),
		MatchedRule:   e.Rule,
		ErrorMessage:  e.Err,
		ConnType:      connType(e.Kind),
		PolicyRule:    e.Rule,
		PolicyReason:  e.Reason,
		PolicySource:  e.Source,
		Source:        ledger.SourceGuest,
		ProcessName:   cmp.Or(e.Process, "guest"),
		PID:           int64(e.PID),
		TraceID:       e.TraceID,
	}
	if e.Allowed {
		row.PolicyAction = "allow"
	} else {
		row.PolicyAction = "deny"
	}
	if row.Domain == "" {
		row.Domain = row.IP
	}
	r.write(row)
}

func (r *ledgerRecorder) DNS(e netstack.DNSEvent) {
	if !e.Allowed && !r.refusals.take(refusedQueries) {
		return
	}
	row := &ledger.DNSEvent{
		Timestamp:    e.Time,
		Name:         e.Name,
		QType:        e.Type,
		RCode:        e.RCode,
		Decision:     decisionOf(e.Allowed),
		DurationMS:   e.Duration.Milliseconds(),
		PolicyRule:   e.Rule,
		PolicySource: e.Source,
		PolicyReason: e.Reason,
	}
	if e.Server.IsValid() {
		row.Server = e.Server.String()
	}
	if e.RCode == "FORMERR" {
		row.Decision = "error"
	}
	var answers []string
	for _, a := range e.Answers {
		answers = append(answers, a.String())
	}
	row.Answers = strings.Join(answers, ",")
	r.write(row)
}

func (r *ledgerRecorder) Model(e netstack.ModelEvent) {
	r.write(&ledger.ModelCall{
		Timestamp: e.Start, Provider: e.Provider, Model: e.Model, ProcessName: cmp.Or(e.Process, "guest"), TraceID: e.TraceID,
		RequestBytes: e.RequestBytes, ResponseBytes: e.ResponseBytes,
		InputTokens: e.InputTokens, OutputTokens: e.OutputTokens,
		DurationMS: e.Duration.Milliseconds(), StatusCode: int64(e.Status),
	})
}

func decisionOf(allowed bool) string {
	if allowed {
		return string(ledger.DecisionAllowed)
	}
	return string(ledger.DecisionDenied)
}

// connType is net_events.conn_type for a connection kind.
func connType(kind string) string {
	switch kind {
	case netstack.KindTLS:
		return "https"
	case netstack.KindHTTP:
		return "http"
	case netstack.KindHTTPS:
		return "https-terminated"
	}
	return "tcp"
}

// networkCmdline tells the agent to bring the NIC up.
const networkCmdline = " " + guestwire.CmdlineNet + "=1"
