package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/logs"
)

// CreateCmd is `capsem create [NAME]`.
type CreateCmd struct {
	Name  string   `arg:"" optional:"" help:"A name makes the VM persistent (stop keeps its state for resume); without one it is removed when it stops."`
	RAMMB int      `name:"ram-mb" help:"Guest memory in MB (default 1024)."`
	CPUs  int      `name:"cpus" help:"Virtual CPUs (default 2)."`
	Base  string   `name:"base" enum:"full,minimal," default:"" help:"The VM's root: full (Debian with Node, Python, git and the AI CLIs wired to the gateway; the default) or minimal (busybox only; boots on a bare host)."`
	Env   []string `short:"e" sep:"none" help:"Environment variable for every command in the VM, K=V (repeatable)."`
	// A pointer: 0 (no disk) differs from the default.
	DiskGB       *int   `name:"disk-gb" help:"Size of the VM's disk in GB (default 8); 0: none, the guest runs from RAM."`
	Workspace    string `name:"workspace" type:"existingdir" help:"A host directory shared read-write as the VM's workspace (/root/workspace) and its commands' working directory (not / or your home); default: the VM's own."`
	WorkspaceMiB int    `name:"workspace-mib" help:"Bound on what the VM's workspace may take on the host, in MiB (default 16384); the guest gets ENOSPC at it."`
	// type:"path" makes it absolute, as the service needs.
	Config       string   `type:"path" help:"TOML with [mcp] policy and [[mcp.servers]] for the VM's gateway, in place of $CAPSEM_HOME/user.toml (read again on every boot and policy reload)."`
	NoAutodetect bool     `help:"Do not add the mcpServers of Claude Code and Gemini CLI settings to the VM's gateway."`
	Publish      []string `short:"p" sep:"none" placeholder:"[ADDR:]HOST:GUEST" help:"Publish the guest's TCP port GUEST on the host's port HOST (repeatable), on loopback unless ADDR is given: 8080:3000, 0.0.0.0:8080:3000, [::1]:8080:3000. Again on every resume."`
	JSON         bool     `help:"Print the VM as JSON."`
}

// Run creates the VM and prints it.
func (c *CreateCmd) Run(ctx context.Context) error {
	env, err := envMap(c.Env)
	if err != nil {
		return err
	}
	ports, err := api.ParsePortMappings(c.Publish)
	if err != nil {
		return fmt.Errorf("--publish: %w", err)
	}
	cl, err := client()
	if err != nil {
		return err
	}
	progress := logs.NewProgress(slog.Default(), "starting the VM")
	stage := func(s string) { progress.Stage(s, api.StageLogLevel(s)) }
	v, err := cl.CreateStream(ctx, api.CreateRequest{Name: c.Name, RAMMB: c.RAMMB, CPUs: c.CPUs, Base: c.Base, Workspace: c.Workspace, Env: env, DiskGB: c.DiskGB, WorkspaceMiB: c.WorkspaceMiB,
		Config: c.Config, NoAutodetect: c.NoAutodetect, Ports: ports}, stage)
	progress.Done()
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(v)
	}
	fmt.Println(v.ID)
	return nil
}
