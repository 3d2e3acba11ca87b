// Package gateway is `capsem gateway`: the MCP endpoint as a standalone host
// service on a Unix socket, with the same aggregator, builtin server, policy
// and ledger the per-VM process uses.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/procs"
	"github.com/capsem/capsem/core/unixsock"
)

// Cmd is `capsem gateway`.
type Cmd struct {
	Listen       string `required:"" help:"Where to listen: unix:PATH (created with mode 0600)."`
	SessionDir   string `required:"" type:"path" help:"Session directory; session.db and logs are written here."`
	Config       string `optional:"" type:"path" help:"TOML file with [mcp] policy and [[mcp.servers]]; replaces $CAPSEM_HOME/user.toml (corp.toml still applies)."`
	NoAutodetect bool   `help:"Do not add the mcpServers of Claude Code and Gemini CLI settings."`
}

// Run serves until SIGINT/SIGTERM; SIGHUP (or `capsem policy reload`)
// reloads the configuration and policy.
func (c *Cmd) Run(ctx context.Context) error {
	sockPath, ok := strings.CutPrefix(c.Listen, "unix:")
	if !ok || sockPath == "" {
		return fmt.Errorf("--listen %q: want unix:PATH", c.Listen)
	}
	// The endpoint mostly waits: on its socket, on the aggregator, and in
	// cgo for the ledger's commits. With a P per CPU every commit (a long
	// cgo call) and every message wakes spare threads; on a 2-core host a
	// quarter of the CPUs (at least one P) took context switches per call
	// from 18 to 10 and added calls/s at every concurrency (make bench).
	procs.TuneGC()
	procs.Limit(procs.Helper())
	sources, err := mcpgw.SourcesFor(c.Config, !c.NoAutodetect)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	gw, err := mcpgw.Start(ctx, mcpgw.Options{SessionDir: c.SessionDir, Sources: sources, Protect: []string{sockPath},
		Kind: "gateway", Name: sockPath})
	if err != nil {
		return err
	}
	defer gw.Close()
	ln, err := unixsock.Listen(sockPath)
	if err != nil {
		return err
	}
	gw.ReloadOnSignal(ctx)
	slog.Info("MCP gateway listening", "socket", sockPath, "session_dir", c.SessionDir, "config", mcpgw.Describe(gw.Config()))
	return gw.Serve(ctx, ln)
}
