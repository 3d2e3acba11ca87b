package mcpgw

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
)

// TestAggregatorLogIsBounded: whatever the aggregator (or an MCP server it
// started, which shares its stderr) writes, its log and the one
// predecessor rotation keeps stay within their bound.
func TestAggregatorLogIsBounded(t *testing.T) {
	t.Setenv("CAPSEM_HOME", t.TempDir())
	t.Setenv("CAPSEM_CACHE_DIR", t.TempDir())
	session := paths.Session{Dir: t.TempDir()}
	spawn, scratch, err := AggregatorSpawner(session.Dir, nil, func() (read, write []string) { return nil, nil })
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(scratch)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd, err := spawn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The sandboxed aggregator's stderr, written to by a stand-in that
	// floods it with three bounds' worth.
	const flood = 3 * logs.ProcessLogMaxBytes
	cmd.Path = "/bin/sh"
	cmd.Args = []string{"sh", "-c", "head -c " + strconv.Itoa(flood) + " /dev/zero | tr '\\0' x >&2"}
	if err := cmd.Run(); err != nil {
		t.Fatalf("the stand-in: %v", err)
	}
	var total int64
	for _, p := range []string{session.AggregatorLog(), session.AggregatorLog() + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if st.Size() > logs.ProcessLogMaxBytes {
			t.Errorf("%s is %d bytes; the bound is %d", p, st.Size(), logs.ProcessLogMaxBytes)
		}
		total += st.Size()
	}
	if total < logs.ProcessLogMaxBytes {
		t.Errorf("the logs hold %d bytes; the newest %d of what was written should be there", total, logs.ProcessLogMaxBytes)
	}
}
