package agent

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestOutputPipeIsLarge: an exec's output pipe holds outputPipeSize, so
// the pump finds pieces as large as its buffer.
func TestOutputPipeIsLarge(t *testing.T) {
	r, w, err := outputPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rc, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	rc.Control(func(fd uintptr) { size, err = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0) })
	if err != nil || size < outputPipeSize {
		t.Fatalf("the pipe holds %d bytes (%v), want at least %d", size, err, outputPipeSize)
	}
}
