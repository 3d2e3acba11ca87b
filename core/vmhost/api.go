package vmhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/httpserve"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/logs"
)

// maxRequestBody bounds JSON request bodies (file contents travel raw, on
// their own routes).
const maxRequestBody = api.MaxRequestBody

func (v *VM) routes() http.Handler {
	mux := http.NewServeMux()
	api.Handle(mux, api.ProcessInfoVerb, v.info, writeFailure)
	api.Handle(mux, api.ProcessPortsVerb, v.publish, writeFailure)
	api.Handle(mux, api.ProcessMCPVerb, v.mcpCall, writeFailure)
	api.Handle(mux, api.ProcessMCPServersVerb, v.mcpServers, writeFailure)
	api.Handle(mux, api.ProcessForkVerb, v.forkInto, writeFailure)
	api.Handle(mux, api.ProcessSuspendVerb, func(ctx context.Context, _ string, _ api.None) (api.SuspendResult, error) {
		return v.Suspend(ctx)
	}, writeFailure)
	mux.HandleFunc(api.ProcessStopVerb.Pattern(), v.handleStop)
	mux.HandleFunc("POST "+api.RouteExec, v.handleExec)
	mux.HandleFunc("GET "+api.RouteFileContent, v.handleReadContent)
	mux.HandleFunc("PUT "+api.RouteFileContent, v.handleWriteContent)
	mux.HandleFunc("POST "+api.RouteFileStat, v.handleFile)
	mux.HandleFunc("POST "+api.RouteFileMkdir, v.handleFile)
	mux.HandleFunc("GET "+api.RouteLogs, v.handleLogs)
	mux.HandleFunc("POST "+api.RouteTerminal, v.handleTerminal)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, api.Error{Error: err.Error(), Code: codeOf(status)})
}

// codeOf is the api.Error code of a status this process answers with: a
// 422 is always the guest's refusal, a 409 a call the VM's stop cut off.
func codeOf(status int) string {
	switch status {
	case http.StatusUnprocessableEntity:
		return api.CodeRefused
	case http.StatusConflict:
		return api.CodeInterrupted
	}
	return api.CodeOf(status)
}

func decodeBody(w http.ResponseWriter, r *http.Request, into any) bool {
	if err := api.DecodeBody(w, r, into, maxRequestBody); err != nil {
		writeFailure(w, err)
		return false
	}
	return true
}

// writeFailure answers a verb's failure: a refusal or a bad body with its
// status (and code), any other error as a 500.
func writeFailure(w http.ResponseWriter, err error) {
	var ref *refusal
	var body *api.BodyError
	switch {
	case errors.As(err, &ref) && ref.code != "":
		writeJSON(w, ref.status, api.Error{Error: ref.err.Error(), Code: ref.code})
	case errors.As(err, &ref):
		writeError(w, ref.status, ref.err)
	case errors.As(err, &body):
		writeError(w, body.Status, body.Err)
	default:
		writeError(w, http.StatusInternalServerError, err)
	}
}

func (v *VM) info(context.Context, string, api.None) (api.Info, error) {
	state, reason := api.StateRunning, v.unresponsive()
	if reason != "" {
		state = api.StateUnresponsive
	}
	select {
	case <-v.stopped:
		state, reason = api.StateStopped, ""
	default:
	}
	return api.Info{Name: v.opts.Name, PID: os.Getpid(), QEMUPID: v.machine.PID(), SessionDir: v.opts.SessionDir,
		Accel: v.accel.Name, AccelReason: v.accel.Reason, Start: v.start.String(), BootTimings: v.timings, State: state, StateReason: reason,
		Workspace: v.ws.usage(), Ports: v.ports(), Network: v.networkUsage()}, nil
}

// networkUsage is the VM's network against its bounds, nil without one.
func (v *VM) networkUsage() *api.NetworkUsage {
	if v.net == nil || v.net.stack == nil {
		return nil
	}
	st := v.net.stack.Stats()
	return &api.NetworkUsage{OpenConnections: st.OpenFlows, PeakConnections: st.PeakFlows, ConnectionLimit: st.FlowLimit,
		RefusedAtLimit: st.FlowsOverLimit, QueriesDropped: st.LookupsOverLimit}
}

// ports are the ports the VM publishes now.
func (v *VM) ports() []api.PortMapping {
	if v.net == nil {
		return nil
	}
	return v.net.ports.list()
}

