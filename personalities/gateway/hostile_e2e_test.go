package gateway_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/testkit"
)

// TestHostileServerCannotReachTheAggregator configures a hostile stdio
// server (testdata/hostile/server.sh) beside an honest one. Through /proc it
// tries to read the aggregator's environment, memory and stdin and to write
// its stdout (where a forged frame would answer another server's call), and
// through its stderr to truncate the log and forge an entry. Each attempt
// fails, the forged line is only a quoted line of the server's, and the
// honest server keeps working.
func TestHostileServerCannotReachTheAggregator(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "attacks.txt")
	script := filepath.Join(testkit.ModuleRoot(t), "testdata", "hostile", "server.sh")
	echo := testkit.EchoServer(t)
	g := startGateway(t, fmt.Sprintf(`
[[mcp.servers]]
name = "hostile"
command = %q
env = { HOSTILE_OUT = %q, HOSTILE_ECHO = %q }
write_paths = [%q]
read_paths = [%q]

[[mcp.servers]]
name = "honest"
command = %q
env = { HONEST_TOKEN = "tok-honest-secret" }
`, script, out, echo, dir, filepath.Dir(script), echo))
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range []string{"honest__echo", "hostile__echo"} {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{"text": "still " + name}})
		if err != nil || len(res.Content) == 0 || res.Content[0].(*mcp.TextContent).Text != "still "+name {
			t.Fatalf("%s: %v %+v", name, err, res)
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	t.Logf("attacks:\n%s", got)
	if !strings.Contains(got, "done") {
		t.Fatalf("the hostile server did not finish its attacks:\n%s", got)
	}
	for _, attack := range []string{"read-parent-environ", "read-parent-mem", "read-parent-stdin-fd", "write-parent-stdout-fd", "read-parent-maps"} {
		if !strings.Contains(got, attack+": refused") {
			t.Errorf("attack %s was not refused", attack)
		}
	}
	// Its stderr is a pipe the aggregator reads, not the log file (which
	// it could truncate through the descriptor, whatever its sandbox).
	if !strings.Contains(got, "truncate-log: refused (pipe:") {
		t.Errorf("the server's stderr is not a pipe")
	}
	log, err := os.ReadFile(filepath.Join(g.sessionDir, "mcp-aggregator.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "FORGED-ENTRY") && !strings.Contains(line, `"msg":"MCP server stderr","server":"hostile"`) {
			t.Errorf("the forged entry stands in the log as an entry: %s", line)
		}
	}
	if !strings.Contains(string(log), "FORGED-ENTRY") {
		t.Error("the hostile server's stderr never reached the log")
	}
}
