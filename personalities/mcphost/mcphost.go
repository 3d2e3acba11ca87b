// Package mcphost is `capsem mcp`: the stdio MCP server that AI agents on
// the host register (core/hostmcp), over the capsem service, which it
// starts whenever it finds none answering.
package mcphost

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/service"
	"github.com/capsem/capsem/core/version"
)

// Cmd is `capsem mcp`.
type Cmd struct{}

// Run serves MCP on stdin/stdout until the client goes away. The service
// is started on the first call that finds none.
func (Cmd) Run(ctx context.Context) error {
	// Its log goes to run/mcp.log as well as to stderr (which the AI client
	// may or may not keep): its stdout is the protocol.
	if _, err := service.SecureRunDir(); err != nil {
		slog.Warn("capsem mcp logs to stderr only", "err", err)
	} else if path, err := paths.MCPLog(); err == nil {
		if f, err := logs.OpenRotated(path); err == nil {
			defer f.Close()
			slog.SetDefault(logs.New(io.MultiWriter(os.Stderr, f), levelOf(ctx, slog.Default())))
		}
		// A crash of capsem mcp goes to the log too (capsem_panics reads
		// it), not only to a stderr the client may discard.
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			if err := debug.SetCrashOutput(f, debug.CrashOptions{}); err != nil {
				slog.Warn("capsem mcp's crashes go to stderr only", "err", err)
			}
			f.Close() // SetCrashOutput keeps its own duplicate
		}
	}
	slog.Info("capsem mcp serving on stdio", "pid", os.Getpid())
	svc, err := service.Ensuring("", os.Environ())
	if err != nil {
		return err
	}
	srv := hostmcp.New(svc, version.Version)
	// Not the SDK's stdio transport: one bad line from the client must
	// be answered, not end the session with every call in it.
	stdio := &hostmcp.StdioTransport{In: os.Stdin, Out: os.Stdout, Log: slog.Default()}
	if err := srv.Run(ctx, stdio); err != nil && ctx.Err() == nil {
		return fmt.Errorf("capsem mcp: %w", err)
	}
	return nil
}

// levelOf is the lowest level log enables (what --log-level set), as its
// name.
func levelOf(ctx context.Context, log *slog.Logger) string {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if log.Enabled(ctx, l) {
			return l.String()
		}
	}
	return slog.LevelError.String()
}
