package vmhost_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/testkit"
)

// resetHWM makes process pid's peak resident memory its current one, so
// that vmHWM measures from now (the boot's peak is higher than its RSS).
func resetHWM(t *testing.T, pid int) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS: %v", err)
	}
}

// vmHWM is the peak resident memory of process pid, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// relayListTools lists the gateway's tools from inside the guest, through
// capsem-mcp-server and the MCP port.
const relayListTools = `printf '%s\n' ` +
	`'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"guest","version":"1"}}}' ` +
	`'{"jsonrpc":"2.0","method":"notifications/initialized"}' ` +
	`'{"jsonrpc":"2.0","id":2,"method":"tools/list"}' ` +
	`| capsem-mcp-server`

// checkChannelServes runs a command (control and exec output ports) and
// an MCP call from the guest (MCP port).
func checkChannelServes(ctx context.Context, t *testing.T, v *vmProc, when string) {
	t.Helper()
	o := v.exec(ctx, &api.ExecRequest{Command: "echo alive"})
	if o.err != nil || o.ev.ExitCode != 0 || o.stdout.String() != "alive\n" {
		t.Fatalf("exec %s: %v %+v %q", when, o.err, o.ev, o.stdout.String())
	}
	o = v.exec(ctx, &api.ExecRequest{Command: relayListTools})
	if o.err != nil || !strings.Contains(o.stdout.String(), `"id":2,"result"`) {
		t.Fatalf("MCP from the guest %s: %v %+v\n%.2000s\n%.2000s", when, o.err, o.ev, o.stdout.String(), o.stderr.String())
	}
}