// publish publishes one more port while the VM runs. A host port that
// cannot be listened on is a conflict (api.CodeConflict), not a stop
// cutting the call off.
func (v *VM) publish(_ context.Context, _ string, m api.PortMapping) (api.PortMapping, error) {
	if err := m.Check(); err != nil {
		return m, &refusal{status: http.StatusBadRequest, err: err}
	}
	if v.net == nil {
		return m, &refusal{status: http.StatusConflict, code: api.CodeConflict, err: fmt.Errorf("port %s: the VM has no network", m)}
	}
	out, err := v.net.ports.add(m)
	var taken *PortTakenError
	switch {
	case errors.As(err, &taken):
		return out, &refusal{status: http.StatusConflict, code: api.CodeConflict, err: err}
	case errors.Is(err, errPortsClosed):
		return out, &refusal{status: http.StatusConflict, err: err} // the stop cut it off
	case err != nil:
		return out, &refusal{status: http.StatusBadRequest, err: err}
	}
	return out, nil
}

func (v *VM) handleStop(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
	// Answer first: stopping closes the listener this request came in on.
	go v.Stop(context.Background())
}

func (v *VM) handleExec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if !decodeBody(w, r, &req) {
		return
	}
	if err := checkExec(&req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	stream := api.NewExecStream(w)
	stream.Final(v.Exec(r.Context(), &req, stream.Stdout(), stream.Stderr()))
}

func (v *VM) handleFile(w http.ResponseWriter, r *http.Request) {
	var req api.FileRequest
	if !decodeBody(w, r, &req) {
		return
	}
	ctx := r.Context()
	var out api.FileResponse
	var info *guestwire.FileInfo
	var err error
	row := &ledger.FSEvent{Path: req.Path}
	switch r.URL.Path {
	case api.RouteFileStat:
		row.Operation = "stat"
		info, err = v.control().Stat(ctx, req.Path)
	case api.RouteFileMkdir:
		row.Operation = "mkdir"
		mode := fs.FileMode(req.Mode)
		if mode == 0 {
			mode = 0o755
		}
		err = v.control().Mkdir(ctx, req.Path, mode, true)
	}
	err = v.cutOff(ctx, err)
	if lerr := v.recordFileOp(ctx, row, err); lerr != nil {
		writeError(w, http.StatusServiceUnavailable, lerr)
		return
	}
	if err != nil {
		writeError(w, guestErrorStatus(err), err)
		return
	}
	if info != nil {
		out.Size, out.Mode, out.ModTime = info.Size, info.Mode, info.ModTimeUnixNs/1e9
		out.IsDir = info.Mode&0o170000 == 0o040000 // S_IFDIR
	}
	writeJSON(w, http.StatusOK, out)
}

// recordFileOp completes row with err's outcome and commits it before the
// answer goes out. When the operation worked, a row that cannot be
// committed is the error the caller answers with: the operation may have
// happened, but nobody is told it worked without a record of it. A failed
// operation is answered with its own failure, which says what happened
// (a call cut off by a stop or a guest panic outlives the ledger, which
// the VM's stop closes); the row's is only logged.
func (v *VM) recordFileOp(ctx context.Context, row *ledger.FSEvent, err error) error {
	row.Outcome = ledger.OutcomeOK
	if err != nil {
		row.Outcome, row.ErrorMessage = ledger.OutcomeError, err.Error()
	}
	if row.Path == "" {
		row.Path = "(none)"
	}
	lerr := v.ledger.Write(context.WithoutCancel(ctx), row)
	if lerr == nil {
		return nil
	}
	v.log.Error("fs_events row not written", "operation", row.Operation, "path", row.Path, "err", lerr)
	if err != nil {
		return nil
	}
	return fmt.Errorf("%s %s: recording it in the ledger failed: %w", row.Operation, row.Path, lerr)
}

// guestErrorStatus is the status of a failed guest call: the guest's
// refusal (no such file, too large, disk full) is the request's problem;
// a call cut off by a stop is 409 (cutOff); a guest that is gone is the
// service's.
func guestErrorStatus(err error) int {
	var we *guestwire.Error
	var cut *cutError
	switch {
	case errors.As(err, &cut):
		return cut.status
	case errors.As(err, &we) && we.Code == guestwire.CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &we) && we.Code == guestwire.CodeNoSpace:
		return http.StatusInsufficientStorage
	case errors.As(err, &we):
		return http.StatusUnprocessableEntity
	default:
		return http.StatusServiceUnavailable
	}
}

