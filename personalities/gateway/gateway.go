// Package gateway is `capsem gateway`: the MCP endpoint as a standalone host
// service on a Unix socket, with the same aggregator, builtin server and
// ledger the per-VM process uses.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/mcpgw"
)

// Cmd is `capsem gateway`.
type Cmd struct {
	Listen     string `required:"" help:"Where to listen: unix:PATH (created with mode 0600)."`
	SessionDir string `required:"" type:"path" help:"Session directory; session.db and logs are written here."`
	Config     string `optional:"" type:"path" help:"TOML file with [[mcp.servers]] and [mcp] settings."`
}

// Run serves until SIGINT/SIGTERM; SIGHUP reloads the server list.
func (c *Cmd) Run(ctx context.Context) error {
	sockPath, ok := strings.CutPrefix(c.Listen, "unix:")
	if !ok || sockPath == "" {
		return fmt.Errorf("--listen %q: want unix:PATH", c.Listen)
	}
	cfg, err := c.loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	gw, err := mcpgw.Start(ctx, mcpgw.Options{SessionDir: c.SessionDir, Config: cfg, Protect: []string{sockPath}})
	if err != nil {
		return err
	}
	defer gw.Close()
	_ = os.Remove(sockPath)
	ln, err := net.Listen("unix", sockPath)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sockPath, err)
	}
	if err := os.Chmod(sockPath, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("securing socket: %w", err)
	}
	defer os.Remove(sockPath)
	done := make(chan error, 1)
	go func() { done <- gw.Serve(ctx, ln) }()
	slog.Info("MCP gateway listening", "socket", sockPath, "session_dir", c.SessionDir)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return <-done
		case <-hup:
			next, err := c.loadConfig()
			if err != nil {
				slog.Error("config reload failed; keeping the previous configuration", "err", err)
				continue
			}
			if err := gw.Reload(ctx, next); err != nil {
				slog.Error("config reload failed", "err", err)
				continue
			}
			slog.Info("configuration reloaded", "servers", len(next.MCP.Servers))
		case err := <-done:
			return err
		}
	}
}

func (c *Cmd) loadConfig() (*config.File, error) {
	if c.Config == "" {
		return &config.File{}, nil
	}
	return config.Load(c.Config)
}