// installChanflood puts the guest attack tool (testdata/chanflood) at
// /tmp/chanflood in v's guest.
func installChanflood(ctx context.Context, t *testing.T, v *vmProc) {
	t.Helper()
	bin, err := os.ReadFile(testkit.GuestProgram(t, "./testdata/chanflood", "chanflood"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.client.WriteFile(ctx, "/tmp/chanflood", bin, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestHostileGuestChannelStreams: root in the guest takes PID 1's channel
// descriptor (pidfd_getfd) and opens 30,000 bare multiplexer streams behind
// the agent's back (testdata/chanflood): without a header, stalled in it,
// to no listener, idle on the MCP port, garbage on the exec output port.
// The per-VM process's memory and log grow by a bounded amount, and the
// VM's channel (control, exec output, MCP) serves during and after.
func TestHostileGuestChannelStreams(t *testing.T) {
	v := startVM(t, "chanflood")
	defer v.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	installChanflood(ctx, t, v)
	checkChannelServes(ctx, t, v, "before the attack")
	resetHWM(t, v.info.PID)
	hwm0, log0 := vmHWM(t, v.info.PID), fileSize(t, v.log)

	// As fast as the channel takes it.
	start := time.Now()
	o := v.exec(ctx, &api.ExecRequest{Command: "/tmp/chanflood -streams 30000"})
	if o.err != nil || o.ev.ExitCode != 0 || !strings.HasPrefix(o.stdout.String(), "done 30000") {
		t.Fatalf("the attack did not run: %v %+v\nstdout %s\nstderr %s", o.err, o.ev, o.stdout.String(), o.stderr.String())
	}
	t.Logf("attack at full speed: %s in the guest, %v for the exec", strings.TrimSpace(o.stdout.String()), time.Since(start).Round(time.Millisecond))
	checkChannelServes(ctx, t, v, "after the attack")
	t.Logf("peak RSS after the full-speed attack: %d MiB", vmHWM(t, v.info.PID)>>20)

	// Spread over 20 s, in the background: the channel serves meanwhile.
	o = v.exec(ctx, &api.ExecRequest{Command: "/tmp/chanflood -streams 30000 -first 3221225473 -over 20s >/tmp/flood.out 2>&1 &"})
	if o.err != nil || o.ev.ExitCode != 0 {
		t.Fatalf("starting the paced attack: %v %+v", o.err, o.ev)
	}
	served := 0
	for {
		o := v.exec(ctx, &api.ExecRequest{Command: "cat /tmp/flood.out"})
		if o.err != nil || o.ev.ExitCode != 0 {
			t.Fatalf("exec during the attack: %v %+v %s", o.err, o.ev, o.stderr.String())
		}
		if out := o.stdout.String(); out != "" {
			if !strings.HasPrefix(out, "done 30000") {
				t.Fatalf("the paced attack failed: %s", out)
			}
			break
		}
		served++
	}
	if served < 3 {
		t.Fatalf("only %d commands ran during the 20 s attack", served)
	}
	checkChannelServes(ctx, t, v, "after the paced attack")

	hwm, logGrowth := vmHWM(t, v.info.PID), fileSize(t, v.log)-log0
	t.Logf("%d commands ran during the paced attack; per-VM process peak RSS %d -> %d MiB; process.log +%d KiB",
		served, hwm0>>20, hwm>>20, logGrowth>>10)
	if growth := hwm - hwm0; growth > 32<<20 {
		t.Errorf("the per-VM process's peak RSS grew by %d MiB during the attacks, want at most 32", growth>>20)
	}
	if logGrowth > 256<<10 {
		t.Errorf("process.log grew by %d KiB during the attacks, want at most 256", logGrowth>>10)
	}
	info, err := v.client.Info(ctx)
	if err != nil || info.State != "running" {
		t.Fatalf("after the attacks: %v %+v", err, info)
	}
}

// TestHostileGuestWorkspaceMessages: root in the guest takes PID 1's
// descriptor of the workspace port (pidfd_getfd) and writes hostile 9p
// amid the kernel's (testdata/chanflood -workspace): a Tversion for 4 MiB
// messages, then the start of one. The host's server closes that
// connection, naming why, without growing: the per-VM process stays
// bounded and serves the channel, the guest's workspace fails at once
// instead of hanging (guest root may break its own workspace, as umount
// would), and the rest of the VM goes on.
func TestHostileGuestWorkspaceMessages(t *testing.T) {
	v := startVM(t, "wsjunk")
	defer v.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	installChanflood(ctx, t, v)
	o := v.exec(ctx, &api.ExecRequest{Command: "dd if=/dev/urandom of=/root/workspace/probe bs=1M count=4 2>/dev/null && sha256sum /root/workspace/probe"})
	if o.err != nil || o.ev.ExitCode != 0 {
		t.Fatalf("the workspace before the attack: %v %+v %s", o.err, o.ev, o.stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(paths.Session{Dir: v.sessionDir}.Workspace(), "probe"))
	if err != nil || !strings.HasPrefix(o.stdout.String(), fmt.Sprintf("%x", sha256.Sum256(b))) {
		t.Fatalf("the guest's file on the host: %v; the guest says %s", err, o.stdout.String())
	}
	// The workspace's opening is one line, its server's, with the usage
	// and the bound.
	if boot, err := os.ReadFile(v.log); err != nil || strings.Count(string(boot), `"limit_bytes"`) != 1 {
		t.Errorf("want one line with the workspace's bound in process.log (%v):\n%s", err, boot)
	}
	resetHWM(t, v.info.PID)
	hwm0, log0 := vmHWM(t, v.info.PID), fileSize(t, v.log)
	o = v.exec(ctx, &api.ExecRequest{Command: "/tmp/chanflood -workspace"})
	if o.err != nil || o.ev.ExitCode != 0 || !strings.HasPrefix(o.stdout.String(), "done workspace") {
		t.Fatalf("the attack did not run: %v %+v\nstdout %s\nstderr %s", o.err, o.ev, o.stdout.String(), o.stderr.String())
	}
	// The guest's next workspace call fails; it must not hang.
	start := time.Now()
	o = v.exec(ctx, &api.ExecRequest{Command: "timeout 60 ls /root/workspace; echo rc=$?"})
	if o.err != nil || strings.Contains(o.stdout.String(), "rc=0") || strings.Contains(o.stdout.String(), "rc=143") {
		t.Fatalf("the workspace after the attack: %v, %q %q; want a prompt failure", o.err, o.stdout.String(), o.stderr.String())
	}
	t.Logf("the broken workspace answered %q in %v", strings.TrimSpace(o.stderr.String()), time.Since(start).Round(time.Millisecond))
	checkChannelServes(ctx, t, v, "after the attack")
	hwm, logGrowth := vmHWM(t, v.info.PID), fileSize(t, v.log)-log0
	t.Logf("per-VM process peak RSS %d -> %d MiB; process.log +%d KiB", hwm0>>20, hwm>>20, logGrowth>>10)
	if growth := hwm - hwm0; growth > 16<<20 {
		t.Errorf("the per-VM process's peak RSS grew by %d MiB during the attack, want at most 16", growth>>20)
	}
	logText, _ := os.ReadFile(v.log)
	if !strings.Contains(string(logText[log0:]), "workspace") {
		t.Errorf("process.log does not say why the workspace connection ended:\n%s", logText[log0:])
	}
	info, err := v.client.Info(ctx)
	if err != nil || info.State != "running" {
		t.Fatalf("after the attack: %v %+v", err, info)
	}
}
