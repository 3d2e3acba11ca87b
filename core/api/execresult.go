package api

import (
	"bytes"
	"time"
)

// MaxExecOutput bounds each of an exec's streams in an ExecResult; the
// rest is counted, not kept, and the result says it was cut.
const MaxExecOutput = 1 << 20

// ExecOutput collects one stream of a command for an ExecResult: the first
// MaxExecOutput bytes written to it.
type ExecOutput struct {
	buf bytes.Buffer
	cut bool
}

func (o *ExecOutput) Write(p []byte) (int, error) {
	if room := MaxExecOutput - o.buf.Len(); room < len(p) {
		o.cut = true
		o.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	o.buf.Write(p)
	return len(p), nil
}

// ResultOf is the result of a command whose stream ended with ev, its
// output collected in stdout and stderr, which took took by the caller's
// clock (the guest's measure, when ev has one, wins).
func ResultOf(ev *ExecEvent, stdout, stderr *ExecOutput, took time.Duration) ExecResult {
	ms := ev.DurationMS
	if ms <= 0 {
		ms = took.Milliseconds()
	}
	return ExecResult{Stdout: stdout.buf.String(), Stderr: stderr.buf.String(), ExitCode: ev.ExitCode, Signal: ev.Signal,
		TimedOut: ev.TimedOut, StdoutTruncated: ev.StdoutTruncated || stdout.cut, StderrTruncated: ev.StderrTruncated || stderr.cut,
		DurationMS: ms}
}
