package endpoint

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/capsem/capsem/core/jsonrpc"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/mcpframe"
	"github.com/capsem/capsem/core/policy"
	"github.com/capsem/capsem/core/procs"
)

// Serve accepts framed MCP connections until ctx is done or ln fails.
func (e *Endpoint) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	// A client (a hostile guest) opens and breaks connections at will:
	// what it makes this loop log is rate-limited.
	connLog := logs.Limited(e.log, logs.LimitBurst, logs.LimitInterval)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		if n := e.conns.Add(1); n > int64(e.cfg.Limits.MaxConns) {
			e.conns.Add(-1)
			connLog.Warn("MCP connection refused: too many open", "open", n-1, "max", e.cfg.Limits.MaxConns)
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer e.conns.Add(-1)
			if err := e.ServeConn(ctx, c); err != nil {
				connLog.Warn("MCP connection closed with error", "err", err)
			}
		}()
	}
}

// conn is one framed connection.
type conn struct {
	e         *Endpoint
	c         io.ReadWriteCloser
	r         io.Reader // c, through raw system calls when it is a socket
	w         io.Writer
	metaName  string
	metaTrace string // the trace the relay's caller runs under

	wmu  sync.Mutex // guards werr
	werr error

	mu       sync.Mutex
	inflight map[uint32]struct{}
	highest  uint32
	cancels  map[string]context.CancelFunc // JSON-RPC id text → cancel

	// unanswered caps this connection's calls not yet answered (running
	// or waiting for the client to read the answer); the shared slot is
	// held only while a call runs.
	unanswered chan struct{}
	deadlines  deadliner // nil when the connection has none
}

// deadliner is what a connection with deadlines has (net.Conn, a channel
// stream); a connection without them is served without the time limits.
type deadliner interface {
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// ServeConn serves one framed connection until EOF, a fatal framing error or
// ctx is done. Malformed frames and messages are answered and do not close
// the connection; only a length prefix outside the bounds does, because the
// stream can no longer be trusted to be in sync.
func (e *Endpoint) ServeConn(ctx context.Context, rwc io.ReadWriteCloser) error {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ctx, func() { rwc.Close() })
	defer stop()
	c := &conn{
		e:          e,
		c:          rwc,
		r:          procs.RawReader(rwc),
		w:          procs.NewGroupWriter(procs.RawWriter(rwc)),
		inflight:   map[uint32]struct{}{},
		cancels:    map[string]context.CancelFunc{},
		unanswered: make(chan struct{}, e.cfg.InFlight),
	}
	c.deadlines, _ = rwc.(deadliner)

	var handlers sync.WaitGroup
	err := c.readLoop(ctx, &handlers)
	if err != nil && !errors.Is(err, io.EOF) {
		// A broken connection cannot receive answers: cancel in-flight calls
		// so their upstream work stops. After a clean EOF (a half-close) the
		// client still waits for its answers, so let them finish.
		cancel(fmt.Errorf("client connection failed: %w", err))
	}
	// Every answer is written by its handler before it finishes; only then
	// may the context be cancelled (which closes the connection).
	handlers.Wait()
	cancel(errors.New("connection finished"))
	c.wmu.Lock()
	werr := c.werr
	c.wmu.Unlock()
	rwc.Close()
	if err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || ctx.Err() != nil && errors.Is(err, io.ErrUnexpectedEOF) {
		err = nil
	}
	if err == nil && werr != nil && !errors.Is(werr, net.ErrClosed) {
		err = werr
	}
	return err
}

// send writes one answer frame. Handlers write directly rather than through
// a writer goroutine (one fewer wakeup per call); the GroupWriter puts the
// answers of handlers that finish together into one write. After a write
// failure the connection is closed and later answers are dropped (the
// reader then ends the connection).
func (c *conn) send(streamID uint32, name string, payload []byte) {
	c.wmu.Lock()
	failed := c.werr != nil
	c.wmu.Unlock()
	if failed {
		return
	}
	frame, err := mcpframe.Append(nil, &mcpframe.Frame{StreamID: streamID, Name: name, Payload: payload})
	if err == nil {
		if c.deadlines != nil {
			// A client that does not read its answers is cut off.
			c.deadlines.SetWriteDeadline(time.Now().Add(c.e.cfg.Limits.WriteTimeout))
		}
		_, err = c.w.Write(frame)
		if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			c.e.log.Warn("MCP client does not read its answers: disconnected", "timeout", c.e.cfg.Limits.WriteTimeout)
		}
	}
	if err != nil {
		c.wmu.Lock()
		if c.werr == nil {
			c.werr = err
		}
		c.wmu.Unlock()
		c.c.Close()
	}
}

