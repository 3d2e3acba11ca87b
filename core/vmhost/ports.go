package vmhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
)

// Bounds of a published port.
const (
	// maxConnsPerPort is the most host connections one published port
	// carries at once; past it a new one is closed at once, so a flood
	// of connections costs the process no more than this many.
	maxConnsPerPort = 256
	// guestDialTimeout bounds reaching the guest's port for one host
	// connection (a guest that drops the SYN rather than refusing it).
	guestDialTimeout = 10 * time.Second
	// acceptRetry is the pause after a failed accept (out of file
	// descriptors), so that the loop does not spin.
	acceptRetry = 100 * time.Millisecond
)

// publisher owns the VM's published ports: a host listener each, whose
// connections it carries to the guest's port through the network stack.
// Listeners open when a port is added (so a taken host port fails the
// start before the VM boots), and accept once serve is called (the VM is
// ready). close ends every listener and connection, and waits for them.
type publisher struct {
	// dial connects to a guest port (netstack.Stack.DialGuest).
	dial func(ctx context.Context, port uint16) (net.Conn, error)
	// record receives every host connection to a published port, carried
	// or refused at the bound (may be nil).
	record func(inboundEvent)
	log    *slog.Logger
	ctx    context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	serving bool
	ports   []*publishedPort
}

// inboundEvent is one host connection to a published port.
type inboundEvent struct {
	start     time.Time
	port      api.PortMapping
	peer      string // the host client's address
	refused   string // why it was not carried ("" if it was)
	toGuest   int64
	fromGuest int64
	err       string
}

type publishedPort struct {
	m     api.PortMapping // normalized
	ln    net.Listener
	slots chan struct{}
}

func newPublisher(dial func(ctx context.Context, port uint16) (net.Conn, error), log *slog.Logger) *publisher {
	ctx, stop := context.WithCancel(context.Background())
	return &publisher{dial: dial, log: log, ctx: ctx, stop: stop}
}

// PortTakenError is a published port whose host address cannot be
// listened on.
type PortTakenError struct {
	Port api.PortMapping
	Err  error
}

func (e *PortTakenError) Error() string {
	if errors.Is(e.Err, syscall.EADDRINUSE) || errors.Is(e.Err, errPublishedAlready) {
		return fmt.Sprintf("host port %s is taken: %v", e.Port.Listen(), e.Err)
	}
	return fmt.Sprintf("host port %s cannot be listened on: %v", e.Port.Listen(), e.Err)
}

func (e *PortTakenError) Unwrap() error { return e.Err }

// errPublishedAlready is a host port this VM publishes already.
var errPublishedAlready = errors.New("this VM publishes it already")

// errPortsClosed refuses a port added while the VM stops.
var errPortsClosed = errors.New("the VM is stopping")

// add listens on m's host address and returns m as published; its
// connections are carried once serve was called.
func (p *publisher) add(m api.PortMapping) (api.PortMapping, error) {
	if err := m.Check(); err != nil {
		return api.PortMapping{}, err
	}
	m = m.Normalized()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return api.PortMapping{}, errPortsClosed
	case len(p.ports) >= api.MaxPorts:
		return api.PortMapping{}, fmt.Errorf("port %s: the VM publishes %d ports already, the most it may", m, len(p.ports))
	}
	for _, o := range p.ports {
		if o.m.Listen() == m.Listen() {
			return api.PortMapping{}, &PortTakenError{Port: m, Err: fmt.Errorf("%w, to guest port %d", errPublishedAlready, o.m.Guest)}
		}
	}
	ln, err := net.Listen("tcp", m.Listen())
	if err != nil {
		return api.PortMapping{}, &PortTakenError{Port: m, Err: err}
	}
	pp := &publishedPort{m: m, ln: ln, slots: make(chan struct{}, maxConnsPerPort)}
	p.ports = append(p.ports, pp)
	if p.serving {
		p.startLocked(pp)
	}
	p.log.Info("published a port", "host", m.Listen(), "guest_port", m.Guest)
	return m, nil
}

// serve starts carrying the connections of every port, and of those added
// later.
func (p *publisher) serve() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.serving {
		return
	}
	p.serving = true
	for _, pp := range p.ports {
		p.startLocked(pp)
	}
}

func (p *publisher) startLocked(pp *publishedPort) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.accept(pp)
	}()
}

// list is the ports published, in the order they were added.
func (p *publisher) list() []api.PortMapping {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]api.PortMapping, 0, len(p.ports))
	for _, pp := range p.ports {
		out = append(out, pp.m)
	}
	return slices.Clip(out)
}

// close stops every listener and connection and waits for them.
func (p *publisher) close() {
	p.mu.Lock()
	p.closed = true
	ports := p.ports
	p.mu.Unlock()
	p.stop()
	for _, pp := range ports {
		pp.ln.Close()
	}
	p.wg.Wait()
}

// accept carries each connection to pp until its listener closes.
func (p *publisher) accept(pp *publishedPort) {
	for {
		c, err := pp.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || p.ctx.Err() != nil {
				return
			}
			p.log.Warn("accepting on a published port", "host", pp.m.Listen(), "err", err)
			select {
			case <-time.After(acceptRetry):
			case <-p.ctx.Done():
				return
			}
			continue
		}
		select {
		case pp.slots <- struct{}{}:
		default:
			c.Close()
			p.note(inboundEvent{start: time.Now(), port: pp.m, peer: c.RemoteAddr().String(),
				refused: fmt.Sprintf("the port carries %d connections at once", maxConnsPerPort)})
			p.log.Warn("a published port carries as many connections as it may; closed a new one", "host", pp.m.Listen(), "bound", maxConnsPerPort)
			continue
		}
		p.wg.Add(1)
		go func() {
			defer func() {
				<-pp.slots
				p.wg.Done()
			}()
			p.carry(c, pp.m)
		}()
	}
}

// carry connects host to the guest's port and carries bytes both ways
// until both directions end. A guest that does not listen (or does not
// answer in time) gets the host connection closed.
func (p *publisher) carry(host net.Conn, m api.PortMapping) {
	defer host.Close()
	ev := inboundEvent{start: time.Now(), port: m, peer: host.RemoteAddr().String()}
	defer func() { p.note(ev) }()
	ctx, cancel := context.WithTimeout(p.ctx, guestDialTimeout)
	guest, err := p.dial(ctx, uint16(m.Guest))
	cancel()
	if err != nil {
		p.log.Debug("a published port's connection did not reach the guest", "host", m.Listen(), "guest_port", m.Guest, "err", err)
		ev.err = "reaching the guest's port: " + err.Error()
		return
	}
	defer guest.Close()
	stop := context.AfterFunc(p.ctx, func() {
		host.Close()
		guest.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ev.toGuest = pipe(guest, host)
	}()
	ev.fromGuest = pipe(host, guest)
	<-done
}

func (p *publisher) note(ev inboundEvent) {
	if p.record != nil {
		p.record(ev)
	}
}

// pipe copies src to dst: at src's end it half-closes dst, so the other
// side sees this direction end; on a failure it closes both, which ends
// the other direction too.
func pipe(dst, src net.Conn) int64 {
	n, err := io.Copy(dst, src)
	if err != nil {
		dst.Close()
		src.Close()
		return n
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		dst.Close()
	}
	return n
}
