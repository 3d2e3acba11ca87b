package vmhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/ledger"
)

// previewBytes is how much of each stream an exec_events row keeps.
const previewBytes = 4 << 10

// checkExec reports what makes req unusable, or nil.
func checkExec(req *api.ExecRequest) error {
	if (len(req.Argv) == 0) == (req.Command == "") {
		return errors.New("exactly one of argv and command must be given")
	}
	if req.TimeoutMS < 0 {
		return errors.New("timeout_ms must not be negative")
	}
	if _, ok := req.Env[envvars.TraceID.Name()]; ok {
		return fmt.Errorf("env %s is set from trace_id, not given", envvars.TraceID.Name())
	}
	return api.CheckTraceID(req.TraceID)
}

// previewWriter passes writes on and keeps the first previewBytes.
type previewWriter struct {
	mu      sync.Mutex
	w       io.Writer
	preview strings.Builder
}

func (p *previewWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	if room := previewBytes - p.preview.Len(); room > 0 {
		p.preview.Write(b[:min(room, len(b))])
	}
	p.mu.Unlock()
	return p.w.Write(b)
}

func (p *previewWriter) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.preview.String()
}

// Exec runs req in the guest, streaming its output to stdout and stderr as
// it comes, and returns the final event (exit status, or why it failed).
// The command is an exec_events row before it starts (pending, durable),
// completed in place when it ends: a command that runs is in the ledger
// even if this process dies meanwhile, and one that could not be recorded
// does not run. Cancelling ctx kills the guest command.
func (v *VM) Exec(ctx context.Context, req *api.ExecRequest, stdout, stderr io.Writer) api.ExecEvent {
	if why := v.unresponsive(); why != "" {
		return api.ExecEvent{Error: fmt.Sprintf("the guest does not answer (%s); commands run again as soon as it does", why), Code: api.CodeUnavailable}
	}
	command := req.Command
	if command == "" {
		command = strings.Join(req.Argv, " ")
	}
	row := &ledger.ExecEvent{Command: command, Source: "api", Pending: true, TraceID: req.TraceID}
	// Not cancelled with ctx: a caller leaving during the commit would
	// leave the row pending for a command that never ran.
	if err := v.ledger.Write(context.WithoutCancel(ctx), row); err != nil {
		v.log.Error("exec_events row not written; the command does not run", "err", err)
		return api.ExecEvent{Error: fmt.Sprintf("the command was not run: recording it in the ledger failed: %v", err), Code: api.CodeUnavailable}
	}
	out, errOut := &previewWriter{w: stdout}, &previewWriter{w: stderr}
	start := time.Now()
	env := req.Env
	if req.TraceID != "" {
		v.tracedExecs.Add(1)
		defer v.tracedExecs.Add(-1)
		env = maps.Clone(req.Env)
		if env == nil {
			env = map[string]string{}
		}
		env[envvars.TraceID.Name()] = req.TraceID
	}
	res, err := v.control().Exec(ctx, &guestwire.Exec{Argv: req.Argv, Shell: req.Command, Env: env, Cwd: v.execCwd(req.Cwd), TimeoutMS: req.TimeoutMS}, out, errOut)
	row.Pending = false
	row.DurationMS = time.Since(start).Milliseconds()
	row.StdoutPreview, row.StderrPreview = out.String(), errOut.String()
	final := api.ExecEvent{Done: true}
	if err != nil {
		err = v.cutOff(ctx, err)
		final = api.ExecEvent{Error: err.Error(), Code: codeOf(guestErrorStatus(err))}
		row.StderrPreview = "exec failed: " + err.Error()
	} else {
		final.ExitCode, final.Signal, final.TimedOut = res.ExitCode, res.Signal, res.TimedOut
		final.StdoutTruncated, final.StderrTruncated = res.StdoutTruncated, res.StderrTruncated
		final.StdoutBytes, final.StderrBytes, final.DurationMS = res.StdoutBytes, res.StderrBytes, res.DurationMS
		code := int64(res.ExitCode)
		row.ExitCode = &code
		row.StdoutBytes, row.StderrBytes = res.StdoutBytes, res.StderrBytes
		row.Truncated = res.StdoutTruncated || res.StderrTruncated
		row.TimedOut = res.TimedOut
	}
	if lerr := v.ledger.Write(context.WithoutCancel(ctx), row); lerr != nil {
		v.log.Error("exec_events row not completed", "err", lerr)
	}
	return final
}

// execCwd is an exec's or a shell's working directory: its own, else the workspace
// when it is a host directory (what the user's agent works on), else the
// guest's default.
func (v *VM) execCwd(cwd string) string {
	if cwd == "" && v.opts.Workspace != "" {
		return guestwire.GuestWorkspace
	}
	return cwd
}
