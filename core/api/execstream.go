package api

import (
	"bufio"
	"bytes"
	"encoding/base64"
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
	mu   sync.Mutex
	w    http.ResponseWriter
	line []byte // an output event's line, reused
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
	if len(p) == 0 {
		if err := w.s.write(ExecEvent{Stream: w.stream}); err != nil {
			return 0, err
		}
		return 0, nil
	}
	s := w.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.line = appendOutputEvent(s.line[:0], w.stream, p)
	if _, err := s.w.Write(s.line); err != nil {
		return 0, err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	if cap(s.line) > 1<<20 {
		s.line = nil // do not pin a huge piece's line
	}
	return len(p), nil
}

// An exec's output events are all of one shape and the bulk of a busy
// stream, so they are written and read by hand, byte for byte what
// encoding/json makes of ExecEvent{Stream, Data} (a test holds them to
// it), at the cost of base64 alone. Every other event, and anything that
// is not exactly of this shape, goes through encoding/json.
const (
	outputEventStream = `{"stream":"`
	outputEventData   = `","data":"`
	outputEventEnd    = `","exit_code":0}`
)

// appendOutputEvent appends the line of an output event of stream
// ("stdout" or "stderr") carrying data (not empty).
func appendOutputEvent(dst []byte, stream string, data []byte) []byte {
	dst = append(dst, outputEventStream...)
	dst = append(dst, stream...)
	dst = append(dst, outputEventData...)
	dst = base64.StdEncoding.AppendEncode(dst, data)
	dst = append(dst, outputEventEnd...)
	return append(dst, '\n')
}

// parseOutputEvent reads a line of appendOutputEvent's exact shape; ok is
// false for any other line, which is then encoding/json's to read.
func parseOutputEvent(line []byte) (stream string, data []byte, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte(outputEventStream))
	if !ok {
		return "", nil, false
	}
	switch {
	case bytes.HasPrefix(rest, []byte("stdout")):
		stream = "stdout"
	case bytes.HasPrefix(rest, []byte("stderr")):
		stream = "stderr"
	default:
		return "", nil, false
	}
	rest, ok = bytes.CutPrefix(rest[len(stream):], []byte(outputEventData))
	if !ok {
		return "", nil, false
	}
	encoded, ok := bytes.CutSuffix(rest, []byte(outputEventEnd))
	if !ok || len(encoded) == 0 {
		return "", nil, false
	}
	// Only base64's own alphabet: the decoder would skip line breaks,
	// which a JSON string cannot hold raw.
	for _, c := range encoded {
		if !isBase64Char(c) {
			return "", nil, false
		}
	}
	data = make([]byte, base64.StdEncoding.DecodedLen(len(encoded)))
	n, err := base64.StdEncoding.Decode(data, encoded)
	if err != nil {
		return "", nil, false
	}
	return stream, data[:n], true
}

func isBase64Char(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '='
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
		if stream, data, ok := parseOutputEvent(sc.Bytes()); ok {
			switch {
			case stream == "stdout" && stdout != nil:
				stdout.Write(data)
			case stream == "stderr" && stderr != nil:
				stderr.Write(data)
			}
			continue
		}
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
