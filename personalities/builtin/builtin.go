// Package builtin is the mcp-builtin personality: a stdio MCP server with
// the builtin HTTP tools, started by the aggregator. Its network policy and
// limits come from the environment (see builtintools.ConfigFromEnv). It
// writes MCP on stdout and JSON logs on stderr, and opens no database: each
// tool result carries its net events in _meta for the process to record.
package builtin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/builtintools"
	"github.com/capsem/capsem/core/procs"
	"github.com/capsem/capsem/core/version"
)

// Cmd runs the builtin MCP server on stdin/stdout until stdin closes.
type Cmd struct{}

// Run builds the configuration from the environment and serves MCP on
// stdio until stdin closes (a clean exit) or ctx is canceled.
func (c *Cmd) Run(ctx context.Context) error {
	procs.Limit(procs.Helper())
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	in, out, restore := procs.PollableStdio()
	defer restore()
	return serve(ctx, os.Getenv, &mcp.IOTransport{Reader: in, Writer: out}, logger)
}

// serve is Run with its dependencies passed in, for tests.
func serve(ctx context.Context, getenv func(string) string, transport mcp.Transport, logger *slog.Logger) error {
	cfg, err := builtintools.ConfigFromEnv(getenv)
	if err != nil {
		logger.Error("invalid configuration", "error", err)
		return fmt.Errorf("mcp-builtin: %w", err)
	}
	logger.Info("mcp-builtin starting",
		"version", version.Version,
		"allow", cfg.Allow,
		"block", cfg.Block,
		"max_body_bytes", cfg.MaxBodyBytes,
		"timeout", cfg.Timeout.String(),
		"max_redirects", cfg.MaxRedirects,
		"allow_private_networks", cfg.AllowPrivateNetworks,
	)
	server := builtintools.NewServer(cfg, version.Version)
	err = server.Run(ctx, transport)
	if isCleanShutdown(err) {
		logger.Info("mcp-builtin stopped: input closed")
		return nil
	}
	if ctx.Err() != nil {
		logger.Info("mcp-builtin stopped", "reason", ctx.Err().Error())
		return nil
	}
	logger.Error("mcp-builtin stopped", "error", err)
	return fmt.Errorf("mcp-builtin: serving stdio: %w", err)
}

// isCleanShutdown reports whether the session ended because the peer
// closed its end, which is how the aggregator stops this process.
func isCleanShutdown(err error) bool {
	return err == nil || errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed)
}
