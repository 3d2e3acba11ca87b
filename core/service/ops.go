package service

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
)

// Exec runs a command in a running VM and returns its output, stdout and
// stderr apart. It has no timeout unless the request gives one; cancelling
// ctx (the caller went away) kills the guest command.
func (s *Service) Exec(ctx context.Context, ref string, req api.ExecRequest) (api.ExecResult, error) {
	run, err := s.ExecStream(ref, req)
	if err != nil {
		return api.ExecResult{}, err
	}
	var stdout, stderr api.ExecOutput
	start := time.Now()
	ev, err := run(ctx, &stdout, &stderr)
	if err != nil {
		return api.ExecResult{}, err
	}
	return api.ResultOf(ev, &stdout, &stderr, time.Since(start)), nil
}

// ExecStream checks req against ref's VM and returns the function that
// runs it there, with the VM's env under the request's, its output going
// to stdout and stderr as it comes; errors that keep it from starting (bad
// input, an unknown or stopped VM) come first.
func (s *Service) ExecStream(ref string, req api.ExecRequest) (func(ctx context.Context, stdout, stderr io.Writer) (*api.ExecEvent, error), error) {
	if err := checkCommand(req); err != nil {
		return nil, err
	}
	v, c, err := s.running(ref)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	env := maps.Clone(v.rec.Env)
	s.mu.Unlock()
	if len(env) > 0 || len(req.Env) > 0 {
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, req.Env)
		req.Env = env
	}
	return func(ctx context.Context, stdout, stderr io.Writer) (*api.ExecEvent, error) {
		ev, err := c.Exec(ctx, &req, stdout, stderr)
		if err != nil {
			return nil, s.vmError(v, err)
		}
		return ev, nil
	}, nil
}

// Publish publishes one more port of a running VM, for as long as it runs
// (a resume publishes the create's ports alone), and returns it as
// published.
func (s *Service) Publish(ctx context.Context, ref string, m api.PortMapping) (api.PortMapping, error) {
	if err := m.Check(); err != nil {
		return api.PortMapping{}, badRequest("%v", err)
	}
	v, c, err := s.running(ref)
	if err != nil {
		return api.PortMapping{}, err
	}
	out, err := c.Publish(ctx, m.Normalized())
	var se *apiclient.StatusError
	if errors.As(err, &se) && se.Code == api.CodeConflict {
		r := s.snapshot(v)
		return api.PortMapping{}, conflict("VM %s: %s", r.Label(), strings.TrimPrefix(se.Message, api.RoutePorts+": "))
	}
	if err != nil {
		return api.PortMapping{}, s.vmError(v, err)
	}
	return out, nil
}

// checkCommand refuses an exec request without exactly one command.
func checkCommand(req api.ExecRequest) error {
	if (len(req.Argv) == 0) == (req.Command == "") {
		return badRequest("give exactly one of command and argv")
	}
	if req.TimeoutMS < 0 {
		return badRequest("timeout_ms must not be negative")
	}
	return nil
}

// vmError turns a per-VM API failure into a refusal that says whose it
// is: the guest's refusal (no such file) is 400 (or 413, 507) with code
// refused; a call the VM's stop or removal cut off is 409 interrupted; a
// VM that is not running, or whose process or guest stopped answering
// (a guest panic, a dead process), is 503 unavailable.
func (s *Service) vmError(v *vm, err error) error {
	s.mu.Lock()
	stopping := v.stopping
	s.mu.Unlock()
	r := s.snapshot(v)
	var se *apiclient.StatusError
	isStatus := errors.As(err, &se)
	if direct, ok := err.(*apiclient.StatusError); ok {
		// Without the hint of the process's code: the answer gets its
		// own code's.
		err = errors.New(direct.Message)
	}
	switch {
	case isStatus && se.Status == http.StatusRequestEntityTooLarge:
		return &Error{Status: se.Status, Code: api.CodeTooLarge, Err: fmt.Errorf("VM %s: %v", r.Label(), err)}
	case isStatus && se.Status == http.StatusInsufficientStorage:
		return &Error{Status: se.Status, Code: api.CodeNoSpace, Err: fmt.Errorf("VM %s: %v", r.Label(), err)}
	case isStatus && se.Status/100 == 4 && se.Code != api.CodeInterrupted:
		return &Error{Status: http.StatusBadRequest, Code: api.CodeRefused, Err: fmt.Errorf("VM %s: %v", r.Label(), err)}
	case stopping, isStatus && se.Code == api.CodeInterrupted:
		return &Error{Status: http.StatusConflict, Code: api.CodeInterrupted,
			Err: fmt.Errorf("VM %s was stopped or removed during the call, which ended it: %v", r.Label(), err)}
	case r.State != api.StateRunning:
		return &Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable,
			Err: fmt.Errorf("VM %s is %s: the call ended with it: %v%s", r.Label(), r.State, err, resumeHint(&r))}
	case isStatus:
		// The VM's process answered, with its own reason (its guest is
		// gone, its ledger failed): passed on as it is.
		return &Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Err: fmt.Errorf("VM %s: %v", r.Label(), err)}
	default:
		return &Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable,
			Err: fmt.Errorf("VM %s did not complete the call: its process stopped answering (see capsem logs %s): %v", r.Label(), r.Label(), err)}
	}
}

