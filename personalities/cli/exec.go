package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/exitcode"
)

// ExecCmd is `capsem exec VM [flags] -- CMD [ARGS...]`.
type ExecCmd struct {
	VM      string        `arg:"" help:"The VM's name or id."`
	Command []string      `arg:"" passthrough:"" help:"The command and its arguments."`
	Timeout time.Duration `help:"Kill the command (its whole process group) after this long (default: no timeout)."`
	Env     []string      `short:"e" sep:"none" help:"Environment variable for the command, K=V (repeatable)."`
	Workdir string        `short:"w" help:"Working directory in the guest."`
	TraceID string        `name:"trace-id" help:"Tie the command to what it causes: its ledger row and those of the connections it makes carry this id."`
}

// Run streams the command's output and exits with its status.
func (c *ExecCmd) Run(ctx context.Context) error {
	argv := c.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return fmt.Errorf("no command given: capsem exec VM -- CMD [ARGS...]")
	}
	env, err := envMap(c.Env)
	if err != nil {
		return err
	}
	cl, err := client()
	if err != nil {
		return err
	}
	ev, err := cl.ExecStream(ctx, c.VM, api.ExecRequest{Argv: argv, Env: env, Cwd: c.Workdir, TimeoutMS: c.Timeout.Milliseconds(), TraceID: c.TraceID}, os.Stdout, os.Stderr)
	if err != nil {
		return err
	}
	return status(ev, c.Timeout)
}

// status is the exit status for a finished command: its own, 124 when the
// timeout killed it (as timeout(1) does), 128+N for a signal.
func status(ev *api.ExecEvent, timeout time.Duration) error {
	switch {
	case ev.TimedOut:
		fmt.Fprintf(os.Stderr, "capsem: command timed out after %s\n", timeout)
		return exitcode.Error{Code: 124}
	case ev.Signal > 0:
		return exitcode.Error{Code: 128 + ev.Signal}
	case ev.ExitCode != 0:
		return exitcode.Error{Code: ev.ExitCode}
	}
	return nil
}
