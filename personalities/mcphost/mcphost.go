// Package mcphost is `capsem mcp`: the stdio MCP server that AI agents on
// the host register (core/hostmcp), over the capsem service, which it
// starts whenever it finds none answering.
package mcphost

import (
	"context"
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/service"
	"github.com/capsem/capsem/core/version"
)

// Cmd is `capsem mcp`.
type Cmd struct{}

// Run serves MCP on stdin/stdout until the client goes away. The service
// is started on the first call that finds none.
func (Cmd) Run(ctx context.Context) error {
	svc, err := service.Ensuring("", os.Environ())
	if err != nil {
		return err
	}
	srv := hostmcp.New(svc, version.Version)
	if err := srv.Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
		return fmt.Errorf("capsem mcp: %w", err)
	}
	return nil
}