// ReadFile reads a file in a running VM, as JSON: at most
// api.MaxJSONFileBytes (ReadFileTo streams any size).
func (s *Service) ReadFile(ctx context.Context, ref string, req api.ReadFileRequest) (api.ReadFileResult, error) {
	if req.Path == "" {
		return api.ReadFileResult{}, badRequest("path is required")
	}
	if req.Encoding != "" && req.Encoding != "utf8" && req.Encoding != "base64" {
		return api.ReadFileResult{}, badRequest("encoding %q: want utf8 or base64", req.Encoding)
	}
	v, c, err := s.running(ref)
	if err != nil {
		return api.ReadFileResult{}, err
	}
	data, err := c.ReadFile(ctx, req.Path, !req.NoFollow, api.MaxJSONFileBytes)
	if err != nil {
		var se *apiclient.StatusError
		if errors.As(err, &se) && se.Status == http.StatusRequestEntityTooLarge {
			return api.ReadFileResult{}, refuse(http.StatusRequestEntityTooLarge,
				"%s is larger than the %d bytes a read as JSON returns: copy it with capsem cp (files/content streams any size)", req.Path, api.MaxJSONFileBytes)
		}
		return api.ReadFileResult{}, s.vmError(v, err)
	}
	if req.Encoding == "base64" {
		return api.ReadFileResult{Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64", Size: len(data)}, nil
	}
	if !utf8.Valid(data) {
		return api.ReadFileResult{}, badRequest("%s is not UTF-8 text (%d bytes): read it with encoding base64", req.Path, len(data))
	}
	return api.ReadFileResult{Content: string(data), Encoding: "utf8", Size: len(data)}, nil
}

// WriteFile writes a file in a running VM, from JSON: at most
// api.MaxJSONFileBytes (WriteFileFrom streams any size).
func (s *Service) WriteFile(ctx context.Context, ref string, req api.WriteFileRequest) error {
	if req.Path == "" {
		return badRequest("path is required")
	}
	if req.Mode > 0o777 {
		return badRequest("mode %o: want permission bits from 0 to 777", req.Mode)
	}
	data := []byte(req.Content)
	switch req.Encoding {
	case "", "utf8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(req.Content); err != nil {
			return badRequest("content is not base64: %v", err)
		}
	default:
		return badRequest("encoding %q: want utf8 or base64", req.Encoding)
	}
	if len(data) > api.MaxJSONFileBytes {
		return refuse(http.StatusRequestEntityTooLarge, "%d bytes, more than the %d a file write as JSON takes: copy it with capsem cp (files/content streams any size)", len(data), api.MaxJSONFileBytes)
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o644
	}
	v, c, err := s.running(ref)
	if err != nil {
		return err
	}
	if err := c.WriteFile(ctx, req.Path, data, mode); err != nil {
		return s.vmError(v, err)
	}
	return nil
}

// ReadFileTo streams a file of a running VM into w (a FileStream), whatever
// its size; max (when > 0) refuses a larger one.
func (s *Service) ReadFileTo(ctx context.Context, ref, path string, follow bool, max int64, w *api.FileStream) error {
	if path == "" {
		return badRequest("query parameter path is required")
	}
	v, c, err := s.running(ref)
	if err != nil {
		return err
	}
	if _, _, err := c.ReadFileTo(ctx, path, follow, max, w); err != nil {
		return s.vmError(v, err)
	}
	return nil
}

// WriteFileFrom streams r into a file of a running VM, whatever its size.
// abandon, when not nil, is called if the VM's process goes away during
// the transfer: it must unblock a read of r that waits on a slow sender,
// or the call would wait for that sender before it could answer.
func (s *Service) WriteFileFrom(ctx context.Context, ref, path string, mode uint32, r io.Reader, abandon func()) error {
	if path == "" {
		return badRequest("query parameter path is required")
	}
	if mode > 0o777 {
		return badRequest("mode %o: want permission bits from 0 to 777", mode)
	}
	v, c, err := s.running(ref)
	if err != nil {
		return err
	}
	s.mu.Lock()
	gone := v.gone
	s.mu.Unlock()
	if gone != nil && abandon != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-gone:
				abandon()
			case <-done:
			}
		}()
	}
	if _, err := c.WriteFileFrom(ctx, path, mode, r); err != nil {
		return s.vmError(v, err)
	}
	return nil
}

