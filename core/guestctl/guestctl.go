// Package guestctl is the host side of the guest control protocol
// (core/guestwire): it accepts the agent's control connection on logical
// port 5000, checks its Hello, and then sends boot config, execs, file
// operations, pings and shutdown as requests that may complete out of order.
// Exec output arrives on port 5005, one stream per output, routed here by
// exec id to the caller's writers.
//
// It builds without cgo, like everything the guest binary links.
package guestctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/logs"
)

// Channel is the host's view of the guest channel.
type Channel = guestchan.Channel

// ErrClosed is returned (wrapped, with the cause) by every call once the
// control connection is gone: closed here, by the guest, or with the channel.
var ErrClosed = errors.New("guestctl: control connection closed")

// Options tune a Client; the zero value is usable.
type Options struct {
	Log *slog.Logger
	// HelloTimeout bounds the wait for Hello once the guest has connected
	// (default 10 s). Waiting for the guest to connect at all is bounded by
	// Accept's context.
	HelloTimeout time.Duration
	// HeartbeatInterval, when set, pings the guest that often; a ping not
	// answered within HeartbeatTimeout (default 3 intervals) closes the
	// client, failing every pending call.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	// StreamTimeout bounds how long Exec waits for the tail of its output
	// streams after the guest's ExecResult, which the guest sends only after
	// closing them (default 10 s).
	StreamTimeout time.Duration
}

// Client is a connected guest. All methods are safe for concurrent use.
type Client struct {
	opts    Options
	log     *slog.Logger
	peerLog *slog.Logger // rate-limited: for what the guest can cause at will
	conn    net.Conn
	outputs net.Listener
	hello   guestwire.Hello

	out    chan []byte // encoded frames for the writer goroutine
	nextID atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]chan *guestwire.Message
	execs   map[uint64]*execState
	files   map[uint64]chan net.Conn // file transfers waiting for their data stream
	// transfers holds a slot per file transfer in progress, so a burst of
	// requests queues here instead of piling onto the guest.
	transfers chan struct{}
	err       error
	done      chan struct{}
	life      context.Context // cancelled with done, for context.AfterFunc
	endLife   context.CancelFunc
	wg        sync.WaitGroup
}

// Accept waits (bounded by ctx) for the guest agent to connect to the
// control port, reads its Hello, and returns a Client. It listens on the
// exec output port first, so output streams always find a listener.
func Accept(ctx context.Context, ch Channel, opts Options) (*Client, error) {
	outputs, err := ch.Listen(guestchan.PortExecOutput)
	if err != nil {
		return nil, fmt.Errorf("guestctl: listen on exec output port %d: %w", guestchan.PortExecOutput, err)
	}
	ln, err := ch.Listen(guestchan.PortControl)
	if err != nil {
		outputs.Close()
		return nil, fmt.Errorf("guestctl: listen on control port %d: %w", guestchan.PortControl, err)
	}
	// One control connection per guest: the listener goes once it has come.
	defer ln.Close()
	conn, err := acceptCtx(ctx, ln, ch.Done())
	if err != nil {
		outputs.Close()
		return nil, fmt.Errorf("guestctl: waiting for the guest agent on port %d: %w", guestchan.PortControl, err)
	}
	c, err := New(ctx, conn, outputs, opts)
	if err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-ch.Done():
			c.fail(fmt.Errorf("%w: the guest channel closed", ErrClosed))
		case <-c.done:
		}
	}()
	return c, nil
}

func acceptCtx(ctx context.Context, ln net.Listener, chDone <-chan struct{}) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		got <- res{c, err}
	}()
	select {
	case r := <-got:
		return r.c, r.err
	case <-ctx.Done():
	case <-chDone:
	}
	ln.Close()
	if r := <-got; r.err == nil {
		r.c.Close()
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, errors.New("the guest channel closed")
}

// New runs the protocol over an accepted control connection and the
// listener for exec output streams; it takes ownership of both. It reads
// Hello within Options.HelloTimeout (and ctx) and refuses another protocol
// version.
func New(ctx context.Context, conn net.Conn, outputs net.Listener, opts Options) (*Client, error) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = 10 * time.Second
	}
	if opts.StreamTimeout <= 0 {
		opts.StreamTimeout = 10 * time.Second
	}
	if opts.HeartbeatInterval > 0 && opts.HeartbeatTimeout <= 0 {
		opts.HeartbeatTimeout = 3 * opts.HeartbeatInterval
	}
	c := &Client{
		opts: opts, log: opts.Log.With("component", "guestctl"), conn: conn, outputs: outputs,
		out: make(chan []byte), pending: map[uint64]chan *guestwire.Message{}, execs: map[uint64]*execState{},
		files: map[uint64]chan net.Conn{}, transfers: make(chan struct{}, hostFileTransfers),
		done: make(chan struct{}),
	}
	c.peerLog = logs.Limited(c.log, logs.LimitBurst, logs.LimitInterval)
	c.life, c.endLife = context.WithCancel(context.Background())
	r := guestwire.NewReader(conn)
	hello, err := readHello(ctx, conn, r, opts.HelloTimeout)
	if err != nil {
		c.endLife()
		conn.Close()
		outputs.Close()
		return nil, err
	}
	c.hello = hello
	c.log.Info("guest agent connected", "agent_version", hello.AgentVersion, "kernel", hello.KernelRelease,
		"kernel_to_init_ms", hello.Boot.KernelToInitMS, "mounts_ms", hello.Boot.MountsMS,
		"modules_ms", hello.Boot.ModulesMS, "channel_ms", hello.Boot.ChannelMS)
	c.wg.Add(3)
	go c.readLoop(r)
	go c.writeLoop(guestwire.NewWriter(conn))
	go c.acceptOutputs()
	if opts.HeartbeatInterval > 0 {
		c.wg.Add(1)
		go c.heartbeat()
	}
	return c, nil
}

