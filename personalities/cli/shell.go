package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/paths"
)

// ShellCmd is `capsem shell VM [-- CMD...]`.
type ShellCmd struct {
	VM      string   `arg:"" help:"The VM's name or id."`
	Command []string `arg:"" optional:"" passthrough:"" help:"A program to run instead of a login shell."`
}

// Run connects this terminal to a shell in the VM: keystrokes (Ctrl-C
// included) and window resizes go to the guest, and the shell's exit
// status becomes this command's.
func (c *ShellCmd) Run(ctx context.Context) error {
	argv := c.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	cl, err := client()
	if err != nil {
		return err
	}
	if _, err := cl.Info(ctx, c.VM); err != nil { // starts the service if needed; names an unknown VM
		return err
	}
	sock, err := paths.ServiceSocket()
	if err != nil {
		return err
	}
	req := api.TermRequest{Argv: argv}
	if term := os.Getenv("TERM"); term != "" {
		req.Env = map[string]string{"TERM": term}
	}
	in := int(os.Stdin.Fd())
	if ws, err := unix.IoctlGetWinsize(in, unix.TIOCGWINSZ); err == nil {
		req.Rows, req.Cols = ws.Row, ws.Col
	}
	conn, err := apiclient.DialTerminal(ctx, sock, api.VMPath(api.RouteVMTerminal, c.VM), req)
	if err != nil {
		return err
	}
	defer conn.Close()
	if restore, err := rawMode(in); err == nil {
		defer restore()
	}
	send := make(chan [2][]byte, 16)
	go func() {
		for f := range send {
			if guestwire.WriteTermFrame(conn, f[0][0], f[1]) != nil {
				return
			}
		}
	}()
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if ws, err := unix.IoctlGetWinsize(in, unix.TIOCGWINSZ); err == nil {
				send <- [2][]byte{{guestwire.TermResizeKind}, guestwire.ResizePayload(ws.Row, ws.Col)}
			}
		}
	}()
	go func() {
		b := make([]byte, 32<<10)
		for {
			n, err := os.Stdin.Read(b)
			if n > 0 {
				send <- [2][]byte{{guestwire.TermDataKind}, append([]byte(nil), b[:n]...)}
			}
			if err != nil {
				conn.CloseWrite()
				return
			}
		}
	}()
	var buf []byte
	for {
		kind, p, err := guestwire.ReadTermFrame(conn, &buf)
		if err != nil {
			return fmt.Errorf("the terminal session ended without an exit status: %w", err)
		}
		switch kind {
		case guestwire.TermDataKind:
			os.Stdout.Write(p)
		case guestwire.TermExitKind:
			code, err := guestwire.ParseExit(p)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitcode.Error{Code: int(code)}
			}
			return nil
		}
	}
}

// rawMode puts the terminal on fd in raw mode (every byte, Ctrl-C and
// Ctrl-D too, goes to the guest, whose own terminal interprets it) and
// returns what restores it. It fails when fd is not a terminal.
func rawMode(fd int) (func(), error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	t := *old
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &t); err != nil {
		return nil, err
	}
	return func() { unix.IoctlSetTermios(fd, unix.TCSETS, old) }, nil
}
