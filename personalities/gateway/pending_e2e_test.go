package gateway_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/testkit"
)

// TestToolCallRecordedBeforeItRuns kills the gateway while a tool runs:
// the call's row was committed before the call reached the server, and
// stays, marked pending. A call that completes leaves one row, not pending.
func TestToolCallRecordedBeforeItRuns(t *testing.T) {
	g := startGateway(t, fmt.Sprintf("[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n", testkit.EchoServer(t)))
	s := g.connect(t)
	ctx := context.Background()
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "done"}}); err != nil {
		t.Fatal(err)
	}
	go s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__sleep", Arguments: map[string]any{"ms": 60000}})
	db := g.db(t)
	deadline := time.Now().Add(30 * time.Second)
	for scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'echo__sleep'`) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no row for the running call")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The gateway dies mid-call, with no chance to write anything more.
	if err := g.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	g.cmd.Wait()
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'echo__sleep' AND pending = 1 AND decision = 'allowed'`); n != 1 {
		t.Fatalf("%d pending rows for the call the gateway died in, want 1", n)
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'echo__echo'`); n != 1 {
		t.Fatalf("%d rows for the completed call, want 1", n)
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'echo__echo' AND pending = 0 AND response_preview LIKE '%done%'`); n != 1 {
		t.Fatal("the completed call's row is not complete")
	}
}
