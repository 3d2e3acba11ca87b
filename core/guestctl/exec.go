package guestctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
)

// execState routes one exec's two output streams to the caller's writers.
type execState struct {
	id    uint64
	sinks [2]*sink // stdout, stderr
}

// sink is one output: the caller's writer, its cap, and the stream feeding it.
type sink struct {
	which string
	w     io.Writer
	cap   int64
	done  chan struct{} // closed when the stream ends (EOF, error or abandon)

	mu        sync.Mutex
	attached  bool     // a stream claimed this sink
	conn      net.Conn // the stream, once attached
	abandoned bool     // the caller is gone: never touch w again
	received  int64    // bytes read from the stream
	written   int64    // bytes handed to w
	werr      error    // w failed
	rerr      error    // the stream failed before EOF
	ended     bool
}

func newExecState(id uint64, stdout io.Writer, stdoutCap int64, stderr io.Writer, stderrCap int64) *execState {
	return &execState{id: id, sinks: [2]*sink{
		{which: guestwire.StreamStdout, w: stdout, cap: stdoutCap, done: make(chan struct{})},
		{which: guestwire.StreamStderr, w: stderr, cap: stderrCap, done: make(chan struct{})},
	}}
}

// abandon stops all writes to the caller's writers (waiting for one in
// progress) and closes the streams, so nothing touches the writers once
// Exec has returned.
func (st *execState) abandon() {
	for _, s := range st.sinks {
		s.mu.Lock()
		s.abandoned = true
		conn := s.conn
		s.mu.Unlock()
		if conn != nil {
			conn.Close()
		}
		s.end(nil)
	}
}

func (s *sink) end(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	s.rerr = err
	close(s.done)
}

// write forwards p to the caller's writer within the cap. It holds the lock
// across the caller's Write so abandon can wait it out.
func (s *sink) write(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.received += int64(len(p))
	if s.abandoned || s.werr != nil || s.w == nil {
		return
	}
	// The guest enforces the cap; this is a second fence against a guest
	// that does not.
	if room := s.cap - s.written; int64(len(p)) > room {
		p = p[:max(room, 0)]
	}
	if len(p) == 0 {
		return
	}
	if _, err := s.w.Write(p); err != nil {
		s.werr = err
		return
	}
	s.written += int64(len(p))
}

func (c *Client) acceptOutputs() {
	defer c.wg.Done()
	for {
		conn, err := c.outputs.Accept()
		if err != nil {
			select {
			case <-c.done:
			default:
				c.fail(fmt.Errorf("%w: exec output listener: %v", ErrClosed, err))
			}
			return
		}
		c.wg.Add(1)
		go c.serveOutput(conn)
	}
}

// headerTimeout bounds the wait for a stream's header, so a stuck stream
// cannot hold a goroutine.
const headerTimeout = 10 * time.Second

func (c *Client) serveOutput(conn net.Conn) {
	defer c.wg.Done()
	// Close the stream with the client, whatever state it is in.
	stream := conn
	stop := context.AfterFunc(c.life, func() { stream.Close() })
	defer func() {
		stop()
		if conn != nil {
			conn.Close()
		}
	}()
	conn.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := guestwire.ReadStreamHeader(conn)
	if err != nil {
		c.peerLog.Warn("bad data stream", "err", err)
		return
	}
	conn.SetReadDeadline(time.Time{})
	if h.Which == guestwire.StreamFile {
		if c.attachFileStream(h.ID, conn) {
			conn = nil // the transfer owns it now
		}
		return
	}
	c.mu.Lock()
	st := c.execs[h.ID]
	var s *sink
	if st != nil {
		s = st.sinks[0]
		if h.Which == guestwire.StreamStderr {
			s = st.sinks[1]
		}
		s.mu.Lock()
		if s.attached || s.abandoned {
			s.mu.Unlock()
			s = nil
		} else {
			s.attached = true
			s.conn = conn
			s.mu.Unlock()
		}
	}
	c.mu.Unlock()
	if s == nil {
		// An exec whose caller gave up, or a duplicate stream: closing it
		// makes the guest drop the rest.
		c.log.Debug("exec output stream for no waiting exec", "exec_id", h.ID, "which", h.Which)
		return
	}
	raiseWindow(conn)
	buf := make([]byte, outputBufMin)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			s.write(buf[:n])
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			s.end(err)
			return
		}
		if n == len(buf) && len(buf) < outputBufMax {
			buf = make([]byte, 2*len(buf))
		}
	}
}

