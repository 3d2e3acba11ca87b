package agent

import (
	"bytes"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

func testBuffers(n, count int) [][]byte {
	bufs := make([][]byte, count)
	for i := range bufs {
		bufs[i] = make([]byte, n)
	}
	return bufs
}

func TestPipeline(t *testing.T) {
	src := bytes.Repeat([]byte("0123456789abcdef"), 1000) // not a multiple of the buffer
	readErr := errors.New("the disk failed")
	writeErr := errors.New("the stream broke")
	tests := []struct {
		name      string
		failRead  int // the read (1-based) that fails after filling, 0: none
		failWrite int // the write (1-based) that fails, 0: none
		want      error
		wantBytes int
	}{
		{name: "whole", wantBytes: len(src)},
		{name: "read fails", failRead: 3, want: readErr, wantBytes: 3 * 1000},
		{name: "write fails", failWrite: 2, want: writeErr, wantBytes: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bytes.NewReader(src)
			reads := 0
			var out bytes.Buffer
			writes := 0
			var released atomic.Int32
			err := pipeline(testBuffers(1000, 3), func() { released.Add(1) }, func(b []byte) (int, error) {
				reads++
				n, err := fill(r, b)
				if reads == tt.failRead {
					return n, readErr
				}
				return n, err
			}, func(p []byte) error {
				writes++
				if writes == tt.failWrite {
					return writeErr
				}
				out.Write(p)
				return nil
			})
			if !errors.Is(err, tt.want) {
				t.Fatalf("pipeline: %v, want %v", err, tt.want)
			}
			if out.Len() != tt.wantBytes || !bytes.Equal(out.Bytes(), src[:out.Len()]) {
				t.Fatalf("wrote %d bytes (in order: %v), want %d", out.Len(), bytes.Equal(out.Bytes(), src[:out.Len()]), tt.wantBytes)
			}
			waitReleased(t, &released)
		})
	}
}

// A write that fails while the reader is blocked must not wait for the
// reader, and the buffers are released only once the reader is out.
func TestPipelineReleasesAfterABlockedReader(t *testing.T) {
	pr, pw := io.Pipe()
	var released atomic.Int32
	first := true
	done := make(chan error, 1)
	go func() {
		done <- pipeline(testBuffers(8, 2), func() { released.Add(1) }, func(b []byte) (int, error) {
			if first {
				first = false
				return copy(b, "piece"), nil
			}
			return pr.Read(b) // blocks until the pipe is closed
		}, func([]byte) error { return errors.New("the stream broke") })
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("pipeline succeeded past a failed write")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pipeline waited for a blocked reader")
	}
	time.Sleep(20 * time.Millisecond)
	if released.Load() != 0 {
		t.Fatal("buffers released while the reader still reads into one")
	}
	pw.CloseWithError(io.ErrClosedPipe)
	waitReleased(t, &released)
}

func waitReleased(t *testing.T, released *atomic.Int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for released.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	if got := released.Load(); got != 1 {
		t.Fatalf("released %d times, want once", got)
	}
}
