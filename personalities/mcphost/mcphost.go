// Package mcphost is `capsem mcp`: the MCP server that AI agents on the
// host register (core/hostmcp), over stdio or, with --http, streamable
// HTTP, over the capsem service, which it starts whenever it finds none
// answering.
package mcphost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/service"
	"github.com/capsem/capsem/core/version"
)

// Cmd is `capsem mcp`.
type Cmd struct {
	HTTP      string   `name:"http" placeholder:"ADDR" help:"Serve streamable HTTP on ADDR instead of stdio: HOST:PORT, or PORT alone for 127.0.0.1:PORT (0: any free port). The URL (http://HOST:PORT/mcp) is printed on stdout, one line, once it listens. Requests must name this address, localhost, 127.0.0.1 or [::1] with its port in Host, and browsers only loopback origins (against DNS rebinding). A non-loopback HOST needs --token-file."`
	TokenFile string   `name:"token-file" type:"path" placeholder:"PATH" help:"With --http: every request must carry this bearer token (Authorization: Bearer TOKEN): the file's one line, at least 16 characters, the file private to its owner (chmod 600)."`
	AllowHost []string `name:"allow-host" placeholder:"NAME" help:"With --http: a further name clients reach this server by (a Host header and a browser's Origin may give it); repeatable."`
}

// Run serves MCP on stdin/stdout until the client goes away, or with
// --http on HTTP until SIGINT or SIGTERM. The service is started on the
// first call that finds none.
func (c *Cmd) Run(ctx context.Context) error {
	// The HTTP settings are checked before anything else runs: a refused
	// address or token file starts no service.
	var token, addr string
	if c.HTTP == "" {
		if c.TokenFile != "" || len(c.AllowHost) > 0 {
			return errors.New("--token-file and --allow-host go with --http")
		}
	} else {
		var err error
		if c.TokenFile != "" {
			if token, err = hostmcp.ReadTokenFile(c.TokenFile); err != nil {
				return err
			}
		}
		if addr, err = hostmcp.ListenAddress(c.HTTP, token != ""); err != nil {
			return err
		}
	}
	// Its log goes to run/mcp.log as well as to stderr (which the AI client
	// may or may not keep): over stdio, its stdout is the protocol.
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
	svc, err := service.Ensuring("", os.Environ())
	if err != nil {
		return err
	}
	srv := hostmcp.New(svc, version.Version)
	if addr != "" {
		return serveHTTP(ctx, srv, addr, hostmcp.HTTPOptions{Token: token, AllowHosts: c.AllowHost, Log: slog.Default()})
	}
	slog.Info("capsem mcp serving on stdio", "pid", os.Getpid())
	// Not the SDK's stdio transport: one bad line from the client must
	// be answered, not end the session with every call in it.
	stdio := &hostmcp.StdioTransport{In: os.Stdin, Out: os.Stdout, Log: slog.Default()}
	if err := srv.Run(ctx, stdio); err != nil && ctx.Err() == nil {
		return fmt.Errorf("capsem mcp: %w", err)
	}
	return nil
}

// serveHTTP serves srv on addr until SIGINT, SIGTERM or ctx.
func serveHTTP(ctx context.Context, srv *mcp.Server, addr string, opts hostmcp.HTTPOptions) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("capsem mcp --http: %w", err)
	}
	url := "http://" + l.Addr().String() + hostmcp.HTTPPath
	slog.Info("capsem mcp serving on streamable HTTP", "url", url, "token", opts.Token != "", "pid", os.Getpid())
	// The one line a script (or a test) waits for; stdout is not the
	// protocol here.
	if _, err := fmt.Println(url); err != nil {
		l.Close()
		return fmt.Errorf("capsem mcp --http: printing the URL: %w", err)
	}
	if err := hostmcp.ServeHTTP(ctx, srv, l, opts); err != nil {
		return fmt.Errorf("capsem mcp: %w", err)
	}
	slog.Info("capsem mcp stopped serving HTTP", "url", url)
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
