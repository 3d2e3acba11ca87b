package vmhost_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
)

// TestBootExecStopCycles boots, execs and stops a fresh VM again and again
// (100 times unless CAPSEM_RELIABILITY_CYCLES says otherwise) and requires
// every cycle to work: virtio-serial channels are known to be flaky in other
// projects, and this proves ours is not.
func TestBootExecStopCycles(t *testing.T) {
	cycles := 100
	if v := os.Getenv("CAPSEM_RELIABILITY_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CAPSEM_RELIABILITY_CYCLES=%q: want a positive integer", v)
		}
		cycles = n
	}
	start := time.Now()
	var slowest time.Duration
	for i := 1; i <= cycles; i++ {
		t0 := time.Now()
		v := startVM(t, fmt.Sprintf("cycle-%d", i))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		o := v.exec(ctx, &api.ExecRequest{Argv: []string{"echo", strconv.Itoa(i)}})
		cancel()
		v.stop(t)
		if o.err != nil || o.stdout.String() != strconv.Itoa(i)+"\n" || o.ev.ExitCode != 0 {
			t.Fatalf("cycle %d of %d failed: %v %q", i, cycles, o.err, o.stdout.String())
		}
		if t.Failed() {
			t.Fatalf("cycle %d of %d: the VM did not stop cleanly", i, cycles)
		}
		slowest = max(slowest, time.Since(t0))
	}
	t.Logf("%d boot → exec → stop cycles, 0 failures, %.2f s per cycle on average, slowest %.2f s",
		cycles, time.Since(start).Seconds()/float64(cycles), slowest.Seconds())
}
