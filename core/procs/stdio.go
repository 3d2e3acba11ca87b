package procs

import (
	"os"
	"syscall"
)

// PollableStdio returns stdin and stdout as files Go's network poller
// serves, when they are pipes or sockets (how an MCP client or the endpoint
// starts us). A child inherits its stdio in blocking mode, and Go then reads
// it with a blocking system call: the runtime may hand the P to another
// thread while the read waits and take it back when it returns, extra thread
// wake-ups per message. In non-blocking mode a read parks the goroutine in
// the poller instead. Restore puts the blocking mode back, because the file
// description may outlive us.
func PollableStdio() (in, out *os.File, restore func()) {
	in, undoIn := Pollable(os.Stdin)
	out, undoOut := Pollable(os.Stdout)
	return in, out, func() { undoIn(); undoOut() }
}

// Pollable returns f as a pollable file if it is a pipe or a socket, and f
// itself otherwise (a terminal or a regular file is left alone). Undo
// restores the descriptor's blocking mode. The new file shares f's
// descriptor, so it is meant for files that live as long as the process,
// such as os.Stdin.
func Pollable(f *os.File) (pollable *os.File, undo func()) {
	// Fd puts f in blocking mode, the state undo restores.
	if p, undo := pollableFD(f.Fd(), f.Name()); p != nil {
		return p, undo
	}
	return f, func() {}
}

// pollableFD makes fd non-blocking and wraps it, if it is a pipe or a
// socket; otherwise it returns nil and changes nothing.
func pollableFD(fd uintptr, name string) (*os.File, func()) {
	var st syscall.Stat_t
	if syscall.Fstat(int(fd), &st) != nil {
		return nil, nil
	}
	if kind := st.Mode & syscall.S_IFMT; kind != syscall.S_IFIFO && kind != syscall.S_IFSOCK {
		return nil, nil
	}
	if syscall.SetNonblock(int(fd), true) != nil {
		return nil, nil
	}
	// NewFile of a non-blocking descriptor yields a pollable *os.File.
	return os.NewFile(fd, name), func() { _ = syscall.SetNonblock(int(fd), false) }
}