func readHello(ctx context.Context, conn net.Conn, r *guestwire.Reader, timeout time.Duration) (guestwire.Hello, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetReadDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Now()) })
	defer stop()
	var m guestwire.Message
	err := r.Read(&m)
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		if ctx.Err() != nil {
			return guestwire.Hello{}, fmt.Errorf("guestctl: waiting for hello: %w", ctx.Err())
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return guestwire.Hello{}, fmt.Errorf("guestctl: the guest agent connected but sent no hello within %v", timeout)
		}
		return guestwire.Hello{}, fmt.Errorf("guestctl: reading hello: %w", err)
	}
	if m.Type != guestwire.TypeHello || m.Hello == nil {
		return guestwire.Hello{}, fmt.Errorf("guestctl: the guest's first message is %q, want %q", m.Type, guestwire.TypeHello)
	}
	if m.Hello.ProtocolVersion != guestwire.ProtocolVersion {
		return guestwire.Hello{}, fmt.Errorf("guestctl: the guest agent (version %s) speaks control protocol %d, this host speaks %d: rebuild the guest image",
			m.Hello.AgentVersion, m.Hello.ProtocolVersion, guestwire.ProtocolVersion)
	}
	return *m.Hello, nil
}

// Hello returns what the guest said when it connected.
func (c *Client) Hello() guestwire.Hello { return c.hello }

// Done is closed when the client is closed or its connection died.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the client closed (nil while it is open).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection and fails every pending call.
func (c *Client) Close() error {
	c.failQuiet(fmt.Errorf("%w: closed by the host", ErrClosed), false)
	c.wg.Wait()
	return nil
}

// fail closes the client once, with err as the reason every call sees.
func (c *Client) fail(err error) { c.failQuiet(err, true) }

func (c *Client) failQuiet(err error, warn bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	c.endLife()
	execs := c.execs
	c.execs = map[uint64]*execState{}
	c.mu.Unlock()
	c.conn.Close()
	c.outputs.Close()
	for _, st := range execs {
		st.abandon()
	}
	if warn {
		c.log.Warn("guest control connection closed", "err", err)
	}
}

func (c *Client) readLoop(r *guestwire.Reader) {
	defer c.wg.Done()
	for {
		var m guestwire.Message
		err := r.Read(&m)
		if err != nil {
			var de *guestwire.DecodeError
			switch {
			case errors.As(err, &de):
				c.log.Warn("undecodable message from the guest", "id", de.ID, "err", err)
				if de.ID != 0 {
					c.deliver(&guestwire.Message{Type: guestwire.TypeError, ID: de.ID,
						Error: guestwire.Errorf(guestwire.CodeDecode, "the guest's answer did not decode: %v", de.Err)})
				}
				continue
			case guestwire.IsRecoverable(err):
				c.log.Warn("oversized message from the guest", "err", err)
				continue
			case errors.Is(err, io.EOF):
				c.fail(fmt.Errorf("%w: the guest closed it", ErrClosed))
			default:
				c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
			}
			return
		}
		if m.ID == 0 {
			if m.Type == guestwire.TypeError && m.Error != nil {
				c.log.Warn("the guest could not read a request", "code", m.Error.Code, "err", m.Error.Message)
			} else {
				c.log.Warn("unsolicited message from the guest", "type", m.Type)
			}
			continue
		}
		c.deliver(&m)
	}
}

func (c *Client) deliver(m *guestwire.Message) {
	c.mu.Lock()
	ch := c.pending[m.ID]
	delete(c.pending, m.ID)
	c.mu.Unlock()
	if ch == nil {
		// The caller gave up (context) before the answer came.
		c.log.Debug("answer for no pending request", "id", m.ID, "type", m.Type)
		return
	}
	ch <- m
}

func (c *Client) writeLoop(w *guestwire.Writer) {
	defer c.wg.Done()
	for {
		select {
		case frame := <-c.out:
			if err := w.WriteFrame(frame); err != nil {
				c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
				return
			}
		case <-c.done:
			return
		}
	}
}

// call sends a request and waits for its answer. A guest Error answer is
// returned as a *guestwire.Error.
func (c *Client) call(ctx context.Context, m *guestwire.Message) (*guestwire.Message, error) {
	answer, forget, err := c.send(ctx, m)
	if err != nil {
		return nil, err
	}
	return c.await(ctx, m.Type, answer, forget)
}

