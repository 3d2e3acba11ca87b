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
// the same of its siblings (the builtin and the honest server, whose
// environment holds a token); it signals them all and tries to list and
// write their home directories; through its stderr it tries to truncate the
// log and forge an entry. Each attempt fails, the forged line is only a
// quoted line of the server's, and the honest server keeps working.
func TestHostileServerCannotReachTheAggregator(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "attacks.txt")
	script := filepath.Join(testkit.ModuleRoot(t), "testdata", "hostile", "server.sh")
	echo := testkit.EchoServer(t)
	honestDir := t.TempDir()
	honestFile := filepath.Join(honestDir, "token.txt")
	if err := os.WriteFile(honestFile, []byte("tok-honest-file"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, fmt.Sprintf(`
[[mcp.servers]]
name = "honest"
command = %q
env = { HONEST_TOKEN = "tok-honest-secret" }
write_paths = [%q]

[[mcp.servers]]
name = "hostile"
command = %q
env = { HOSTILE_OUT = %q, HOSTILE_ECHO = %q, HOSTILE_SIBLINGS = "2", HOSTILE_SIBLING_NAMES = "builtin honest", HOSTILE_FOREIGN_FILES = %q }
write_paths = [%q]
read_paths = [%q]
`, echo, honestDir, script, out, echo, honestFile, dir, filepath.Dir(script)))
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
	for _, attack := range []string{"read-parent-environ", "read-parent-mem", "read-parent-stdin-fd", "write-parent-stdout-fd", "read-parent-maps",
		"signal-parent", "list-servers-homes", "read-foreign-grant", "write-foreign-grant"} {
		if !strings.Contains(got, attack+": refused") {
			t.Errorf("attack %s was not refused", attack)
		}
	}
	// The builtin and the honest server were both up and attacked.
	if !strings.Contains(got, "siblings: 2\n") {
		t.Errorf("the hostile server did not see its two siblings")
	}
	siblingAttacks := map[string]int{"read-sibling-environ": 0, "read-sibling-mem": 0, "read-sibling-stdin-fd": 0, "write-sibling-stdout-fd": 0,
		"signal-sibling": 0, "same-process-group": 0, "list-sibling-home": 0, "write-sibling-home": 0}
	for _, line := range strings.Split(got, "\n") {
		attack, _, _ := strings.Cut(line, " ")
		if _, ok := siblingAttacks[attack]; !ok {
			continue
		}
		siblingAttacks[attack]++
		if !strings.HasSuffix(line, ": refused") {
			t.Errorf("attack on a sibling was not refused: %s", line)
		}
	}
	for attack, n := range siblingAttacks {
		if n != 2 {
			t.Errorf("attack %s was tried on %d siblings, want 2", attack, n)
		}
	}
	if b, err := os.ReadFile(honestFile); err != nil || string(b) != "tok-honest-file" {
		t.Errorf("the honest server's file now holds %q (%v)", b, err)
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
