package cli_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/testkit"
)

// capsemMCP is a real `capsem mcp` of the test's service, driven by the Go
// SDK's client over stdio as an agent drives it: the CLI's tests check
// with it that an agent hears what a person at the CLI does.
type capsemMCP struct {
	t *testing.T
	s *mcp.ClientSession
}

func startMCP(t *testing.T, env []string) capsemMCP {
	t.Helper()
	cmd := exec.Command(testkit.CapsemBinary(t), "mcp")
	cmd.Env = env
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "cli-e2e", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return capsemMCP{t: t, s: s}
}

// call calls a tool and decodes its structured result into out (when not
// nil); it returns the text of a tool error, "" when the call succeeded.
func (c capsemMCP) call(name string, args map[string]any, out any) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := c.s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		c.t.Errorf("%s %v: %v", name, args, err)
		return err.Error()
	}
	if res.IsError {
		if len(res.Content) == 0 {
			c.t.Errorf("%s: a tool error without a message", name)
			return "(no message)"
		}
		if text, ok := res.Content[0].(*mcp.TextContent); ok {
			return text.Text
		}
		return "(not text)"
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Errorf("%s: %v in %s", name, err, b)
		}
	}
	return ""
}
