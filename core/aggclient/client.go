// Package aggclient is the endpoint's side of the mcp-aggregator child: it
// starts the child, correlates responses to requests by id (out of order),
// fails every pending call at once when the child dies, and starts a new one.
package aggclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/procs"
)

// Spawner builds (but does not start) the aggregator command. Stdin and
// Stdout must be left unset; the client connects them. A *os.File Stderr
// (other than os.Stderr) is closed in this process once the child started.
type Spawner func(ctx context.Context) (*exec.Cmd, error)

// ErrClosed is returned after Close.
var ErrClosed = errors.New("aggregator client closed")

// Client talks to one aggregator at a time and restarts it when it dies.
type Client struct {
	spawn Spawner
	log   *slog.Logger

	mu      sync.Mutex
	servers []aggwire.ServerDef
	cur     *instance
	changed chan struct{} // closed and replaced whenever cur changes
	closed  bool
	starts  int

	nextID atomic.Uint64
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

type instance struct {
	cmd     *exec.Cmd
	w       *aggwire.Writer
	stdin   io.Closer
	mu      sync.Mutex
	pending map[uint64]chan *aggwire.Response
	dead    chan struct{}
	err     error
}

// Start launches the aggregator with the given servers and keeps it running
// until Close.
func Start(ctx context.Context, spawn Spawner, servers []aggwire.ServerDef, log *slog.Logger) *Client {
	if log == nil {
		log = slog.Default()
	}
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c := &Client{spawn: spawn, log: log, servers: servers, changed: make(chan struct{}), ctx: cctx, cancel: cancel, done: make(chan struct{})}
	go c.supervise()
	return c
}

// supervise keeps one aggregator alive, with backoff between quick deaths.
func (c *Client) supervise() {
	defer close(c.done)
	backoff := 50 * time.Millisecond
	for c.ctx.Err() == nil {
		started := time.Now()
		inst, err := c.launch()
		if err != nil {
			c.log.Error("starting the MCP aggregator failed", "err", err)
		} else {
			c.setCurrent(inst)
			select {
			case <-inst.dead:
				c.log.Warn("MCP aggregator exited; restarting", "err", inst.err)
			case <-c.ctx.Done():
				c.stop(inst)
				c.setCurrent(nil)
				return
			}
			c.setCurrent(nil)
		}
		if time.Since(started) > 10*time.Second {
			backoff = 50 * time.Millisecond
		}
		select {
		case <-time.After(backoff):
		case <-c.ctx.Done():
			return
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func (c *Client) setCurrent(inst *instance) {
	c.mu.Lock()
	c.cur = inst
	if inst != nil {
		c.starts++
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *Client) launch() (*instance, error) {
	cmd, err := c.spawn(c.ctx)
	if err != nil {
		return nil, fmt.Errorf("building aggregator command: %w", err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("aggregator stdin: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("aggregator stdout: %w", err)
	}
	err = cmd.Start()
	// A log file the spawner opened for the child's stderr is the child's
	// now: close this process's copy so restarts do not leak descriptors.
	if f, ok := cmd.Stderr.(*os.File); ok && f != os.Stderr {
		f.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("starting aggregator: %w", err)
	}
	inst := &instance{cmd: cmd, w: aggwire.NewWriter(procs.RawWriter(stdin)), stdin: stdin, pending: map[uint64]chan *aggwire.Response{}, dead: make(chan struct{})}
	go inst.readLoop(procs.RawReader(stdout), c.log)

	c.mu.Lock()
	servers := c.servers
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.ctx, 30*time.Second)
	defer cancel()
	resp, err := inst.do(ctx, &aggwire.Request{ID: c.nextID.Add(1), Method: aggwire.MethodInit, Version: aggwire.ProtocolVersion, Servers: servers})
	if err == nil && resp.Error != "" {
		err = errors.New(resp.Error)
	}
	if err == nil && resp.Version != aggwire.ProtocolVersion {
		err = fmt.Errorf("aggregator speaks protocol %d, want %d", resp.Version, aggwire.ProtocolVersion)
	}
	if err != nil {
		c.stop(inst)
		return nil, fmt.Errorf("aggregator init: %w", err)
	}
	return inst, nil
}

// stop ends an instance: close stdin (the aggregator exits on EOF), then kill
// its process group if it lingers, and reap it.
func (c *Client) stop(inst *instance) {
	inst.stdin.Close()
	select {
	case <-inst.dead:
	case <-time.After(2 * time.Second):
	}
	if p := inst.cmd.Process; p != nil {
		// The aggregator leads its own process group; take its children too.
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		_ = p.Kill()
	}
	<-inst.dead
}

func (inst *instance) readLoop(stdout io.Reader, log *slog.Logger) {
	r := aggwire.NewReader(stdout)
	var err error
	for {
		var resp aggwire.Response
		err = r.Read(&resp)
		if err != nil {
			if aggwire.IsRecoverable(err) {
				log.Error("undecodable message from the aggregator", "err", err)
				continue
			}
			break
		}
		inst.mu.Lock()
		ch := inst.pending[resp.ID]
		delete(inst.pending, resp.ID)
		inst.mu.Unlock()
		if ch != nil {
			ch <- &resp
		}
	}
	waitErr := inst.cmd.Wait()
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("aggregator exited: %v", waitErr)
		if waitErr == nil {
			err = errors.New("aggregator exited")
		}
	} else {
		err = fmt.Errorf("aggregator stream failed: %w (exit: %v)", err, waitErr)
	}
	inst.mu.Lock()
	inst.err = err
	inst.pending = nil
	inst.mu.Unlock()
	close(inst.dead)
}

// do sends one request and waits for its response, the instance's death, or ctx.
func (inst *instance) do(ctx context.Context, req *aggwire.Request) (*aggwire.Response, error) {
	ch := make(chan *aggwire.Response, 1)
	inst.mu.Lock()
	if inst.pending == nil {
		err := inst.err
		inst.mu.Unlock()
		return nil, err
	}
	inst.pending[req.ID] = ch
	inst.mu.Unlock()
	if err := inst.w.Write(req); err != nil {
		inst.forget(req.ID)
		return nil, fmt.Errorf("sending to aggregator: %w", err)
	}
	select {
	case resp := <-ch:
		return resp, nil
	case <-inst.dead:
		return nil, inst.err
	case <-ctx.Done():
		inst.forget(req.ID)
		// Tell the aggregator, so the upstream call is cancelled too.
		_ = inst.w.Write(&aggwire.Request{ID: req.ID ^ 1<<63, Method: aggwire.MethodCancel, Target: req.ID})
		return nil, context.Cause(ctx)
	}
}

func (inst *instance) forget(id uint64) {
	inst.mu.Lock()
	if inst.pending != nil {
		delete(inst.pending, id)
	}
	inst.mu.Unlock()
}

// current waits for a live instance.
func (c *Client) current(ctx context.Context) (*instance, error) {
	for {
		c.mu.Lock()
		inst, changed, closed := c.cur, c.changed, c.closed
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		if inst != nil {
			select {
			case <-inst.dead:
			default:
				return inst, nil
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the MCP aggregator: %w", context.Cause(ctx))
		}
	}
}

// Do sends a request (its ID is assigned here) and returns the response. If
// the aggregator dies first, Do fails at once.
func (c *Client) Do(ctx context.Context, req *aggwire.Request) (*aggwire.Response, error) {
	inst, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	r := *req
	r.ID = c.nextID.Add(1)
	return inst.do(ctx, &r)
}

// Refresh replaces the server definitions; the running aggregator reconnects
// and future restarts use the new list.
func (c *Client) Refresh(ctx context.Context, servers []aggwire.ServerDef) error {
	c.mu.Lock()
	c.servers = servers
	c.mu.Unlock()
	resp, err := c.Do(ctx, &aggwire.Request{Method: aggwire.MethodRefresh, Servers: servers})
	if err != nil {
		return err
	}
	if resp.Error != "" {
		return errors.New(resp.Error)
	}
	return nil
}

// Restart replaces the server definitions and replaces the running
// aggregator with a new one (needed when its sandbox must change: a Landlock
// domain can only shrink). Calls in flight on the old one fail at once.
func (c *Client) Restart(servers []aggwire.ServerDef) {
	c.mu.Lock()
	c.servers = servers
	inst := c.cur
	c.mu.Unlock()
	if inst != nil {
		c.stop(inst)
	}
}

// PID returns the running aggregator's pid, or 0.
func (c *Client) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.cur.cmd.Process == nil {
		return 0
	}
	return c.cur.cmd.Process.Pid
}

// Starts reports how many aggregators have been started (restarts + 1).
func (c *Client) Starts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.starts
}

// Close stops the aggregator and waits for it to be reaped.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	c.cancel()
	<-c.done
	return nil
}
