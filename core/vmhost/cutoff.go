package vmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/capsem/capsem/core/guestctl"
)

// A call in flight when the guest connection closes was cut off, either by
// the VM's stop (the service's stop or delete asked for it) or by the
// guest going away on its own: a kernel panic or a power-off inside it
// ends QEMU (the kernel runs with panic=-1, QEMU with -no-reboot). The
// caller is told which, and of a panic, the kernel's own line about it.

// guestGoneWait bounds how long a cut-off call waits to learn whether its
// guest is gone for good: QEMU exits milliseconds after a panic, while an
// agent that only dropped its connection connects again and the VM lives.
const guestGoneWait = 2 * time.Second

// panicScanBytes is how much of the end of the console log is searched for
// the kernel's panic line (the stack dump after it is a few KiB).
const panicScanBytes = 64 << 10

// maxPanicLine bounds the panic line quoted in an error: the guest writes
// the console, and could make the line as long as it likes.
const maxPanicLine = 200

// cutError is a call cut off by the VM's stop (409) or by its guest going
// away (503).
type cutError struct {
	status int
	err    error
}

func (e *cutError) Error() string { return e.err.Error() }
func (e *cutError) Unwrap() error { return e.err }

// cutOff is err, the failure of a call in flight, as a cutError when the
// guest connection closed under it because the VM is stopping or its guest
// went away; any other failure comes back as it is. A call whose caller
// left is not explained: nobody is waiting for the reason.
func (v *VM) cutOff(ctx context.Context, err error) error {
	if !errors.Is(err, guestctl.ErrClosed) || ctx.Err() != nil {
		return err
	}
	if !v.guestLost() && v.stopping.Load() {
		return &cutError{status: http.StatusConflict, err: err}
	}
	wait, cancel := context.WithTimeout(ctx, guestGoneWait)
	defer cancel()
	select {
	case <-v.lost:
	case <-v.machine.Done():
	case <-v.stopped:
	case <-wait.Done():
	}
	switch {
	case v.guestLost() || (isDone(v.machine.Done()) && !v.stopping.Load()):
		// The console is whole once QEMU is gone (the machine's done
		// waits for its last output): wait for that, within the bound.
		select {
		case <-v.machine.Done():
		case <-wait.Done():
		}
		why := "the guest's channel closed during the call"
		switch line := v.consolePanic(); {
		case line != "":
			why = fmt.Sprintf("the guest's kernel panicked during the call (%s)", line)
		case isDone(v.machine.Done()):
			why = "QEMU exited during the call (the guest powered off or crashed, or QEMU was killed; the console log has the guest's last output)"
		}
		return &cutError{status: http.StatusServiceUnavailable, err: fmt.Errorf("%s, which stopped the VM: %w", why, err)}
	case v.stopping.Load():
		return &cutError{status: http.StatusConflict, err: err}
	}
	return err
}

// guestLost says the guest went away on its own (see lost).
func (v *VM) guestLost() bool { return isDone(v.lost) }

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// consoleSize is the console log's size before the machine writes it: a
// VM's console log goes on across its boots, and only this boot's output
// tells of its end.
func consoleSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// consolePanic is the kernel's panic line in this boot's console output
// ("Kernel panic - not syncing: ..."), or "" when it printed none. The
// guest writes the console: the line is bounded here, and escaped where
// it is printed (core/printable).
func (v *VM) consolePanic() string {
	const marker = "Kernel panic - not syncing: "
	f, err := os.Open(v.session.ConsoleLog())
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	from := v.consoleStart
	if fi.Size() < from {
		from = 0 // rotated since the boot began: all of it is this boot's
	}
	from = max(from, fi.Size()-panicScanBytes)
	b, err := io.ReadAll(io.NewSectionReader(f, from, fi.Size()-from))
	if err != nil {
		return ""
	}
	i := bytes.LastIndex(b, []byte(marker))
	if i < 0 {
		return ""
	}
	line, _, _ := bytes.Cut(b[i:], []byte("\n"))
	line = bytes.TrimRight(line, "\r")
	if len(line) > maxPanicLine {
		line = line[:maxPanicLine]
	}
	return string(line)
}
