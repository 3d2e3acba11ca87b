// Package httpserve serves Capsem's local HTTP APIs (the service, each
// per-VM process, the policy-reload endpoints) with the bounds they share,
// so that one client sending slowly cannot lock the others out:
//
//   - a request's headers must arrive within HeaderTimeout;
//   - its body within BodyTimeout plus the time its bytes take at
//     BodyMinRate (the deadline moves on only as bytes come), cleared once
//     the body is read, so a response may stream, or a hijacked connection
//     carry a terminal, for as long as it needs;
//   - at most MaxConns connections are open. At the bound, a new
//     connection closes one that is idle or still sending its request, so
//     an attacker's slow connections make room for new clients rather than
//     starve them: the oldest idle one first, then the oldest of those that
//     have sent part of a request, then the oldest of those not read yet
//     (a client that sends its request at once is among these until the
//     server reads it, so that many slow ones go before it). Connections
//     past their request (a handler at work, a stream, a terminal) are
//     never closed for room; when all are, the new connection is refused.
//     A connection keeps its place for minTenure at the least, so that at
//     the bound new connections are taken no faster than the server can
//     read them.
package httpserve

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// Defaults of Options.
const (
	DefaultHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout   = 10 * time.Second
	DefaultBodyMinRate   = 1 << 20 // bytes per second
	DefaultIdleTimeout   = 5 * time.Minute
	DefaultMaxConns      = 1024
	// maxHeaderBytes bounds a request's headers: Capsem's clients send a
	// few hundred bytes.
	maxHeaderBytes = 64 << 10
)

// Options are a Server's bounds; zero fields take the defaults.
type Options struct {
	HeaderTimeout time.Duration
	BodyTimeout   time.Duration
	BodyMinRate   int64 // bytes per second
	IdleTimeout   time.Duration
	// MaxConns bounds open connections. It is lowered to half the
	// process's open-file limit, so that the bound is reached before the
	// descriptors run out.
	MaxConns int
	// Log, when not nil, tells of connections closed or refused for room
	// (a line at most every 10 s).
	Log *slog.Logger
	// Answered, when not nil, is told of each request once its handler
	// returns: its status (200 when the handler wrote none; 101 for a
	// connection it took over) and how long the handler took.
	Answered func(r *http.Request, status int, took time.Duration)
}

// refusalLogEvery spaces the log lines about connections closed for room.
const refusalLogEvery = 10 * time.Second

// Server is an http.Server with the bounds of Options. Serve, Shutdown
// and Close are http.Server's.
type Server struct {
	*http.Server
	conns *connTable
	opts  Options
}

// New returns a Server of h.
func New(h http.Handler, o Options) *Server {
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = DefaultHeaderTimeout
	}
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.BodyMinRate <= 0 {
		o.BodyMinRate = DefaultBodyMinRate
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	o.MaxConns = min(o.MaxConns, max(openFileLimit()/2, 16))
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	t := &connTable{max: o.MaxConns, conns: map[net.Conn]*connInfo{}, log: o.Log}
	s := &Server{conns: t, opts: o}
	s.Server = &http.Server{
		Handler:           s.bounded(h),
		ReadHeaderTimeout: o.HeaderTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         t.stateChanged,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
	return s
}

// Serve accepts connections on ln within the bound, and serves them.
func (s *Server) Serve(ln net.Listener) error {
	return s.Server.Serve(&boundedListener{Listener: ln, conns: s.conns})
}

// openFileLimit is the process's soft limit on open files (Go raises it to
// the hard limit at start), or a large number when unknown.
func openFileLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 1 << 30
	}
	return int(rl.Cur)
}

type connKey struct{}

// connPhase is where a connection is in its life, which says whether it
// may be closed to make room.
type connPhase int

// The phases a connection may be closed in, in the order they are chosen,
// then the one it is kept in.
const (
	phaseIdle      connPhase = iota // between requests
	phaseReceiving                  // part of a request read, its headers or body still coming
	phaseNew                        // accepted, nothing read yet
	// phaseStreaming: its headers are in and its handler takes the body on
	// as it comes (StreamBody); closed for room only after all the above.
	phaseStreaming
	phaseServing // the request is in, its handler at work or streaming: kept
)

