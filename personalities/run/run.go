// Package run is `capsem run`: boot an ephemeral VM, run one command in it,
// stream its output, exit with its exit code, and remove the VM.
package run

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmhost"
)

// Cmd is `capsem run [--name N] [--env K=V]... -- CMD...`.
type Cmd struct {
	Name         string        `help:"A name for the VM (shown in logs); the VM is removed when the command ends."`
	Env          []string      `short:"e" sep:"none" help:"Environment variable for the command, K=V (repeatable)."`
	Timeout      time.Duration `help:"Kill the command after this long (default: no timeout)."`
	BootLimit    time.Duration `name:"boot-timeout" default:"180s" help:"Give up if the VM is not ready by then."`
	Config       string        `optional:"" type:"path" help:"TOML with [mcp] policy and [[mcp.servers]] for the VM's gateway; replaces $CAPSEM_HOME/user.toml."`
	NoAutodetect bool          `help:"Do not add the mcpServers of Claude Code and Gemini CLI settings."`
	CPUs         int           `name:"cpus" default:"2" help:"Virtual CPUs."`
	MemoryMiB    int           `name:"memory-mib" default:"1024" help:"Guest memory in MiB."`
	DiskGiB      int           `name:"disk-gib" default:"8" help:"Size of the VM's disk (sparse, removed with the VM); 0: none, the guest runs from RAM."`
	GuestBin     string        `name:"guest-binary" type:"path" hidden:"" help:"CGO-free capsem build for /init (default: capsem-guest next to this executable)."`
	Command      []string      `arg:"" passthrough:"" help:"The command and its arguments."`
}

// Run boots, executes and cleans up.
func (c *Cmd) Run(ctx context.Context) error {
	if len(c.Command) > 0 && c.Command[0] == "--" {
		c.Command = c.Command[1:]
	}
	if len(c.Command) == 0 {
		return fmt.Errorf("no command given: capsem run -- CMD [ARGS...]")
	}
	env := map[string]string{}
	for _, kv := range c.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		env[k] = v
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	runDir, err := paths.SessionsDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", runDir, err)
	}
	sessionDir, err := os.MkdirTemp(runDir, "run-")
	if err != nil {
		return fmt.Errorf("creating the session directory: %w", err)
	}
	defer os.RemoveAll(sessionDir) // ephemeral: nothing of the VM remains

	cfg := vmhost.ProcessConfig{SessionDir: sessionDir, Socket: paths.Session{Dir: sessionDir}.APISocket(), Name: cmp.Or(c.Name, "capsem"),
		Config: c.Config, NoAutodetect: c.NoAutodetect, CPUs: c.CPUs, MemoryMiB: c.MemoryMiB, GuestBin: c.GuestBin, DiskGiB: c.DiskGiB}
	proc, err := vmhost.Launch(cfg, vmhost.LaunchOptions{})
	if err != nil {
		return err
	}
	defer func() {
		select {
		case <-proc.Done():
		case <-time.After(30 * time.Second):
			proc.Kill()
		}
	}()
	bootCtx, cancelBoot := context.WithTimeout(ctx, c.BootLimit)
	info, err := proc.WaitReady(bootCtx)
	cancelBoot()
	if err != nil {
		return fmt.Errorf("the VM did not become ready: %w", err)
	}
	client := proc.Client
	slog.Info("VM ready", "accel", info.Accel, "why", info.AccelReason, "start", info.Start)
	ev, execErr := client.Exec(ctx, &api.ExecRequest{Argv: c.Command, Env: env, TimeoutMS: c.Timeout.Milliseconds()}, os.Stdout, os.Stderr)
	stopCtx, cancelStop := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancelStop()
	if err := proc.Stop(stopCtx); err != nil {
		slog.Warn("stopping the VM", "err", err)
	}
	if execErr != nil {
		return execErr
	}
	if ev.TimedOut {
		fmt.Fprintf(os.Stderr, "capsem: command timed out after %s\n", c.Timeout)
		return exitcode.Error{Code: 124}
	}
	if ev.ExitCode != 0 {
		return exitcode.Error{Code: ev.ExitCode}
	}
	return nil
}
