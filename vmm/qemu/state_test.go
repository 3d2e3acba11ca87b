package qemu

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/vmm"
)

// tickerCmdline runs a shell as init that counts on the console, so a
// restored VM shows whether it carried on from the saved count.
const tickerCmdline = `console=ttyS0 panic=-1 quiet rdinit=/bin/sh -- -c "i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.2; done"`

var tickRe = regexp.MustCompile(`tick-(\d+)`)

// waitConsole waits until the console log holds a tick and returns its
// ticks in order.
func waitTicks(t *testing.T, vm vmm.Machine, path string, atLeast int) []int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		b, _ := os.ReadFile(path)
		var ticks []int
		for _, m := range tickRe.FindAllSubmatch(b, -1) {
			n, _ := strconv.Atoi(string(m[1]))
			ticks = append(ticks, n)
		}
		if len(ticks) >= atLeast {
			return ticks
		}
		select {
		case <-vm.Done():
			t.Fatalf("QEMU exited: %v\nconsole:\n%s", vm.Wait(), b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d ticks on the console after 2 minutes:\n%s", atLeast, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSaveStateAndRestore saves a running VM into a file and resumes
// another from it: the second carries on from the saved state (its count
// goes on, its kernel never boots), the first runs on after the save, and
// both are reaped.
func TestSaveStateAndRestore(t *testing.T) {
	dir := shortDir(t)
	spec := bootSpec(t, dir)
	spec.Cmdline = tickerCmdline
	spec.Monitor = true
	b := realBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	saved, err := b.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := saved.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer saved.Stop(context.Background())
	waitTicks(t, saved, spec.ConsoleLog, 4)
	state := filepath.Join(dir, "vm.state")
	if err := saved.(*Machine).SaveState(ctx, state); err != nil {
		t.Fatal(err)
	}
	// The devices' state alone (the RAM is apart): small.
	st, err := os.Stat(state)
	if err != nil || st.Size() > 4<<20 || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", st, err)
	}
	// The RAM: the guest's size, sparse, holding what the guest wrote.
	var ram unix.Stat_t
	if err := unix.Stat(vmm.MemoryPath(state), &ram); err != nil || ram.Size != int64(spec.MemoryMiB)<<20 ||
		ram.Blocks*512 < 1<<20 || ram.Blocks*512 > ram.Size/2 || ram.Mode&0o777 != 0o600 {
		t.Fatalf("RAM file: %+v %v", ram, err)
	}
	if left, _ := filepath.Glob(state + "*.tmp"); len(left) != 0 {
		t.Fatalf("temporary state files left: %v", left)
	}
	before := waitTicks(t, saved, spec.ConsoleLog, 1)
	// The saved VM was resumed: it keeps counting.
	after := waitTicks(t, saved, spec.ConsoleLog, len(before)+3)
	if after[len(after)-1] <= before[len(before)-1] {
		t.Fatalf("the saved VM stopped counting after the save: %v", after)
	}
	savedPID := saved.PID()
	saved.Stop(context.Background())
	assertReaped(t, savedPID)

	// The restored VM: same spec but its own console.
	rspec := spec
	rspec.RestoreFrom = state
	rspec.ConsoleLog = filepath.Join(dir, "restored.log")
	rspec.ChannelSocket = filepath.Join(dir, "chan2.sock")
	restored, err := b.Create(ctx, rspec)
	if err != nil {
		t.Fatal(err)
	}
	if err := restored.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer restored.Stop(context.Background())
	ticks := waitTicks(t, restored, rspec.ConsoleLog, 3)
	console, _ := os.ReadFile(rspec.ConsoleLog)
	if bytes.Contains(console, []byte("Linux version")) || bytes.Contains(console, []byte("BUG")) || ticks[0] < 4 {
		t.Fatalf("the restored VM booted instead of resuming (first tick %d):\n%s", ticks[0], console)
	}
	restoredPID := restored.PID()
	restored.Stop(context.Background())
	assertReaped(t, restoredPID)
}

func TestSaveStateNeedsMonitor(t *testing.T) {
	dir := shortDir(t)
	spec := bootSpec(t, dir)
	spec.Cmdline = tickerCmdline
	vm, err := realBackend(t).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	err = vm.(*Machine).SaveState(context.Background(), filepath.Join(dir, "vm.state"))
	if err == nil || !strings.Contains(err.Error(), "no monitor") {
		t.Fatalf("SaveState without a monitor: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "vm.state")); !os.IsNotExist(err) {
		t.Fatalf("a failed save left a state file: %v", err)
	}
}