type connInfo struct {
	phase    connPhase
	since    time.Time // when the phase began
	admitted time.Time
}

// minTenure is how long an admitted connection keeps its place at the
// least: at the bound, a new connection waits (in the listener's queue)
// for one to have had it. Without it a flood of connections would close
// each other faster than the server reads their requests, a client's with
// them.
const minTenure = 250 * time.Millisecond

// connTable tracks the open connections of a Server.
type connTable struct {
	max int
	log *slog.Logger

	mu         sync.Mutex
	conns      map[net.Conn]*connInfo
	closedRoom int // connections closed or refused for room since the last log line
	lastLog    time.Time
}

// admit makes room for c, closing a connection not yet past its request
// (the first in phase order, the oldest in its phase) that has had its
// minTenure, waiting for one to have had it if need be, and reports false
// when every connection is past its request, c then being refused.
func (t *connTable) admit(c net.Conn) bool {
	for {
		t.mu.Lock()
		if len(t.conns) < t.max {
			t.conns[c] = &connInfo{phase: phaseNew, since: time.Now(), admitted: time.Now()}
			t.mu.Unlock()
			return true
		}
		victim, wait := t.victim()
		if victim == nil && wait == 0 {
			t.noteRoom()
			t.mu.Unlock()
			return false
		}
		if victim == nil {
			t.mu.Unlock()
			time.Sleep(min(wait, 10*time.Millisecond))
			continue
		}
		t.noteRoom()
		// Forgotten now: its closing must not count against the bound.
		delete(t.conns, victim)
		victim.Close()
		t.conns[c] = &connInfo{phase: phaseNew, since: time.Now(), admitted: time.Now()}
		t.mu.Unlock()
		return true
	}
}

// victim is the connection to close for room: the first in phase order,
// then the oldest in its phase, of those not past their request that have
// had their minTenure. When there is none but some will have had it, wait
// says how soon. Called with mu held.
func (t *connTable) victim() (victim net.Conn, wait time.Duration) {
	var vi *connInfo
	now := time.Now()
	for c, info := range t.conns {
		if info.phase == phaseServing {
			continue
		}
		if left := minTenure - now.Sub(info.admitted); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		if vi == nil || info.phase < vi.phase || (info.phase == vi.phase && info.since.Before(vi.since)) {
			victim, vi = c, info
		}
	}
	return victim, wait
}

// noteRoom counts a connection closed or refused for room and logs the
// count at most once a refusalLogEvery. Called with mu held.
func (t *connTable) noteRoom() {
	t.closedRoom++
	if now := time.Now(); now.Sub(t.lastLog) >= refusalLogEvery {
		t.log.Warn("connections at their bound: the oldest ones not yet past their request were closed, or new ones refused",
			"bound", t.max, "closed_or_refused", t.closedRoom)
		t.closedRoom, t.lastLog = 0, now
	}
}

func (t *connTable) set(c net.Conn, p connPhase) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if info, ok := t.conns[c]; ok && info.phase != p {
		info.phase, info.since = p, time.Now()
	}
}

// stateChanged is the http.Server's ConnState hook.
func (t *connTable) stateChanged(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateActive: // a request's first bytes
		t.set(c, phaseReceiving)
	case http.StateIdle:
		t.set(c, phaseIdle)
	case http.StateHijacked:
		t.set(c, phaseServing)
	case http.StateClosed:
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}
}

// boundedListener admits each connection it accepts into its table.
type boundedListener struct {
	net.Listener
	conns *connTable
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.conns.admit(c) {
			return c, nil
		}
		c.Close()
	}
}