// Logs returns the tail of a VM's serial console and process log (grep
// keeps only the lines that contain it). It works on a stopped VM too.
func (s *Service) Logs(ref string, tail int, grep string) (api.LogsResult, error) {
	v, err := s.lookup(ref)
	if err != nil {
		return api.LogsResult{}, err
	}
	sess := s.sessionOf(v)
	serial, err := tailOrEmpty(sess.ConsoleLog(), tail, grep)
	if err != nil {
		return api.LogsResult{}, err
	}
	proc, err := tailOrEmpty(sess.ProcessLog(), tail, grep)
	if err != nil {
		return api.LogsResult{}, err
	}
	return api.LogsResult{Serial: serial, Process: proc}, nil
}

// ServiceLogs returns the tail of the service's own log.
func (s *Service) ServiceLogs(tail int, grep string) (api.LogsResult, error) {
	path, err := paths.ServiceLog()
	if err != nil {
		return api.LogsResult{}, err
	}
	text, err := tailOrEmpty(path, tail, grep)
	return api.LogsResult{Service: text}, err
}

func tailOrEmpty(path string, tail int, grep string) (string, error) {
	text, err := logs.Tail(path, tail, grep)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", badRequest("%v", err)
	}
	return text, nil
}

// maxInspectQueries bounds the inspect queries run at once, each holding up
// to an answer (api.MaxInspect* bound one).
const maxInspectQueries = 2

// Schema returns the CREATE TABLE statements of a VM's session ledger;
// with no VM, those of the ledger every new VM gets.
func (s *Service) Schema(ctx context.Context, ref string) (api.SchemaResult, error) {
	if ref == "" {
		return freshSchema(ctx)
	}
	v, err := s.lookup(ref)
	if err != nil {
		return api.SchemaResult{}, err
	}
	tables, err := ledger.Schema(ctx, s.sessionOf(v).DB())
	if err != nil {
		return api.SchemaResult{}, refuse(http.StatusNotFound, "session ledger: %v", err)
	}
	return api.SchemaResult{Tables: tables}, nil
}

// Inspect runs one read-only SQL statement on a VM's session ledger: rows,
// size and time bounded, and under an authorizer that reads that
// database's tables and nothing else (no ATTACH, no extensions, no writes,
// no writing pragmas, no temp tables). At most maxInspectQueries run at
// once; the others wait their turn.
func (s *Service) Inspect(ctx context.Context, ref string, req api.InspectRequest) (api.InspectResult, error) {
	if req.MaxRows == 0 {
		req.MaxRows = api.DefaultInspectRows
	}
	if req.MaxRows < 0 || req.MaxRows > api.MaxInspectRows {
		return api.InspectResult{}, badRequest("max_rows %d: want 1 to %d", req.MaxRows, api.MaxInspectRows)
	}
	v, err := s.lookup(ref)
	if err != nil {
		return api.InspectResult{}, err
	}
	select {
	case s.inspectSlots <- struct{}{}:
		defer func() { <-s.inspectSlots }()
	case <-ctx.Done():
		return api.InspectResult{}, ctx.Err()
	}
	res, err := ledger.Query(ctx, s.sessionOf(v).DB(), req.SQL, ledger.QueryLimits{
		MaxRows:        req.MaxRows,
		MaxCellBytes:   api.MaxInspectCellBytes,
		MaxAnswerBytes: api.MaxInspectAnswerBytes,
		Timeout:        api.InspectTimeout,
		MaxMemoryBytes: api.MaxInspectMemoryBytes,
	})
	if err != nil {
		return api.InspectResult{}, badRequest("%v", err)
	}
	out := api.InspectResult{Columns: res.Columns, Rows: res.Rows, CutCells: res.CutCells}
	switch res.Stopped {
	case ledger.StoppedRows:
		out.TruncatedBy = api.TruncatedByRows
	case ledger.StoppedBytes:
		out.TruncatedBy = api.TruncatedByBytes
	}
	if out.Rows == nil {
		out.Rows = [][]any{}
	}
	for _, row := range out.Rows {
		for i, c := range row {
			if cut, ok := c.(ledger.CutValue); ok {
				row[i] = api.CutCell{Cut: true, Bytes: cut.Bytes, Value: cut.Prefix}
			}
		}
	}
	out.Truncated = out.TruncatedBy != "" || out.CutCells > 0
	return out, nil
}

// Run boots an ephemeral VM, runs one command in it and removes the VM.
func (s *Service) Run(ctx context.Context, req api.RunRequest) (api.ExecResult, error) {
	var out api.ExecResult
	err := s.withRunVM(ctx, req, nil, func(ctx context.Context, vm api.VM) (err error) {
		out, err = s.Exec(ctx, vm.ID, req.Exec)
		return err
	})
	return out, err
}

