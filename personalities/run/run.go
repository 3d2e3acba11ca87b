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
	"strings"
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
	Env       []string      `short:"e" sep:"none" help:"Environment variable for the command, K=V (repeatable)."`
	Timeout   time.Duration `help:"Kill the command after this long (default: no timeout)."`
	BootLimit time.Duration `name:"boot-timeout" default:"180s" help:"Give up if the VM is not ready by then."`
	// type:"path" makes it absolute, as the service needs.
	Config       string   `optional:"" type:"path" help:"TOML with [mcp] policy and [[mcp.servers]] for the VM's gateway; replaces $CAPSEM_HOME/user.toml."`
	NoAutodetect bool     `help:"Do not add the mcpServers of Claude Code and Gemini CLI settings."`
	CPUs         int      `name:"cpus" default:"2" help:"Virtual CPUs."`
	Base         string   `name:"base" enum:"full,minimal," default:"" help:"The VM's root: full (Debian with Node, Python, git and the AI CLIs wired to the gateway; the default) or minimal (busybox only; boots on a bare host)."`
	RAMMB        int      `name:"ram-mb" default:"1024" help:"Guest memory in MB (as capsem create spells it)."`
	DiskGB       int      `name:"disk-gb" default:"8" help:"Size of the VM's disk in GB (sparse, removed with the VM); 0: none, the guest runs from RAM."`
	Workspace    string   `name:"workspace" type:"existingdir" help:"A host directory shared read-write as the VM's workspace (/root/workspace) and its commands' working directory (not / or your home); default: the VM's own."`
	WorkspaceMiB int      `name:"workspace-mib" default:"16384" help:"Bound on what the VM's workspace may take on the host, in MiB; the guest gets ENOSPC at it."`
	Publish      []string `short:"p" sep:"none" placeholder:"[ADDR:]HOST:GUEST" help:"Publish the guest's TCP port GUEST on the host's port HOST while the command runs (repeatable), on loopback unless ADDR is given."`
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
	var env map[string]string
	for _, kv := range c.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return api.RunRequest{}, fmt.Errorf("--env %q: want KEY=VALUE", kv)
		}
		if env == nil {
			env = map[string]string{}
		}
		env[k] = v
	}
	ports, err := api.ParsePortMappings(c.Publish)
	if err != nil {
		return api.RunRequest{}, fmt.Errorf("--publish: %w", err)
	}
	disk := c.DiskGB
	return api.RunRequest{
		CreateRequest: api.CreateRequest{Name: c.Name, RAMMB: c.RAMMB, CPUs: c.CPUs, Base: c.Base, Workspace: c.Workspace, DiskGB: &disk, WorkspaceMiB: c.WorkspaceMiB, Config: c.Config, NoAutodetect: c.NoAutodetect, Ports: ports},
		Exec:          api.ExecRequest{Argv: argv, Env: env, TimeoutMS: c.Timeout.Milliseconds()},
	}, nil
}
