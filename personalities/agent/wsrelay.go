package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"time"
)

// wsRelay carries the workspace's 9P messages between the kernel's client
// and the host's server, whole messages at a time, following the fids
// (fidTracker) so that a park can hand the client to another server: Park
// holds the client's next requests once every one sent was answered, and
// lets the server go; Resume replays the client's fids to the new server
// and lets the requests through.
type wsRelay struct {
	log        *slog.Logger
	fromKernel io.Reader // the client's requests
	toKernel   io.Writer // their replies
	max        int       // the largest message either way (msize)
	// closeKernel ends the kernel's side: the client fails its pending
	// and later requests.
	closeKernel func()

	mu       sync.Mutex
	cond     *sync.Cond
	port     io.ReadWriteCloser // the server's connection; nil while parked
	parked   bool
	timedOut bool
	ended    bool
	track    *fidTracker
	done     chan struct{}
}

func newWSRelay(log *slog.Logger, fromKernel io.Reader, toKernel io.Writer, closeKernel func(), port io.ReadWriteCloser, max int) *wsRelay {
	r := &wsRelay{log: log, fromKernel: fromKernel, toKernel: toKernel, closeKernel: closeKernel, port: port, max: max,
		track: newFidTracker(), done: make(chan struct{})}
	r.cond = sync.NewCond(&r.mu)
	go r.requests()
	go r.replies()
	return r
}

// end ends the relay once: the kernel's side and the server's connection
// close.
func (r *wsRelay) end(err error) {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return
	}
	r.ended = true
	port := r.port
	r.cond.Broadcast()
	r.mu.Unlock()
	r.log.Warn("the workspace connection ended; the workspace is unreachable until the VM restarts", "err", err)
	if port != nil {
		port.Close()
	}
	r.closeKernel()
	close(r.done)
}

// Done is closed once the relay has ended.
func (r *wsRelay) Done() <-chan struct{} { return r.done }

// requests forwards the client's requests, each noted first. The kernel's
// side is a blocking descriptor: this goroutine keeps its thread.
func (r *wsRelay) requests() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 0, 64<<10)
	for {
		msg, err := readP9Message(r.fromKernel, buf, r.max)
		if err != nil {
			r.end(fmt.Errorf("reading the client's request: %w", err))
			return
		}
		buf = msg[:0]
		r.mu.Lock()
		for r.parked && !r.ended {
			r.cond.Wait()
		}
		if r.ended {
			r.mu.Unlock()
			return
		}
		r.track.Request(msg)
		port := r.port
		r.mu.Unlock()
		// A park waits for this request's reply before it lets the
		// connection go: a failed write is the connection's end.
		if _, err := port.Write(msg); err != nil {
			r.end(fmt.Errorf("sending the client's request: %w", err))
			return
		}
	}
}

// replies forwards the server's replies, each noted first; across a park
// it waits for the next server.
func (r *wsRelay) replies() {
	buf := make([]byte, 0, 64<<10)
	for {
		r.mu.Lock()
		for r.parked && !r.ended {
			r.cond.Wait()
		}
		port, ended := r.port, r.ended
		r.mu.Unlock()
		if ended {
			return
		}
		msg, err := readP9Message(port, buf, r.max)
		if err != nil {
			r.mu.Lock()
			parkedMeanwhile := r.parked || r.port != port
			r.mu.Unlock()
			if parkedMeanwhile {
				continue // the park let this connection go
			}
			r.end(fmt.Errorf("reading the server's reply: %w", err))
			return
		}
		buf = msg[:0]
		r.mu.Lock()
		r.track.Reply(msg)
		if r.track.Inflight() == 0 {
			r.cond.Broadcast()
		}
		r.mu.Unlock()
		if err := writeAll(r.toKernel, msg); err != nil {
			r.end(fmt.Errorf("giving the client its reply: %w", err))
			return
		}
	}
}

func writeAll(w io.Writer, b []byte) error {
	for len(b) > 0 {
		n, err := w.Write(b)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// errWorkspaceBusy: requests still awaited their replies when a park's
// wait ran out.
var errWorkspaceBusy = errors.New("workspace requests still awaited their replies")

// Park holds the client's next requests, waits (up to timeout) until every
// request sent has its reply, and closes the server's connection. On an
// error the relay is as before (and may since have ended).
func (r *wsRelay) Park(timeout time.Duration) error {
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return errors.New("the workspace connection has ended")
	}
	r.parked, r.timedOut = true, false
	timer := time.AfterFunc(timeout, func() {
		r.mu.Lock()
		r.timedOut = true
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer timer.Stop()
	for r.track.Inflight() > 0 && !r.timedOut && !r.ended {
		r.cond.Wait()
	}
	if n := r.track.Inflight(); n > 0 || r.ended {
		r.parked = false
		r.cond.Broadcast()
		r.mu.Unlock()
		return fmt.Errorf("%w (%d)", errWorkspaceBusy, n)
	}
	port := r.port
	r.port = nil
	r.mu.Unlock()
	port.Close()
	return nil
}

// Resume replays the client's fids to the server on port, a new one, and
// lets the client's requests through to it. On an error the caller ends
// the relay (End) and mounts the workspace anew.
func (r *wsRelay) Resume(port io.ReadWriteCloser) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended || !r.parked {
		return errors.New("the workspace relay is not parked")
	}
	lost, err := r.track.Replay(port, r.max)
	if err != nil {
		return err
	}
	if lost > 0 {
		r.log.Warn("workspace files the new server could not open again (removed meanwhile?): their next use fails", "fids", lost)
	}
	r.port, r.parked = port, false
	r.cond.Broadcast()
	return nil
}

// End ends the relay (the client's pending and later requests fail).
func (r *wsRelay) End(why error) { r.end(why) }
