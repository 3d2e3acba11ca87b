package procs

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func rawPipe(t *testing.T) (r, w *os.File, rr, rw *RawIO) {
	t.Helper()
	r, w, err := os.Pipe() // Go makes its own ends non-blocking
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	if rr, err = NewRawIO(r); err != nil {
		t.Fatal(err)
	}
	if rw, err = NewRawIO(w); err != nil {
		t.Fatal(err)
	}
	return r, w, rr, rw
}

// A write larger than the pipe buffer fills it, waits in the poller for the
// reader, and arrives whole and in order.
func TestRawIOMovesDataThroughAPipe(t *testing.T) {
	_, w, rr, rw := rawPipe(t)
	want := make([]byte, 4<<20) // the pipe holds 64 KiB: the writer must wait
	for i := range want {
		want[i] = byte(i * 7)
	}
	errc := make(chan error, 1)
	go func() {
		n, err := rw.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		w.Close()
		errc <- err
	}()
	got, err := io.ReadAll(rr)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(want))
	}
}

// An idle read waits in the poller, so a deadline ends it and Close wakes it.
func TestRawIOReadHonoursDeadlineAndClose(t *testing.T) {
	r, _, rr, _ := rawPipe(t)
	r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := rr.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the deadline did not end the read")
	}
	r.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() { _, err := rr.Read(make([]byte, 10)); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	r.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the read")
	}
}

// Writing to a pipe whose reader is gone reports EPIPE (Go ignores SIGPIPE
// for descriptors other than stdout and stderr).
func TestRawIOWriteReportsABrokenPipe(t *testing.T) {
	r, _, _, rw := rawPipe(t)
	r.Close()
	if _, err := rw.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to a closed pipe: %v", err)
	}
}

func TestRawIOOverAUnixSocket(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo
	}()
	c, err := net.Dial("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, w := RawReader(c), RawWriter(c)
	if _, ok := r.(*RawIO); !ok {
		t.Fatalf("a Unix socket is read through %T, not RawIO", r)
	}
	if _, ok := w.(*RawIO); !ok {
		t.Fatalf("a Unix socket is written through %T, not RawIO", w)
	}
	msg := []byte("hello through raw system calls")
	if _, err := w.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(r, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo %q, %v", got, err)
	}
	c.(*net.UnixConn).CloseWrite()
	if n, err := r.Read(got); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v", n, err)
	}
	c.Close()
	if _, err := w.Write(msg); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
	if _, err := r.Read(got); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after Close: %v, want net.ErrClosed", err)
	}
}

// A blocking descriptor is refused (a raw read would stall the P), and
// RawReader/RawWriter fall back to the value they were given.
func TestRawIORefusesBlockingDescriptors(t *testing.T) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	r := os.NewFile(uintptr(fds[0]), "r") // blocking: NewFile keeps the mode
	w := os.NewFile(uintptr(fds[1]), "w")
	defer r.Close()
	defer w.Close()
	if _, err := NewRawIO(r); !errors.Is(err, errBlocking) {
		t.Fatalf("NewRawIO of a blocking pipe: %v", err)
	}
	if got := RawReader(r); got != io.Reader(r) {
		t.Fatalf("RawReader of a blocking pipe is %T", got)
	}
	if got := RawWriter(w); got != io.Writer(w) {
		t.Fatalf("RawWriter of a blocking pipe is %T", got)
	}
	var buf bytes.Buffer
	if got := RawReader(&buf); got != io.Reader(&buf) {
		t.Fatalf("RawReader of a buffer is %T", got)
	}
}