// bounded gives each request its body deadline and tells the table when
// the request is in: once its body is read, or its handler answers (a
// handler may answer before reading all of a body).
func (s *Server) bounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		served := sync.OnceFunc(func() { s.conns.set(c, phaseServing) })
		streaming := func() { s.conns.set(c, phaseStreaming) }
		rc := http.NewResponseController(w)
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			served()
		} else {
			start := time.Now()
			deadline := func(received int64) time.Time {
				return start.Add(s.opts.BodyTimeout + time.Duration(received*int64(time.Second)/s.opts.BodyMinRate))
			}
			if err := rc.SetReadDeadline(deadline(0)); err != nil {
				served() // a connection without deadlines: nothing to bound
			} else {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, deadline: deadline, done: served, streaming: streaming}
			}
		}
		aw := &answerWriter{ResponseWriter: w, answering: served}
		began := time.Now()
		h.ServeHTTP(aw, r)
		if s.opts.Answered != nil {
			s.opts.Answered(r, cmp.Or(aw.status, http.StatusOK), time.Since(began))
		}
	})
}

// deadlineBody moves the read deadline on as the body comes, and clears it
// once the body is read.
type deadlineBody struct {
	io.ReadCloser
	rc        *http.ResponseController
	deadline  func(received int64) time.Time
	received  int64
	done      func()
	streaming func()
	// paced: the handler takes the body only as fast as it can pass it on
	// (StreamBody), so the deadline is StreamIdle after the last byte.
	paced bool
	// lingering: the request was answered and the body is being dropped
	// (Linger), within a deadline of its own.
	lingering bool
}

// StreamIdle is how long a request body passed on as it comes (StreamBody)
// may go without a byte.
const StreamIdle = time.Minute

// StreamBody is for a handler that reads its request body only as fast as
// it can pass it on (a file streamed on to a guest, whose disk sets the
// pace): the body's minimum rate, which would blame the client for the
// handler's slowness, gives way to StreamIdle without a byte, and the
// connection is closed for room only after every connection still sending
// its request. It does nothing on a request the Server did not bound.
func StreamBody(r *http.Request) {
	b, ok := r.Body.(*deadlineBody)
	if !ok || b.paced {
		return
	}
	b.paced = true
	b.rc.SetReadDeadline(time.Now().Add(StreamIdle))
	b.streaming()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.lingering {
		return b.ReadCloser.Read(p)
	}
	n, err := b.ReadCloser.Read(p)
	b.received += int64(n)
	switch {
	case b.paced && n > 0 && err == nil:
		b.rc.SetReadDeadline(time.Now().Add(StreamIdle))
	case errors.Is(err, io.EOF):
		// The connection's next reads (the server's check for a client
		// gone, the next request) have deadlines of their own.
		b.rc.SetReadDeadline(time.Time{})
		b.done()
	case n > 0:
		b.rc.SetReadDeadline(b.deadline(b.received))
	}
	return n, err
}

// answerWriter tells when the handler starts answering, and clears the
// deadlines of a connection it takes over.
type answerWriter struct {
	http.ResponseWriter
	answering func()
	status    int // the first status written
}

func (w *answerWriter) WriteHeader(status int) {
	w.answering()
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *answerWriter) Write(p []byte) (int, error) {
	w.answering()
	return w.ResponseWriter.Write(p)
}

// Flush implements http.Flusher, which streams assert.
func (w *answerWriter) Flush() {
	w.answering()
	http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker: the connection is the handler's from
// then on, without the deadlines of its request.
func (w *answerWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.answering()
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		c.SetDeadline(time.Time{})
		if w.status == 0 {
			w.status = http.StatusSwitchingProtocols
		}
	}
	return c, rw, err
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *answerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// lingerFor bounds how long Linger takes a refused body.
const lingerFor = time.Second

// Linger is for a handler that refused a request while its body is still
// coming (a streamed file the guest had no room for): it sends the answer
// now, then takes and drops the body for a moment. A client writes the
// whole body before it looks at the answer only if its writes go on; a
// connection closed under it would lose the answer to a broken pipe.
func Linger(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	rc.Flush()
	if b, ok := r.Body.(*deadlineBody); ok {
		b.lingering = true // its reads keep the deadline set here
	}
	rc.SetReadDeadline(time.Now().Add(lingerFor))
	io.Copy(io.Discard, r.Body)
}