func (c *conn) readLoop(ctx context.Context, handlers *sync.WaitGroup) error {
	br := bufio.NewReaderSize(c.r, 64<<10)
	if err := c.begun(br); err != nil {
		return err
	}
	if err := c.readMeta(br); err != nil {
		return err
	}
	c.done()
	fr := mcpframe.NewReader(br)
	workers := &handlerPool{jobs: make(chan func()), wg: handlers}
	defer workers.close()
	var reserved int
	release := func() {
		c.e.buffered.Add(-int64(reserved))
		reserved = 0
	}
	defer release()
	reserve := func(n int) error {
		if total := c.e.buffered.Add(int64(n)); total > c.e.cfg.Limits.MaxBuffered {
			c.e.buffered.Add(-int64(n))
			c.e.log.Warn("MCP connection closed: frames being read pass the gateway's bound", "frame_bytes", n, "bound_bytes", c.e.cfg.Limits.MaxBuffered)
			return fmt.Errorf("a %d-byte frame would pass the %d bytes all connections may buffer", n, c.e.cfg.Limits.MaxBuffered)
		}
		reserved = n
		return nil
	}
	for {
		if err := c.begun(br); err != nil {
			return err
		}
		body, err := fr.ReadBodyBudget(reserve)
		c.done()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.e.log.Warn("MCP connection closed: a frame was not completed in time", "timeout", c.e.cfg.Limits.FrameTimeout)
			}
			return err
		}
		f, err := mcpframe.DecodeBody(body)
		if err != nil {
			release()
			c.invalidFrame(ctx, body, err)
			continue
		}
		// A frame's name is the guest's word, as the metadata line is:
		// sanitised the same way before anything records it.
		name := c.metaName
		if f.Name != "" {
			name = mcpframe.SanitizeName(f.Name)
		}
		if name == "" {
			name = "unknown"
		}
		payload := bytes.Clone(f.Payload)
		release()
		if f.IsNotification() {
			c.notification(ctx, name, payload)
			continue
		}
		if verr := c.begin(f.StreamID); verr != nil {
			c.reject(ctx, f.StreamID, name, payload, verr)
			continue
		}
		msg, perr, id := jsonrpc.ParseRequest(payload)
		if perr == nil && msg.IsNotification() {
			perr = jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "request stream %d is missing a JSON-RPC id", f.StreamID)
		}
		if perr != nil {
			c.answerError(ctx, f.StreamID, name, payload, msg, id, perr)
			c.end(f.StreamID)
			continue
		}
		// Acquire the slots here, in the reader, so a full cap stops
		// reading instead of queueing unbounded work: first this
		// connection's (a client that does not read its answers stops
		// only itself), then the shared one.
		select {
		case c.unanswered <- struct{}{}:
		case <-ctx.Done():
			c.end(f.StreamID)
			return ctx.Err()
		}
		select {
		case c.e.sem <- struct{}{}:
		case <-ctx.Done():
			<-c.unanswered
			c.end(f.StreamID)
			return ctx.Err()
		}
		callCtx, callCancel := context.WithCancelCause(ctx)
		idText := string(msg.ID)
		c.mu.Lock()
		c.cancels[idText] = func() { callCancel(errors.New("cancelled by the client")) }
		c.mu.Unlock()
		streamID := f.StreamID
		workers.run(func() {
			defer func() { <-c.unanswered }()
			meta := CallMeta{Transport: "frame", StreamID: streamID, ProcessName: name, TraceID: c.metaTrace, BytesIn: len(payload), MaxResponse: MaxFramedResponse(name)}
			resp := c.e.Handle(callCtx, meta, msg)
			<-c.e.sem // the call is done: writing its answer holds no shared slot
			callCancel(nil)
			c.mu.Lock()
			delete(c.cancels, idText)
			c.mu.Unlock()
			c.end(streamID)
			c.send(streamID, name, resp)
		})
	}
}

