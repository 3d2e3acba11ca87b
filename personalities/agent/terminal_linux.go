package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestwire"
)

// ServeTerminals serves interactive terminal sessions (the host's capsem
// shell) on ln until ctx ends: each connection gets a program, by default
// a login shell, on a pseudo-terminal of its own, as the leader of a new
// session with the terminal as its controlling tty, so Ctrl-C and window
// resizes reach it as on any terminal.
func (s *Server) ServeTerminals(ctx context.Context, ln net.Listener) {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			if err := s.terminal(ctx, c); err != nil {
				s.log().Warn("terminal session", "err", err)
			}
		}()
	}
}

func (s *Server) terminal(ctx context.Context, c net.Conn) error {
	var buf []byte
	kind, p, err := guestwire.ReadTermFrame(c, &buf)
	if err != nil {
		return err
	}
	if kind != guestwire.TermOpenKind {
		return errors.New("a terminal session must start with an open frame")
	}
	open, err := guestwire.ParseTermOpen(p)
	if err != nil {
		return err
	}
	env := s.execEnv(open.Env)
	argv := open.Argv
	if len(argv) == 0 {
		// The root's own shell (the full root says bash), as a login.
		argv = []string{"/bin/sh", "-l"}
		for _, kv := range env {
			if sh, ok := strings.CutPrefix(kv, "SHELL="); ok && strings.HasPrefix(sh, "/") {
				argv[0] = sh
			}
		}
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return s.termFail(c, err)
	}
	cwd := open.Cwd
	if cwd == "" {
		cwd = s.defaultCwd()
	}
	ptmx, tty, err := pty.Open()
	if err != nil {
		return s.termFail(c, err)
	}
	defer ptmx.Close()
	if open.Rows > 0 && open.Cols > 0 {
		pty.Setsize(ptmx, &pty.Winsize{Rows: open.Rows, Cols: open.Cols})
	}
	attr := &syscall.ProcAttr{Dir: cwd, Env: env, Files: []uintptr{tty.Fd(), tty.Fd(), tty.Fd()},
		Sys: &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}}
	pid, exited, err := s.Reaper.Start(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	tty.Close()
	if err != nil {
		return s.termFail(c, execError(path, err))
	}
	s.log().Info("terminal session started", "pid", pid, "argv0", argv[0])

	var wmu sync.Mutex
	send := func(kind byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return guestwire.WriteTermFrame(c, kind, p)
	}
	// The terminal's output, until the session's processes close it.
	output := make(chan struct{})
	go func() {
		defer close(output)
		b := make([]byte, 32<<10)
		for {
			n, err := ptmx.Read(b)
			if n > 0 && send(guestwire.TermDataKind, b[:n]) != nil {
				return
			}
			if err != nil {
				return
			}
		}
	}()
	// The host's keystrokes and resizes. When the host goes away, the
	// session is hung up, as a closed terminal does.
	go func() {
		var buf []byte
		for {
			kind, p, err := guestwire.ReadTermFrame(c, &buf)
			if err != nil {
				unix.Kill(-pid, unix.SIGHUP)
				return
			}
			switch kind {
			case guestwire.TermDataKind:
				if _, err := ptmx.Write(p); err != nil {
					return
				}
			case guestwire.TermResizeKind:
				if rows, cols, err := guestwire.ParseResize(p); err == nil {
					pty.Setsize(ptmx, &pty.Winsize{Rows: rows, Cols: cols})
				}
			}
		}
	}()
	var ws unix.WaitStatus
	select {
	case ws = <-exited:
	case <-ctx.Done():
		unix.Kill(-pid, unix.SIGKILL)
		ws = <-exited
	}
	// What the shell wrote last is still in the terminal: drain it (the
	// read ends with EIO once no process holds the terminal open). A
	// background job that keeps it open is not waited for long: the
	// session is over, and its processes are killed.
	select {
	case <-output:
	case <-time.After(termDrain):
		unix.Kill(-pid, unix.SIGKILL)
		ptmx.Close()
		<-output
	}
	code := int32(ws.ExitStatus())
	if ws.Signaled() {
		code = 128 + int32(ws.Signal())
	}
	return send(guestwire.TermExitKind, guestwire.ExitPayload(code))
}

// termDrain bounds the wait for a finished session's last output.
const termDrain = time.Second

// termFail tells the host why the session could not start, as terminal
// output, and ends it with status 127 (as a shell does for a command it
// cannot run).
func (s *Server) termFail(c io.Writer, err error) error {
	guestwire.WriteTermFrame(c, guestwire.TermDataKind, []byte("capsem: "+err.Error()+"\r\n"))
	guestwire.WriteTermFrame(c, guestwire.TermExitKind, guestwire.ExitPayload(127))
	return err
}
