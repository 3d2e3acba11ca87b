package aggregator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/procs"
)

// commandTransport runs a stdio MCP server as mcp.CommandTransport does:
// newline-delimited JSON and the spec's shutdown (close stdin, SIGTERM after
// terminate, SIGKILL after another). The differences: the pipes' ends here
// are read and written through procs.RawIO, so a message costs no scheduler
// hand-off (see RawIO; on a small host that was about half the aggregator's
// context switches per call), and the connection is a lineConn, which also
// carries the aggregator's direct tool calls.
type commandTransport struct {
	cmd       *exec.Cmd
	terminate time.Duration
	conn      *lineConn // set by Connect
}

func (t *commandTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	if t.cmd.Stdin != nil || t.cmd.Stdout != nil {
		return nil, errors.New("stdio server command: stdin and stdout must be unset")
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("stdio server stdin: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("stdio server stdout: %w", err)
	}
	t.cmd.Stdin, t.cmd.Stdout = inR, outW
	err = t.cmd.Start()
	// The child has its own copies of these ends (or none, on failure).
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	p := &serverPipes{cmd: t.cmd, terminate: t.terminate, stdin: inW, stdout: outR,
		w: procs.RawWriter(inW), r: procs.RawReader(outR)}
	t.conn = newLineConn(p)
	return t.conn, nil
}

// serverPipes is the connection's writer; closing it shuts the server down.
type serverPipes struct {
	cmd       *exec.Cmd
	terminate time.Duration
	stdin     *os.File
	stdout    *os.File
	w         io.Writer
	r         io.Reader
}

func (p *serverPipes) Write(b []byte) (int, error) { return p.w.Write(b) }

// Close ends the server as the MCP spec asks of a stdio client: close its
// input, wait, SIGTERM, wait, SIGKILL. The process is always reaped, and
// its output pipe closed after (a grandchild holding it open must not keep
// the reader waiting).
func (p *serverPipes) Close() error {
	p.stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	defer p.stdout.Close()
	wait := func() (error, bool) {
		select {
		case err := <-exited:
			return err, true
		case <-time.After(p.terminate):
			return nil, false
		}
	}
	if err, ok := wait(); ok {
		return err
	}
	if p.cmd.Process.Signal(syscall.SIGTERM) == nil {
		if err, ok := wait(); ok {
			return err
		}
	}
	if err := p.cmd.Process.Kill(); err != nil {
		return err
	}
	if err, ok := wait(); ok {
		return err
	}
	// The Wait above still reaps it whenever it ends.
	return fmt.Errorf("stdio server (pid %d) did not exit after SIGKILL", p.cmd.Process.Pid)
}