// begun waits, with no limit, for the next frame (or the metadata line)
// to begin, then gives the rest of it FrameTimeout to arrive: a sender that
// starts a frame and stalls holds its buffer no longer than that.
func (c *conn) begun(br *bufio.Reader) error {
	if c.deadlines == nil {
		return nil
	}
	if _, err := br.Peek(1); err != nil {
		return err
	}
	c.deadlines.SetReadDeadline(time.Now().Add(c.e.cfg.Limits.FrameTimeout))
	return nil
}

// done lifts the frame's deadline once it is read.
func (c *conn) done() {
	if c.deadlines != nil {
		c.deadlines.SetReadDeadline(time.Time{})
	}
}

// handlerPool runs a connection's calls on goroutines that outlive one
// call. A goroutine per call starts on a minimal stack and grows it, by
// copying, through the deep call path of every request: 8% of the
// gateway's CPU at concurrency 64. A worker keeps its grown stack (until a
// collection finds it parked and shrinks it) and waits for the next call.
// Workers are started only when none is idle, so there are about as many
// as the connection's peak of calls in flight (a few more at most: a
// worker frees its in-flight slot just before it is idle again, so a call
// that takes the slot then starts another); they stay parked until the
// connection's reader closes the pool, and then end once their calls are
// done.
type handlerPool struct {
	jobs    chan func() // unbuffered: a send succeeds only to an idle worker
	wg      *sync.WaitGroup
	started int // workers started (read by tests; run is the reader's alone)
}

// run hands job to an idle worker, or starts a new one for it.
func (p *handlerPool) run(job func()) {
	select {
	case p.jobs <- job:
	default:
		p.started++
		p.wg.Add(1)
		go p.work(job)
	}
}

func (p *handlerPool) work(job func()) {
	defer p.wg.Done()
	for ok := true; ok; job, ok = <-p.jobs {
		job()
	}
}

// close ends idle workers at once and busy ones after their call.
func (p *handlerPool) close() { close(p.jobs) }

// readMeta reads the relay's optional metadata line
// (mcpframe.ParseMetaLine), leaving the stream at its first frame.
func (c *conn) readMeta(br *bufio.Reader) error {
	// A frame also starts with a NUL (the high byte of its length), so only
	// the full prefix marks a metadata line.
	head, err := br.Peek(len(mcpframe.MetaPrefix))
	if err != nil || string(head) != mcpframe.MetaPrefix {
		return nil // no metadata line; errors surface on the first frame read
	}
	line := make([]byte, 0, 64)
	for {
		b, err := br.ReadByte()
		if err != nil {
			return fmt.Errorf("reading metadata line: %w", err)
		}
		line = append(line, b)
		if len(line) > mcpframe.MaxMetaLine {
			return fmt.Errorf("metadata line exceeds %d bytes", mcpframe.MaxMetaLine)
		}
		if b == '\n' {
			break
		}
	}
	meta, err := mcpframe.ParseMetaLine(line)
	if err != nil {
		return err
	}
	c.metaName, c.metaTrace = meta.Name, meta.TraceID
	return nil
}

// begin registers a request stream id: ids must increase and never repeat
// (no reuse of an in-flight id, no replay of a completed one).
func (c *conn) begin(id uint32) *jsonrpc.Error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, busy := c.inflight[id]; busy {
		return jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "stream id %d is already in flight", id)
	}
	if id <= c.highest {
		return jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "stream id %d replays or goes backwards (highest seen %d)", id, c.highest)
	}
	c.highest = id
	c.inflight[id] = struct{}{}
	return nil
}

func (c *conn) end(id uint32) {
	c.mu.Lock()
	delete(c.inflight, id)
	c.mu.Unlock()
}

// invalidFrame answers a body that did not decode on the stream it names, if
// any, and records it.
func (c *conn) invalidFrame(ctx context.Context, body []byte, ferr error) {
	streamID, _ := mcpframe.StreamIDHint(body)
	e := jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "invalid MCP frame: %v", ferr)
	c.e.recordLocal(ctx, &Record{Transport: "frame", StreamID: streamID, ProcessName: "unknown", ServerName: "gateway",
		Method: "", Decision: "error", ErrorCode: e.Code, ErrorMessage: e.Message, BytesSent: int64(len(body) + mcpframe.PrefixLen)})
	if streamID != 0 {
		c.send(streamID, "unknown", jsonrpc.ErrorResponse(nil, e))
	}
}