// handleReadContent answers GET /files/content?path=P with the file's bytes
// as they stream from the guest (see api.TrailerError: a failure after the
// first byte is in the trailer). ?max=N refuses a larger file.
func (v *VM) handleReadContent(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path := q.Get("path")
	if path == "" {
		writeError(w, http.StatusBadRequest, errors.New("query parameter path is required"))
		return
	}
	req := &guestwire.FileRequest{Path: path}
	switch f := q.Get("follow"); f {
	case "", "0":
	case "1":
		req.FollowSymlink = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Errorf("query parameter follow=%q: want 0 or 1", f))
		return
	}
	if s := q.Get("max"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 || n > api.MaxFileBytes {
			writeError(w, http.StatusBadRequest, fmt.Errorf("query parameter max=%q: want a byte count from 1 to %d", s, api.MaxFileBytes))
			return
		}
		req.MaxSize = n
	}
	row := &ledger.FSEvent{Operation: "read", Path: path, Direction: ledger.FromGuest, TraceID: q.Get("trace_id")}
	body := api.NewFileStream(w)
	_, err := v.control().ReadFileTo(r.Context(), req, body)
	err = v.cutOff(r.Context(), err)
	row.Size, row.Digest = body.Bytes(), body.Digest()
	if lerr := v.recordFileOp(r.Context(), row, err); lerr != nil {
		body.Fail(http.StatusServiceUnavailable, api.CodeUnavailable, lerr)
		return
	}
	if err != nil {
		status := guestErrorStatus(err)
		body.Fail(status, codeOf(status), err)
		return
	}
	body.Finish()
}

// handleWriteContent stores PUT /files/content?path=P[&mode=OCTAL]'s body
// as the file, streaming it to the guest: the guest replaces the file only
// once the whole body has arrived.
func (v *VM) handleWriteContent(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path := q.Get("path")
	if path == "" {
		writeError(w, http.StatusBadRequest, errors.New("query parameter path is required"))
		return
	}
	var mode uint32
	if s := q.Get("mode"); s != "" {
		// Only permission bits: setuid, setgid and sticky would be dropped
		// on the way to the guest, so they are refused rather than ignored.
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o777 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("query parameter mode=%q: want octal permission bits from 0 to 777, such as 644", s))
			return
		}
		mode = uint32(m)
	}
	if r.ContentLength > api.MaxFileBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("write %s: %d bytes, the limit is %d", path, r.ContentLength, api.MaxFileBytes))
		return
	}
	row := &ledger.FSEvent{Operation: "write", Path: path, Direction: ledger.ToGuest, TraceID: q.Get("trace_id")}
	httpserve.StreamBody(r) // the guest's disk sets the pace, not the client
	rc := http.NewResponseController(w)
	body := &hashingReader{r: r.Body, hash: sha256.New(), abandon: func() { rc.SetReadDeadline(time.Now()) }}
	_, err := v.control().WriteFileFrom(r.Context(), &guestwire.FileRequest{Path: path, Mode: mode, Parents: true, MaxSize: api.MaxFileBytes}, body)
	err = v.cutOff(r.Context(), err)
	row.Size, row.Digest = body.n, hex.EncodeToString(body.hash.Sum(nil))
	if lerr := v.recordFileOp(r.Context(), row, err); lerr != nil {
		writeError(w, http.StatusServiceUnavailable, lerr)
		httpserve.Linger(w, r)
		return
	}
	if err != nil {
		writeError(w, guestErrorStatus(err), err)
		httpserve.Linger(w, r)
		return
	}
	w.Header().Set(api.TrailerDigest, row.Digest)
	w.WriteHeader(http.StatusNoContent)
}

// hashingReader counts and hashes what is read through it. Abandon stops
// a read waiting on a slow client (guestctl calls it when the guest
// refuses the rest of a file).
type hashingReader struct {
	r       io.Reader
	hash    hash.Hash
	n       int64
	abandon func()
}

func (h *hashingReader) Abandon() { h.abandon() }

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.hash.Write(p[:n])
	h.n += int64(n)
	return n, err
}

// handleLogs returns the tail of the guest's serial console log:
// ?tail=N lines (default logs.DefaultTailLines), optionally only lines
// containing ?grep=TEXT.
func (v *VM) handleLogs(w http.ResponseWriter, r *http.Request) {
	tail := 0
	if s := r.URL.Query().Get("tail"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("tail=%q: want a number of lines from 1 to %d", s, logs.TailMaxLines))
			return
		}
		tail = n
	}
	text, err := logs.Tail(v.session.ConsoleLog(), tail, r.URL.Query().Get("grep"))
	if errors.Is(err, fs.ErrNotExist) {
		writeError(w, http.StatusNotFound, fmt.Errorf("console log: %w", err))
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, text)
}
