// Package run is `capsem run`: boot an ephemeral VM, run one command in it,
// stream its output, exit with its exit code, and remove the VM. Like
// every verb of the CLI it goes through the capsem service (started when
// none answers), which owns the VM: it counts against the host's memory,
// `capsem ls` shows it while it runs, and it is removed even when this
// command is killed.
package run

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/service"
)

// Cmd is `capsem run [--name N] [--env K=V]... -- CMD...`.
type Cmd struct {
	Name      string        `help:"A name for the VM while it runs (its hostname; capsem exec and shell reach it by it); the VM is removed when the command ends."`
	Timeout   time.Duration `help:"Kill the command after this long (default: no timeout)."`
	BootLimit time.Duration `name:"boot-timeout" default:"180s" help:"Give up if the VM is not ready by then."`
	// VMConfig is capsem create's: its environment is the command's.
	api.VMConfig `embed:""`
	Command      []string `arg:"" passthrough:"" help:"The command and its arguments."`
}

// Run boots, executes and cleans up.
func (c *Cmd) Run(ctx context.Context) error {
	req, err := c.request()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl, err := service.Ensuring("", nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	bootLimit := time.AfterFunc(c.BootLimit, func() {
		cancel(fmt.Errorf("the VM was not ready after %s (--boot-timeout)", c.BootLimit))
	})
	defer bootLimit.Stop()
	var vmID string
	progress := logs.NewProgress(slog.Default(), "starting the VM")
	defer progress.Done()
	ready := func(vm api.VM) {
		bootLimit.Stop()
		progress.Done() // the command's output follows
		vmID = vm.ID
		if p := vm.Process; p != nil {
			slog.Info("VM ready", "vm", vm.ID, "accel", p.Accel, "why", p.AccelReason, "start", p.Start)
		}
	}
	stage := func(s string) { progress.Stage(s, api.StageLogLevel(s)) }
	ev, err := cl.RunStream(ctx, req, api.RunEvents{Stage: stage, Ready: ready}, os.Stdout, os.Stderr)
	if err != nil {
		if vmID != "" {
			// The service removes the VM when the stream ends or
			// breaks; asking for it here waits until it is gone (or
			// removes it, should the stream have broken another way).
			// Not through a client that starts a service: when none
			// answers, the one that stopped has removed the VM (or the
			// next removes it at start). Before the VM was ready there is
			// nothing to wait for: the service discards a VM whose create
			// is abandoned.
			dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer dcancel()
			if sock, err := paths.ServiceSocket(); err == nil {
				apiclient.NewServiceClient(sock, nil).Delete(dctx, vmID)
			}
		}
		if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
			return fmt.Errorf("%w (%v)", cause, err)
		}
		return err
	}
	switch {
	case ev.TimedOut:
		fmt.Fprintf(os.Stderr, "capsem: command timed out after %s\n", c.Timeout)
		return exitcode.Error{Code: 124}
	case ev.Signal > 0:
		return exitcode.Error{Code: 128 + ev.Signal}
	case ev.ExitCode != 0:
		return exitcode.Error{Code: ev.ExitCode}
	}
	return nil
}

// request is the service request the flags describe.
func (c *Cmd) request() (api.RunRequest, error) {
	argv := c.Command
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	if len(argv) == 0 {
		return api.RunRequest{}, errors.New("no command given: capsem run -- CMD [ARGS...]")
	}
	return api.RunRequest{
		CreateRequest: api.CreateRequest{Name: c.Name, VMConfig: c.VMConfig},
		Exec:          api.ExecRequest{Argv: argv, TimeoutMS: c.Timeout.Milliseconds()},
	}, nil
}