// RunStream is Run with the command's output streamed: stage (when not
// nil) is told each stage of the VM's start; once the VM is ready, started
// is called with it and returns where stdout and stderr go (it is not
// called when the VM never became ready).
func (s *Service) RunStream(ctx context.Context, req api.RunRequest, stage func(string), started func(api.VM) (stdout, stderr io.Writer)) (*api.ExecEvent, error) {
	var ev *api.ExecEvent
	err := s.withRunVM(ctx, req, stage, func(ctx context.Context, vm api.VM) error {
		run, err := s.ExecStream(vm.ID, req.Exec)
		if err != nil {
			return err
		}
		stdout, stderr := started(vm)
		ev, err = run(ctx, stdout, stderr)
		return err
	})
	return ev, err
}

// withRunVM boots the ephemeral VM of a run, calls use with it and removes
// it before returning, whatever happened: cancelling ctx (the client went
// away) or EndRuns (the service stops) kills the command first.
func (s *Service) withRunVM(ctx context.Context, req api.RunRequest, stage func(string), use func(ctx context.Context, vm api.VM) error) error {
	if err := checkCommand(req.Exec); err != nil {
		return err
	}
	s.runsMu.Lock()
	if s.runsEnded {
		s.runsMu.Unlock()
		return refuse(http.StatusServiceUnavailable, "the capsem service is stopping")
	}
	s.runs.Add(1)
	s.runsMu.Unlock()
	defer s.runs.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.runsDone, cancel)()
	created, err := s.create(ctx, req.CreateRequest, true, stage)
	if err != nil {
		return err
	}
	defer s.Delete(context.WithoutCancel(ctx), created.ID)
	return use(ctx, created)
}

// EndRuns ends every run under way (their commands killed, their VMs
// removed) and waits, bounded by ctx, until they are; later runs
// are refused. A stopping service calls it: a run's client cannot outlive
// it.
func (s *Service) EndRuns(ctx context.Context) {
	s.runsMu.Lock()
	s.runsEnded = true
	s.runsMu.Unlock()
	s.endRuns()
	done := make(chan struct{})
	go func() {
		s.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.log.Warn("runs still ending as the service stops; the next service removes their VMs")
	}
}

// freshSchema is the schema of a new ledger, made in a scratch directory.
func freshSchema(ctx context.Context) (api.SchemaResult, error) {
	dir, err := os.MkdirTemp("", "capsem-schema-")
	if err != nil {
		return api.SchemaResult{}, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "session.db")
	l, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		return api.SchemaResult{}, err
	}
	if err := l.Close(); err != nil {
		return api.SchemaResult{}, err
	}
	tables, err := ledger.Schema(ctx, path)
	return api.SchemaResult{Tables: tables}, err
}

// Timeline returns a VM's ledger as one stream of events in time order
// (ledger.Timeline), running or not; it shares Inspect's turns.
func (s *Service) Timeline(ctx context.Context, ref string, req api.TimelineRequest) (api.TimelineResult, error) {
	if err := req.Check(); err != nil {
		return api.TimelineResult{}, badRequest("%v", err)
	}
	v, err := s.lookup(ref)
	if err != nil {
		return api.TimelineResult{}, err
	}
	select {
	case s.inspectSlots <- struct{}{}:
		defer func() { <-s.inspectSlots }()
	case <-ctx.Done():
		return api.TimelineResult{}, ctx.Err()
	}
	res, err := ledger.Timeline(ctx, s.sessionOf(v).DB(), req)
	if err != nil {
		return api.TimelineResult{}, refuse(http.StatusNotFound, "session ledger: %v", err)
	}
	return res, nil
}

// MCP sends one MCP request through a running VM's gateway as the host:
// its policy, servers and ledger, the row naming the host.
func (s *Service) MCP(ctx context.Context, ref string, req api.MCPCallRequest) (api.MCPCallResult, error) {
	if err := req.Check(); err != nil {
		return api.MCPCallResult{}, badRequest("%v", err)
	}
	v, c, err := s.running(ref)
	if err != nil {
		return api.MCPCallResult{}, err
	}
	out, err := c.MCP(ctx, req)
	if err != nil {
		return api.MCPCallResult{}, s.vmError(v, err)
	}
	return out, nil
}

// MCPServers lists a running VM's gateway's servers.
func (s *Service) MCPServers(ctx context.Context, ref string) (api.MCPServersResult, error) {
	v, c, err := s.running(ref)
	if err != nil {
		return api.MCPServersResult{}, err
	}
	out, err := c.MCPServers(ctx)
	if err != nil {
		return api.MCPServersResult{}, s.vmError(v, err)
	}
	return out, nil
}
