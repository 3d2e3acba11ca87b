package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/capsem/capsem/core/guestchan"
)

// ServeMCPBridge listens on the Unix socket path (mode 0666: any guest user
// may run capsem-mcp-server) and bridges every connection to the host's MCP
// port. Only the agent owns the virtio port, so this is how the relay, a
// separate guest process, reaches the host. It returns when ctx ends.
func ServeMCPBridge(ctx context.Context, log *slog.Logger, path string, dial DialFunc) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("agent: MCP bridge directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("agent: removing a stale MCP socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("agent: MCP bridge: %w", err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return fmt.Errorf("agent: MCP bridge socket mode: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("agent: MCP bridge accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			bridge(ctx, log, c, dial)
		}()
	}
}

// bridge splices one local connection to a new stream on the MCP port,
// passing a half-close on in each direction.
func bridge(ctx context.Context, log *slog.Logger, local net.Conn, dial DialFunc) {
	defer local.Close()
	remote, err := dial(ctx, guestchan.PortMCP)
	if err != nil {
		// The relay sees the close and answers its pending calls with an
		// error; it reconnects for the next one.
		log.Warn("MCP bridge: dialing the host endpoint", "err", err)
		return
	}
	defer remote.Close()
	stop := context.AfterFunc(ctx, func() {
		local.Close()
		remote.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(local, remote)
		closeWrite(local)
	}()
	io.Copy(remote, local)
	closeWrite(remote)
	<-done
}

// closeWrite half-closes c when it can; a stream without CloseWrite (a
// yamux stream's Close already only ends our side) is closed.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}
