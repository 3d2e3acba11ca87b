// Package run is `capsem run`: boot an ephemeral VM, run one command in it,
// stream its output, exit with its exit code, and remove the VM.
package run

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/paths"
)

// Cmd is `capsem run [--name N] [--env K=V]... -- CMD...`.
type Cmd struct {
	Name         string        `help:"A name for the VM (shown in logs); the VM is removed when the command ends."`
	Env          []string      `short:"e" help:"Environment variable for the command, K=V (repeatable)."`
	Timeout      time.Duration `help:"Kill the command after this long (default: no timeout)."`
	BootLimit    time.Duration `name:"boot-timeout" default:"180s" help:"Give up if the VM is not ready by then."`
	Config       string        `optional:"" type:"path" help:"TOML with [mcp] policy and [[mcp.servers]] for the VM's gateway; replaces $CAPSEM_HOME/user.toml."`
	NoAutodetect bool          `help:"Do not add the mcpServers of Claude Code and Gemini CLI settings."`
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

	home, err := paths.Home()
	if err != nil {
		return err
	}
	runDir := filepath.Join(home, "run", "sessions")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", runDir, err)
	}
	sessionDir, err := os.MkdirTemp(runDir, "run-")
	if err != nil {
		return fmt.Errorf("creating the session directory: %w", err)
	}
	defer os.RemoveAll(sessionDir) // ephemeral: nothing of the VM remains

	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locating the capsem executable: %w", err)
	}
	sock := filepath.Join(sessionDir, "process.sock")
	args := []string{"process", "--session-dir", sessionDir, "--socket", sock}
	if c.Name != "" {
		args = append(args, "--name", c.Name)
	}
	if c.Config != "" {
		args = append(args, "--config", c.Config)
	}
	if c.NoAutodetect {
		args = append(args, "--no-autodetect")
	}
	if c.GuestBin != "" {
		args = append(args, "--guest-binary", c.GuestBin)
	}
	proc := exec.Command(self, args...)
	logFile, err := os.OpenFile(filepath.Join(sessionDir, "process.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	proc.Stdout, proc.Stderr = logFile, logFile
	proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The process writes api.ReadyLine on the pipe once its API listens:
	// no polling, and a process that dies first closes the pipe at once.
	readyR, err := api.StartWithReadyPipe(proc)
	if err != nil {
		return fmt.Errorf("starting the VM process: %w", err)
	}
	defer readyR.Close()
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	defer func() {
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			proc.Process.Kill()
			<-exited
		}
	}()

	client := api.NewProcessClient(sock)
	bootCtx, cancelBoot := context.WithTimeout(ctx, c.BootLimit)
	defer cancelBoot()
	readyCh := make(chan error, 1)
	var info *api.Info
	go func() {
		var err error
		info, err = client.WaitReadyPipe(bootCtx, readyR)
		readyCh <- err
	}()
	select {
	case err := <-readyCh:
		if err != nil {
			// Out of time: stop it. A closed pipe means the process is
			// exiting: let it finish writing its reason to the log first.
			if bootCtx.Err() != nil {
				proc.Process.Kill()
			} else {
				select {
				case exitErr := <-exited:
					exited <- exitErr
				case <-time.After(5 * time.Second):
					proc.Process.Kill()
				}
			}
			return fmt.Errorf("the VM did not become ready: %w (log: %s)", err, tail(filepath.Join(sessionDir, "process.log")))
		}
	case err := <-exited:
		exited <- err
		return fmt.Errorf("the VM process exited during boot: %v (log: %s)", err, tail(filepath.Join(sessionDir, "process.log")))
	}

	slog.Info("VM ready", "accel", info.Accel, "why", info.AccelReason, "start", info.Start)
	ev, execErr := client.Exec(ctx, &api.ExecRequest{Argv: c.Command, Env: env, TimeoutMS: c.Timeout.Milliseconds()}, os.Stdout, os.Stderr)
	stopCtx, cancelStop := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancelStop()
	if err := client.Stop(stopCtx); err != nil {
		slog.Warn("stopping the VM", "err", err)
		proc.Process.Signal(syscall.SIGTERM)
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

// tail returns the last lines of a log for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return strings.Join(lines, "\n")
}