// reject answers a request whose stream id breaks the rules.
func (c *conn) reject(ctx context.Context, streamID uint32, name string, payload []byte, e *jsonrpc.Error) {
	msg, _, id := jsonrpc.ParseRequest(payload)
	c.answerError(ctx, streamID, name, payload, msg, id, e)
}

func (c *conn) answerError(ctx context.Context, streamID uint32, name string, payload []byte, msg *jsonrpc.Message, id json.RawMessage, e *jsonrpc.Error) {
	resp := jsonrpc.ErrorResponse(id, e)
	method := ""
	if msg != nil {
		method = msg.Method
	}
	c.e.recordLocal(ctx, &Record{Transport: "frame", StreamID: streamID, ProcessName: name, TraceID: c.metaTrace, ServerName: "gateway",
		Method: method, RequestID: jsonrpc.IDText(id), Request: string(payload), Response: string(resp), Decision: "error",
		ErrorCode: e.Code, ErrorMessage: e.Message, BytesSent: int64(len(payload)), BytesReceived: int64(len(resp))})
	c.send(streamID, name, resp)
}

// notification handles a stream-0 frame. Notifications never get a response;
// each still gets a ledger row.
func (c *conn) notification(ctx context.Context, name string, payload []byte) {
	rec := &Record{Transport: "frame", ProcessName: name, TraceID: c.metaTrace, ServerName: "gateway", Request: string(payload),
		BytesSent: int64(len(payload)), Decision: "allowed"}
	msg, perr, _ := jsonrpc.ParseRequest(payload)
	switch {
	case perr != nil:
		rec.Decision, rec.ErrorCode, rec.ErrorMessage = "error", perr.Code, perr.Message
	case !msg.IsNotification():
		rec.Method = msg.Method
		rec.RequestID = jsonrpc.IDText(msg.ID)
		rec.Decision, rec.ErrorCode, rec.ErrorMessage = "error", jsonrpc.CodeInvalidRequest, "notification frame carries a JSON-RPC id; dropped"
	case !strings.HasPrefix(msg.Method, "notifications/"):
		// A call sent without an id is never served: refused, not allowed.
		rec.Method = msg.Method
		rec.Decision, rec.ErrorCode, rec.ErrorMessage = "error", jsonrpc.CodeInvalidRequest, "a "+msg.Method+" request sent as a notification is not served; dropped"
	default:
		rec.Method = msg.Method
		if msg.Method == "notifications/cancelled" {
			c.cancelRequest(msg.Params)
		}
	}
	c.e.recordLocal(ctx, rec)
}

func (c *conn) cancelRequest(params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.RequestID) == 0 {
		return
	}
	msg, perr, _ := jsonrpc.ParseRequest([]byte(`{"jsonrpc":"2.0","method":"x","id":` + string(p.RequestID) + `}`))
	if perr != nil {
		return
	}
	c.mu.Lock()
	cancel := c.cancels[string(msg.ID)]
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// recordLocal writes a row for a message the endpoint answered itself.
// Such a message never reached policy: its text is stored only as policy
// would let it through (vetPreview on the whole message).
func (e *Endpoint) recordLocal(ctx context.Context, r *Record) {
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	if r.Request != "" {
		raw := []byte(r.Request)
		msg, perr, _ := jsonrpc.ParseRequest(raw)
		withheld := perr != nil || msg == nil
		if !withheld {
			_, withheld = e.vetPreview(ctx, msg.Method, msg.Params)
		}
		r.RequestDigest = e.digest(raw, withheld)
		if withheld {
			r.Request = policy.Redact(e.digestKey, raw)
		}
	}
	if r.Response != "" {
		r.ResponseDigest = e.digest([]byte(r.Response), false)
	}
	r.PolicyMode = "enforce"
	if err := e.cfg.Recorder.Record(context.WithoutCancel(ctx), r); err != nil {
		e.log.Error("ledger write failed", "method", r.Method, "err", err)
	}
}
