package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// The exec stream is NDJSON: one ExecEvent per line, output chunks as they
// come, then exactly one final event (Done, or Error). The per-VM process
// and the service both speak it.

// ExecStream writes an exec stream to an HTTP response, flushing each
// event. Its Stdout and Stderr are safe for concurrent use.
type ExecStream struct {
	mu sync.Mutex
	w  http.ResponseWriter
}

// NewExecStream starts the stream's response.
func NewExecStream(w http.ResponseWriter) *ExecStream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &ExecStream{w: w}
}

// Stdout and Stderr write output chunks of the command's streams.
func (s *ExecStream) Stdout() io.Writer { return streamWriter{s, "stdout"} }
func (s *ExecStream) Stderr() io.Writer { return streamWriter{s, "stderr"} }

// Final writes the final event.
func (s *ExecStream) Final(ev ExecEvent) { s.write(ev) }

// Ready writes the event of a run's stream that says its VM is ready.
func (s *ExecStream) Ready(vm VM) { s.write(ExecEvent{VM: &vm}) }

// Stage writes a stage of the VM's start.
func (s *ExecStream) Stage(stage string) { s.write(ExecEvent{Stage: stage}) }

func (s *ExecStream) write(ev ExecEvent) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		return err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

type streamWriter struct {
	s      *ExecStream
	stream string
}

func (w streamWriter) Write(p []byte) (int, error) {
	if err := w.s.write(ExecEvent{Stream: w.stream, Data: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// maxExecEventLine bounds one event of a stream (an output chunk is far
// smaller).
const maxExecEventLine = 16 << 20

// ReadExecStream reads an exec stream from r, writing output to stdout and
// stderr (either may be nil) as it comes, and returns the final event; a
// final event with Error is also an error.
func ReadExecStream(r io.Reader, stdout, stderr io.Writer) (*ExecEvent, error) {
	return ReadRunStream(r, RunEvents{}, stdout, stderr)
}

// RunEvents are what a run's or a create's stream tells besides output:
// each is called when not nil.
type RunEvents struct {
	// Stage is called with each stage of the VM's start.
	Stage func(stage string)
	// Ready is called with the VM once it is ready.
	Ready func(VM)
}

// ReadRunStream is ReadExecStream for a run's stream.
func ReadRunStream(r io.Reader, events RunEvents, stdout, stderr io.Writer) (*ExecEvent, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxExecEventLine)
	for sc.Scan() {
		var ev ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("exec stream: bad event: %w", err)
		}
		switch {
		case ev.Error != "":
			return &ev, errors.New(ev.Error)
		case ev.Done:
			return &ev, nil
		case ev.VM != nil:
			if events.Ready != nil {
				events.Ready(*ev.VM)
			}
		case ev.Stage != "":
			if events.Stage != nil {
				events.Stage(ev.Stage)
			}
		case ev.Stream == "stdout" && stdout != nil:
			stdout.Write(ev.Data)
		case ev.Stream == "stderr" && stderr != nil:
			stderr.Write(ev.Data)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("exec stream: %w", err)
	}
	return nil, errors.New("exec stream: ended without a result")
}

// ReadCreateStream reads a create's stream: stages, then the VM (its
// last event), or an error.
func ReadCreateStream(r io.Reader, stage func(string)) (VM, error) {
	var vm *VM
	_, err := ReadRunStream(r, RunEvents{Stage: stage, Ready: func(v VM) { vm = &v }}, nil, nil)
	if vm != nil {
		return *vm, nil
	}
	return VM{}, err
}
