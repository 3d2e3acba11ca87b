package procs

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func nonblocking(t *testing.T, fd uintptr) bool {
	t.Helper()
	flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFL, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	return flags&syscall.O_NONBLOCK != 0
}

func TestPollableTurnsABlockingPipeIntoAPolledFile(t *testing.T) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil { // blocking, as a child inherits it
		t.Fatal(err)
	}
	w := os.NewFile(uintptr(fds[1]), "w")
	defer w.Close()
	if nonblocking(t, uintptr(fds[0])) {
		t.Fatal("the test pipe starts non-blocking")
	}
	// The raw descriptor is handed over whole, so exactly one *os.File owns it.
	p, undo := pollableFD(uintptr(fds[0]), "r")
	if p == nil {
		t.Fatal("a pipe was not made pollable")
	}
	defer p.Close()
	// Only a file in the poller supports deadlines, so this read returns at
	// the deadline instead of blocking the thread.
	if err := p.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatalf("the returned file is not pollable: %v", err)
	}
	if _, err := p.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on an empty pollable pipe: %v, want a deadline error", err)
	}
	p.SetReadDeadline(time.Time{})
	w.Write([]byte("x"))
	if b := make([]byte, 1); func() bool { n, err := p.Read(b); return n != 1 || err != nil || b[0] != 'x' }() {
		t.Fatal("data written to the pipe did not arrive")
	}
	if !nonblocking(t, uintptr(fds[0])) {
		t.Fatal("descriptor not in non-blocking mode")
	}
	undo()
	if nonblocking(t, uintptr(fds[0])) {
		t.Fatal("undo left the descriptor non-blocking")
	}
}

func TestPollableLeavesRegularFilesAlone(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "plain"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, undo := Pollable(f)
	defer undo()
	if p != f || nonblocking(t, f.Fd()) {
		t.Fatal("a regular file was changed")
	}
}
