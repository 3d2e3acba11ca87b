package procs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RawIO reads and writes a non-blocking descriptor that Go's poller serves,
// but issues each read and write as a raw system call. An ordinary one
// tells the scheduler it may block (entersyscall), and when it takes longer
// than a sysmon tick (20 µs, common where system calls are slow, as in a
// nested VM) the runtime hands the P to another thread and takes it back
// after: futex wake-ups and context switches on every message, and sysmon
// polling at its fastest. A read or write of a non-blocking descriptor never
// blocks, so it does not need that: when it would, RawIO waits in the poller
// like any other Go I/O (deadlines and Close work as usual).
type RawIO struct {
	rc syscall.RawConn
}

// NewRawIO wraps c, which must be a descriptor in non-blocking mode (a Unix
// or TCP net.Conn, or an *os.File from os.Pipe or Pollable): a raw read of a
// blocking descriptor would stall the whole P.
func NewRawIO(c syscall.Conn) (*RawIO, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var flags int
	var ferr error
	if err := rc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		return nil, err
	}
	if ferr != nil {
		return nil, fmt.Errorf("reading the descriptor's flags: %w", ferr)
	}
	if flags&unix.O_NONBLOCK == 0 {
		return nil, errBlocking
	}
	return &RawIO{rc: rc}, nil
}

var errBlocking = errors.New("the descriptor is in blocking mode")

// RawReader returns r read through RawIO when r is a non-blocking
// descriptor, and r itself otherwise (a yamux stream, a blocking file, a
// buffer in a test).
func RawReader(r io.Reader) io.Reader {
	if raw := rawIO(r); raw != nil {
		return raw
	}
	return r
}

// RawWriter is RawReader's counterpart for writes.
func RawWriter(w io.Writer) io.Writer {
	if raw := rawIO(w); raw != nil {
		return raw
	}
	return w
}

func rawIO(x any) *RawIO {
	c, ok := x.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := NewRawIO(c)
	if err != nil {
		return nil
	}
	return raw
}

// Read reads into p; io.EOF at end of file.
func (r *RawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			r1, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			if e == syscall.EINTR {
				continue
			}
			n, errno = int(r1), e
			return e != syscall.EAGAIN
		}
	})
	switch {
	case err != nil:
		return 0, closedErr(err)
	case errno != 0:
		return 0, errno
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p.
func (r *RawIO) Write(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			rest := p[written:]
			r1, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&rest[0])), uintptr(len(rest)))
			switch e {
			case 0:
				written += int(r1)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = errno
	}
	return written, closedErr(err)
}

// closedErr maps the poller's error for a closed *os.File to os.ErrClosed,
// as os.File's own Read and Write do (internal/poll.ErrFileClosing is not
// exported; a closed socket already reports net.ErrClosed).
func closedErr(err error) error {
	if err != nil && err.Error() == "use of closed file" {
		return os.ErrClosed
	}
	return err
}
