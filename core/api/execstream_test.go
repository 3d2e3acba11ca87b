package api

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// pipeResponse is an http.ResponseWriter onto a pipe, as the per-VM
// process's response reaches its client.
type pipeResponse struct {
	w      *io.PipeWriter
	header http.Header
}

func (p *pipeResponse) Header() http.Header         { return p.header }
func (p *pipeResponse) WriteHeader(int)             {}
func (p *pipeResponse) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeResponse) Flush()                      {}

// BenchmarkExecStream is the host's cost of an exec's output through the
// API: the per-VM process writing 256 KiB output pieces as events, and the
// client reading them back, each on its goroutine.
func BenchmarkExecStream(b *testing.B) {
	piece := bytes.Repeat([]byte{'x'}, 256<<10)
	const pieces = 40 // 10 MiB, the bench's exec output
	b.SetBytes(pieces * int64(len(piece)))
	for b.Loop() {
		r, w := io.Pipe()
		go func() {
			s := NewExecStream(&pipeResponse{w: w, header: http.Header{}})
			for range pieces {
				s.Stdout().Write(piece)
			}
			s.Final(ExecEvent{Done: true})
			w.Close()
		}()
		if _, err := ReadExecStream(r, io.Discard, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestOutputEventsAreJSON: an output event written by hand is, byte for
// byte, what encoding/json writes for it, so every reader of the stream
// reads it as before.
func TestOutputEventsAreJSON(t *testing.T) {
	for _, size := range []int{1, 2, 3, 4, 100, 4095, 4096, 256 << 10} {
		data := make([]byte, size)
		rand.Read(data)
		for _, stream := range []string{"stdout", "stderr"} {
			want, err := json.Marshal(ExecEvent{Stream: stream, Data: data})
			if err != nil {
				t.Fatal(err)
			}
			if got := appendOutputEvent(nil, stream, data); !bytes.Equal(got, append(want, '\n')) {
				t.Fatalf("%d bytes of %s: wrote %.80q, encoding/json writes %.80q", size, stream, got, want)
			}
		}
	}
}

// TestExecStreamRoundTrip: output in pieces, empty ones and special bytes
// included, and the final event come back as written.
func TestExecStreamRoundTrip(t *testing.T) {
	var pieces [][]byte
	for _, size := range []int{0, 1, 2, 3, 1000, 64 << 10} {
		p := make([]byte, size)
		rand.Read(p)
		pieces = append(pieces, p)
	}
	pieces = append(pieces, []byte("\n\r\"\\</script>\x00\xff"))
	r, w := io.Pipe()
	go func() {
		s := NewExecStream(&pipeResponse{w: w, header: http.Header{}})
		for i, p := range pieces {
			if i%2 == 0 {
				s.Stdout().Write(p)
			} else {
				s.Stderr().Write(p)
			}
		}
		s.Final(ExecEvent{Done: true, ExitCode: 3, StdoutBytes: 7})
		w.Close()
	}()
	var stdout, stderr bytes.Buffer
	ev, err := ReadExecStream(r, &stdout, &stderr)
	if err != nil || !ev.Done || ev.ExitCode != 3 || ev.StdoutBytes != 7 {
		t.Fatalf("final event %+v, %v", ev, err)
	}
	var wantOut, wantErr []byte
	for i, p := range pieces {
		if i%2 == 0 {
			wantOut = append(wantOut, p...)
		} else {
			wantErr = append(wantErr, p...)
		}
	}
	if !bytes.Equal(stdout.Bytes(), wantOut) || !bytes.Equal(stderr.Bytes(), wantErr) {
		t.Fatalf("stdout %d bytes (want %d), stderr %d (want %d)", stdout.Len(), len(wantOut), stderr.Len(), len(wantErr))
	}
}

// FuzzParseOutputEvent: a line read by hand is read exactly as
// encoding/json reads it; what the hand reader turns down is left to it.
func FuzzParseOutputEvent(f *testing.F) {
	f.Add([]byte(`{"stream":"stdout","data":"aGVsbG8=","exit_code":0}`))
	f.Add([]byte(`{"stream":"stderr","data":"AA==","exit_code":0}`))
	f.Add([]byte(`{"stream":"stdout","data":"aGVs\nbG8=","exit_code":0}`))
	f.Add([]byte(`{"stream":"stdout","data":"aGVsbG8","exit_code":0}`))
	f.Add([]byte(`{"stream":"stdout","data":"","exit_code":0}`))
	f.Add([]byte(`{"stream":"stdin","data":"aGVsbG8=","exit_code":0}`))
	f.Add([]byte(`{"done":true,"exit_code":1}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		stream, data, ok := parseOutputEvent(line)
		if !ok {
			return
		}
		var ev ExecEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("read by hand as %s %q, but encoding/json refuses it: %v", stream, data, err)
		}
		if ev.Stream != stream || !bytes.Equal(ev.Data, data) || ev.Done || ev.Error != "" || ev.ExitCode != 0 {
			t.Fatalf("read by hand as %s %q, encoding/json reads %+v", stream, data, ev)
		}
	})
}