// raiseWindow lets a stream carrying data the host asked for, and reads as
// it comes, take in a data window (guestchan.ReceiveWindowRaiser): more
// than the default per round trip, which under TCG capped the rate. The
// streams raised are as many as the host's own execs and transfers.
func raiseWindow(c net.Conn) {
	if r, ok := c.(guestchan.ReceiveWindowRaiser); ok {
		r.RaiseReceiveWindow()
	}
}

// An output is read in pieces that grow with it, so that a busy one
// reaches the caller's writer (an HTTP response, an event per piece) in
// few large pieces and a quiet one holds a small buffer.
const (
	outputBufMin = 32 << 10
	outputBufMax = 256 << 10
)

// Exec runs a command in the guest and copies its stdout and stderr, kept
// apart, to the given writers (nil discards), each up to its cap (at least
// guestwire.MinOutputCap). It returns when the command has exited and both
// outputs have arrived. req.StreamID is chosen here.
//
// When ctx ends first, Exec returns at once, asks the guest to kill the
// command's process group, and never writes to stdout or stderr again. A
// writer error stops copying to that writer and is returned with the
// result.
func (c *Client) Exec(ctx context.Context, req *guestwire.Exec, stdout, stderr io.Writer) (*guestwire.ExecResult, error) {
	if err := guestwire.ValidateExec(req); err != nil {
		return nil, err
	}
	r := *req
	id := c.nextID.Add(1)
	r.StreamID = id
	st := newExecState(id, stdout, guestwire.OutputCap(r.StdoutCap), stderr, guestwire.OutputCap(r.StderrCap))
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.execs[id] = st
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.execs, id)
		c.mu.Unlock()
	}()

	resp, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeExec, ID: id, Exec: &r})
	if err != nil {
		st.abandon()
		if ctx.Err() != nil && c.Err() == nil {
			go c.cancel(id)
		}
		return nil, err
	}
	if err := expect(resp, guestwire.TypeExecResult); err != nil || resp.ExecResult == nil {
		st.abandon()
		return nil, fmt.Errorf("guestctl: exec: the guest answered %q without a result", resp.Type)
	}
	res := resp.ExecResult
	// The guest closed both streams before answering, but their last bytes
	// may still be on their way here.
	timer := time.NewTimer(c.opts.StreamTimeout)
	defer timer.Stop()
	for _, s := range st.sinks {
		select {
		case <-s.done:
		case <-ctx.Done():
			st.abandon()
			return nil, fmt.Errorf("guestctl: exec: %w", ctx.Err())
		case <-c.done:
			st.abandon()
			return nil, c.Err()
		case <-timer.C:
			st.abandon()
			return res, fmt.Errorf("guestctl: exec: the %s stream did not end within %v of the result", s.which, c.opts.StreamTimeout)
		}
	}
	sent := [2]int64{res.StdoutSent, res.StderrSent}
	for i, s := range st.sinks {
		s.mu.Lock()
		received, rerr, werr := s.received, s.rerr, s.werr
		s.mu.Unlock()
		switch {
		case werr != nil:
			return res, fmt.Errorf("guestctl: exec: writing %s: %w", s.which, werr)
		case rerr != nil:
			return res, fmt.Errorf("guestctl: exec: reading the %s stream: %w", s.which, rerr)
		case received != sent[i]:
			return res, fmt.Errorf("guestctl: exec: the guest sent %d bytes of %s but %d arrived", sent[i], s.which, received)
		}
	}
	return res, nil
}

// cancel asks the guest to end a request whose caller gave up: kill an
// exec, or stop a file transfer (which would otherwise wait on a stream
// nobody reads).
func (c *Client) cancel(id uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.call(ctx, &guestwire.Message{Type: guestwire.TypeCancel, Target: id}); err != nil {
		c.log.Debug("cancel", "id", id, "err", err)
	}
}