// send queues a request and returns the channel its answer will come on,
// and forget, which stops waiting for it.
func (c *Client) send(ctx context.Context, m *guestwire.Message) (answer <-chan *guestwire.Message, forget func(), err error) {
	if m.ID == 0 {
		m.ID = c.nextID.Add(1)
	}
	// Encode now: the frame owns a copy of the caller's data from here on.
	frame, err := guestwire.AppendFrame(nil, m)
	if err != nil {
		return nil, nil, fmt.Errorf("guestctl: %s: %w", m.Type, err)
	}
	ch := make(chan *guestwire.Message, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, nil, err
	}
	c.pending[m.ID] = ch
	c.mu.Unlock()
	forget = func() {
		c.mu.Lock()
		delete(c.pending, m.ID)
		c.mu.Unlock()
	}
	select {
	case c.out <- frame:
		return ch, forget, nil
	case <-ctx.Done():
		forget()
		return nil, nil, fmt.Errorf("guestctl: %s: %w", m.Type, ctx.Err())
	case <-c.done:
		forget()
		return nil, nil, c.Err()
	}
}

// await waits for the answer to a request sent with send.
func (c *Client) await(ctx context.Context, typ string, answer <-chan *guestwire.Message, forget func()) (*guestwire.Message, error) {
	select {
	case resp := <-answer:
		return answerOf(typ, resp)
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("guestctl: %s: %w", typ, ctx.Err())
	case <-c.done:
		forget()
		return nil, c.Err()
	}
}

// answerOf turns a guest Error answer into a *guestwire.Error.
func answerOf(typ string, resp *guestwire.Message) (*guestwire.Message, error) {
	if resp.Type == guestwire.TypeError {
		if resp.Error == nil {
			return nil, guestwire.Errorf(guestwire.CodeUnknown, "the guest answered %s with an error without details", typ)
		}
		return nil, resp.Error
	}
	return resp, nil
}

func expect(resp *guestwire.Message, typ string) error {
	if resp.Type != typ {
		return fmt.Errorf("guestctl: the guest answered with %q, want %q", resp.Type, typ)
	}
	return nil
}

// SendBootConfig sends the boot config (environment, files, clock, host
// name); the guest applies it before answering. Invalid input is refused
// here, before anything is sent.
func (c *Client) SendBootConfig(ctx context.Context, cfg *guestwire.BootConfig) error {
	if err := guestwire.ValidateBootConfig(cfg); err != nil {
		return err
	}
	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeBootConfig, BootConfig: cfg})
	if err != nil {
		return err
	}
	return expect(resp, guestwire.TypeOK)
}

// SocketOwner asks the guest which process owns one of its TCP sockets
// (its answer attributes a connection; it decides nothing).
func (c *Client) SocketOwner(ctx context.Context, q *guestwire.SocketQuery) (*guestwire.SocketOwner, error) {
	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeSocketOwner, Socket: q})
	if err != nil {
		return nil, err
	}
	if err := expect(resp, guestwire.TypeSocketOwnerResult); err != nil {
		return nil, err
	}
	if resp.Owner == nil {
		return nil, errors.New("guestctl: socket_owner_result without an owner")
	}
	return resp.Owner, nil
}

// Ping sends a heartbeat and returns the round-trip time.
func (c *Client) Ping(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypePing})
	if err != nil {
		return 0, err
	}
	return time.Since(start), expect(resp, guestwire.TypePong)
}

// Shutdown asks the guest to power off. It returns once the guest has
// acknowledged; the guest then syncs, unmounts and powers off, and the
// connection ends.
func (c *Client) Shutdown(ctx context.Context) error {
	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeShutdown})
	if err != nil {
		return err
	}
	return expect(resp, guestwire.TypeOK)
}

func (c *Client) heartbeat() {
	defer c.wg.Done()
	t := time.NewTicker(c.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.HeartbeatTimeout)
		_, err := c.Ping(ctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				c.fail(fmt.Errorf("%w: the guest did not answer a heartbeat within %v", ErrClosed, c.opts.HeartbeatTimeout))
			}
			return
		}
	}
}

// Sync asks the guest to write every filesystem's dirty data to its disks
// (sync(2)); on its answer, what the guest had written is in the disk
// files, or in the host's cache of them.
func (c *Client) Sync(ctx context.Context) error {
	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeSync})
	if err != nil {
		return err
	}
	return expect(resp, guestwire.TypeOK)
}

// Suspend asks the guest to park (guestwire.TypeSuspend). It returns once
// the guest has acknowledged; the guest then ends the session, and waits
// on the raw channel for wakeMarker and the wake of a restored VM.
func (c *Client) Suspend(ctx context.Context, wakeMarker []byte) error {
	req := &guestwire.Suspend{WakeMarker: wakeMarker}
	if err := guestwire.ValidateSuspend(req); err != nil {
		return err
	}
	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeSuspend, Suspend: req})
	if err != nil {
		return err
	}
	return expect(resp, guestwire.TypeOK)
}
