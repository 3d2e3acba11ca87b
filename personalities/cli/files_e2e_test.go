package cli_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/testkit"
)

// TestFilesAndCommandsUnderAttack attacks one VM the way a hostile client
// and the guest's own workload would, and checks what must hold: files of
// any size move in bounded chunks (six parallel 60 MB reads once made PID 1
// hold them all and panicked the guest), every file operation is an
// fs_events row with its digest, a write cut short or refused by a full
// disk leaves the old file, a guest that runs out of memory loses the
// greedy command and not PID 1, a command is in the ledger while it runs
// and after its VM's process is killed, and a call cut off by a stop or
// a removal is 409 interrupted, not a 400, and one cut off by a guest
// kernel panic is 503 unavailable, naming the panic, with the VM defunct
// (the CLI, capsem mcp and the service's API each say so).
func TestFilesAndCommandsUnderAttack(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	c := capsemCLI{t: t, env: env}
	ctx := context.Background()
	c.must("create", "dev", "--ram-mb", "512", "--cpus", "1", "--disk-gb", "1")
	svc := apiclient.NewServiceClient(filepath.Join(runDir, "service.sock"), nil)
	agent := startMCP(t, env)

	// A 70 MB file of random bytes in the guest (more than a read as JSON takes), and its digest there.
	c.must("exec", "dev", "--", "sh", "-c", "head -c 73400320 /dev/urandom > /root/big")
	guestSum := func(path string) string {
		t.Helper()
		f := strings.Fields(c.must("exec", "dev", "--", "sha256sum", path))
		if len(f) == 0 {
			t.Fatalf("sha256sum %s printed nothing", path)
		}
		return f[0]
	}
	bigSum := guestSum("/root/big")

	t.Run("six parallel 70 MB reads", func(t *testing.T) {
		dir := t.TempDir()
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
				if err != nil {
					errs[i] = err
					return
				}
				defer f.Close()
				_, digest, err := svc.ReadFileTo(ctx, "dev", "/root/big", false, f)
				if err == nil && digest != bigSum {
					err = fmt.Errorf("digest %s, the guest's is %s", digest, bigSum)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("read %d: %v", i, err)
			}
			if sum := fileSum(t, filepath.Join(dir, strconv.Itoa(i))); sum != bigSum {
				t.Fatalf("read %d wrote %s, want %s", i, sum, bigSum)
			}
		}
		// As JSON a file is held whole, so that is bounded and says how
		// to copy a larger one.
		var se *apiclient.StatusError
		if _, err := svc.ReadFile(ctx, "dev", api.ReadFileRequest{Path: "/root/big", Encoding: "base64"}); !errors.As(err, &se) ||
			se.Status != http.StatusRequestEntityTooLarge || !strings.Contains(se.Message, "capsem cp") {
			t.Fatalf("a 70 MB read as JSON: %v", err)
		}
		// PID 1 never held a file: its peak stays far below one.
		hwm := guestPeakKiB(t, c, 1)
		if hwm > 40<<10 {
			t.Fatalf("the guest's PID 1 peaked at %d KiB after six 70 MB reads", hwm)
		}
	})

	t.Run("write through cp, recorded with its digest", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "up.bin")
		writeRandom(t, src, 5<<20)
		c.must("cp", src, "dev:/root/up.bin")
		want := fileSum(t, src)
		if got := guestSum("/root/up.bin"); got != want {
			t.Fatalf("the guest has %s, the host sent %s", got, want)
		}
		c.must("cp", "dev:/root/up.bin", filepath.Join(t.TempDir(), "back.bin"))
		// A streamed read the guest refuses carries its code, like the rest.
		var se *apiclient.StatusError
		if _, _, err := svc.ReadFileTo(ctx, "dev", "/root/no-such-file", false, io.Discard); !errors.As(err, &se) ||
			se.Code != api.CodeRefused || !strings.Contains(se.Message, "no-such-file") {
			t.Fatalf("a streamed read of a missing file: %v", err)
		}
		res, err := svc.Inspect(ctx, "dev", api.InspectRequest{SQL: "SELECT COUNT(*) AS n, operation FROM fs_events GROUP BY operation ORDER BY operation"})
		if err != nil {
			t.Fatal(err)
		}
		ops := map[string]float64{}
		for _, r := range res.Rows {
			ops[r[1].(string)] = r[0].(float64)
		}
		if ops["read"] < 7 || ops["write"] < 1 {
			t.Fatalf("fs_events by operation: %v", res.Rows)
		}
		res, err = svc.Inspect(ctx, "dev", api.InspectRequest{SQL: "SELECT direction, size, digest, outcome FROM fs_events WHERE operation = 'write' AND path = '/root/up.bin'"})
		if err != nil || len(res.Rows) != 1 {
			t.Fatalf("the write's row: %v %v", res.Rows, err)
		}
		if r := res.Rows[0]; r[0] != "to_guest" || r[1] != float64(5<<20) || r[2] != want || r[3] != "ok" {
			t.Fatalf("the write's row: %v, want to_guest, %d, %s, ok", r, 5<<20, want)
		}
	})

	t.Run("a write cut short leaves the old file", func(t *testing.T) {
		before := guestSum("/root/up.bin")
		body := io.MultiReader(strings.NewReader(strings.Repeat("x", 3<<20)), failingReader{})
		if err := svc.WriteFileFrom(ctx, "dev", "/root/up.bin", 0, body); err == nil {
			t.Fatal("a write whose body broke succeeded")
		}
		if after := guestSum("/root/up.bin"); after != before {
			t.Fatalf("the file changed from %s to %s", before, after)
		}
		if left := c.must("exec", "dev", "--", "sh", "-c", "ls -a /root | grep capsem-write || true"); left != "" {
			t.Fatalf("temporary files left: %q", left)
		}
		res, err := svc.Inspect(ctx, "dev", api.InspectRequest{SQL: "SELECT outcome FROM fs_events WHERE operation = 'write' ORDER BY id DESC LIMIT 1"})
		if err != nil || len(res.Rows) != 1 || res.Rows[0][0] != "error" {
			t.Fatalf("the cut write's row: %v %v", res.Rows, err)
		}
	})

	t.Run("a full disk refuses the write and keeps the old file", func(t *testing.T) {
		c.must("exec", "dev", "--", "sh", "-c", "mkdir -p /mnt/tiny && mount -t tmpfs -o size=1m tmpfs /mnt/tiny && echo old > /mnt/tiny/f")
		src := filepath.Join(t.TempDir(), "big.bin")
		writeRandom(t, src, 2<<20)
		_, errOut, code := c.run("cp", src, "dev:/mnt/tiny/f")
		if code == 0 || !strings.Contains(errOut, "no space") {
			t.Fatalf("cp onto a full disk: exit %d %q", code, errOut)
		}
		if out := c.must("exec", "dev", "--", "cat", "/mnt/tiny/f"); out != "old\n" {
			t.Fatalf("the old file became %q", out)
		}
	})

	t.Run("the guest running out of memory loses the command, not PID 1", func(t *testing.T) {
		_, _, code := c.run("exec", "dev", "--", "sh", "-c", "tail /dev/zero")
		if code == 0 {
			t.Fatal("tail /dev/zero succeeded")
		}
		if out := c.must("exec", "dev", "--", "echo", "alive"); out != "alive\n" {
			t.Fatalf("after the OOM: %q", out)
		}
	})

	t.Run("a call cut off by a stop is 409 interrupted", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.CloseWithError(errors.New("the test stopped sending"))
		done := make(chan error, 1)
		go func() { done <- svc.WriteFileFrom(ctx, "dev", "/root/slow", 0, pr) }()
		pw.Write(make([]byte, 1<<20))
		// Stop while the write waits for the rest of its body: the
		// answer comes without it.
		time.Sleep(200 * time.Millisecond)
		c.must("stop", "dev")
		var se *apiclient.StatusError
		select {
		case err := <-done:
			if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Code != api.CodeInterrupted {
				t.Fatalf("a write cut off by a stop: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("no answer to a write cut off by a stop")
		}
		c.must("resume", "dev")
	})

	t.Run("a guest panic mid-call is 503 unavailable and leaves the VM defunct", func(t *testing.T) {
		vm, err := svc.Info(ctx, "dev")
		if err != nil || vm.Process == nil {
			t.Fatalf("info: %+v %v", vm, err)
		}
		calls := startCutCalls(t, c, agent, svc, "panic")
		_, errOut, code := c.run("exec", "dev", "--", "sh", "-c", "echo c > /proc/sysrq-trigger")
		const panicked = "the guest's kernel panicked during the call (Kernel panic - not syncing: sysrq triggered crash), which stopped the VM"
		if code == 0 || !strings.Contains(errOut, panicked) {
			t.Errorf("the command that panicked the guest: exit %d %q", code, errOut)
		}
		calls.check(t, http.StatusServiceUnavailable, api.CodeUnavailable, panicked, "capsem logs shows its last output")
		// Not half alive: the VM is defunct, its processes are gone, and
		// a call says so.
		deadline := time.Now().Add(30 * time.Second)
		for state(t, c, "dev") != api.StateDefunct {
			if time.Now().After(deadline) {
				t.Fatalf("the VM whose guest panicked is %q, not defunct", state(t, c, "dev"))
			}
			time.Sleep(200 * time.Millisecond)
		}
		if left := testkit.VMProcesses(runDir); len(left) > 0 {
			t.Errorf("the VM's process outlived its guest's panic: %v", left)
		}
		if err := syscall.Kill(vm.Process.QEMUPID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("QEMU (pid %d) outlived its guest's panic: %v", vm.Process.QEMUPID, err)
		}
		if _, errOut, code := c.run("exec", "dev", "--", "true"); code == 0 || !strings.Contains(errOut, "defunct") {
			t.Errorf("exec on the VM whose guest panicked: exit %d %q", code, errOut)
		}
		c.must("resume", "dev")
		if out := c.must("exec", "dev", "--", "echo", "back"); out != "back\n" {
			t.Fatalf("after the resume: %q", out)
		}
	})

	t.Run("a running command is in the ledger, and stays there when its process dies", func(t *testing.T) {
		cmdDone := make(chan string, 1)
		go func() {
			out, errOut, code := c.run("exec", "dev", "--", "sleep", "60")
			cmdDone <- fmt.Sprintf("exit %d %q %q", code, out, errOut)
		}()
		pending := func() []any {
			res, err := svc.Inspect(ctx, "dev", api.InspectRequest{SQL: "SELECT pending, exit_code FROM exec_events WHERE command = 'sleep 60'"})
			if err != nil || len(res.Rows) > 1 {
				t.Fatalf("the command's row: %v %v", res.Rows, err)
			}
			if len(res.Rows) == 0 {
				return nil
			}
			return res.Rows[0]
		}
		deadline := time.Now().Add(30 * time.Second)
		for pending() == nil {
			if time.Now().After(deadline) {
				res, _ := svc.Inspect(ctx, "dev", api.InspectRequest{SQL: "SELECT command, pending FROM exec_events"})
				select {
				case ended := <-cmdDone:
					t.Fatalf("no row for the running command; it ended: %s; rows %v", ended, res.Rows)
				default:
					t.Fatalf("no row for the running command; rows %v", res.Rows)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		if r := pending(); r[0] != float64(1) || r[1] != nil {
			t.Fatalf("the running command's row: %v, want pending", r)
		}
		// Kill the VM's process: the row it wrote before the command
		// started is there, pending.
		vm, err := svc.Info(ctx, "dev")
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(vm.PID, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-cmdDone
		if r := pending(); r == nil || r[0] != float64(1) {
			t.Fatalf("after the process died, the command's row is %v, want pending", r)
		}
	})

	t.Run("a call cut off by a removal is 409 interrupted", func(t *testing.T) {
		if state(t, c, "dev") != api.StateRunning {
			c.must("resume", "dev") // the last subtest killed its process
		}
		calls := startCutCalls(t, c, agent, svc, "removal")
		c.must("rm", "dev")
		calls.check(t, http.StatusConflict, api.CodeInterrupted, "VM dev was stopped or removed during the call", "run it again once the VM runs")
	})
}

// state is a VM's state as capsem info tells it.
func state(t *testing.T, c capsemCLI, vm string) api.VMState {
	t.Helper()
	var v api.VM
	if err := json.Unmarshal([]byte(c.must("info", vm, "--json")), &v); err != nil {
		t.Fatal(err)
	}
	return v.State
}

// cutCalls are calls in flight in VM dev, each through a client of its
// own, for a stop, a removal or a guest panic to cut off: a command
// through the CLI (its streamed exec), one through capsem mcp's
// capsem_exec, one through the service's JSON exec, and a streamed read
// of a 60 MB file that its reader slows to last far longer than the test.
type cutCalls struct {
	cli   chan string // exit status and stderr
	agent chan string // the tool error
	exec  chan error
	read  chan error
}

// startCutCalls starts the calls (label tells their commands apart in the
// ledger) and returns once each is under way in the guest.
func startCutCalls(t *testing.T, c capsemCLI, agent capsemMCP, svc *apiclient.ServiceClient, label string) *cutCalls {
	t.Helper()
	ctx := context.Background()
	cc := &cutCalls{cli: make(chan string, 1), agent: make(chan string, 1), exec: make(chan error, 1), read: make(chan error, 1)}
	cliCmd, agentCmd, execCmd := "sleep 60 # cli "+label, "sleep 60 # mcp "+label, "sleep 60 # api "+label
	// Its own file, sparse: the guest kernel's panic and the process's
	// SIGKILL of the subtests before lose whatever the guest did not sync.
	c.must("exec", "dev", "--", "truncate", "-s", "60000000", "/root/cut")
	go func() {
		_, errOut, code := c.run("exec", "dev", "--", "sh", "-c", cliCmd)
		cc.cli <- fmt.Sprintf("exit %d: %s", code, errOut)
	}()
	go func() { cc.agent <- agent.call("capsem_exec", map[string]any{"id": "dev", "command": agentCmd}, nil) }()
	go func() {
		_, err := svc.Exec(ctx, "dev", api.ExecRequest{Command: execCmd})
		cc.exec <- err
	}()
	reading := make(chan struct{})
	go func() {
		_, _, err := svc.ReadFileTo(ctx, "dev", "/root/cut", false, &slowWriter{first: reading})
		cc.read <- err
	}()
	select {
	case <-reading:
	case err := <-cc.read:
		t.Fatalf("the read ended before it was cut off: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the read sent nothing")
	}
	sql := fmt.Sprintf("SELECT COUNT(*) FROM exec_events WHERE pending = 1 AND command IN ('sh -c %s', '%s', '%s')", cliCmd, agentCmd, execCmd)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := svc.Inspect(ctx, "dev", api.InspectRequest{SQL: sql})
		if err != nil {
			t.Fatal(err)
		}
		if res.Rows[0][0] == float64(3) {
			return cc
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v of the 3 commands run after 30 s", res.Rows[0][0])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// check waits for every call's end and checks each says what cut it off
// (why), the clients with the hint the code gives (hint), and the
// service's API with status and code.
func (cc *cutCalls) check(t *testing.T, status int, code, why, hint string) {
	t.Helper()
	wait := func(what string, c <-chan error) error {
		select {
		case err := <-c:
			return err
		case <-time.After(time.Minute):
			t.Fatalf("%s: no answer a minute after it was cut off", what)
			return nil
		}
	}
	for what, c := range map[string]chan error{"the JSON exec": cc.exec, "the streamed read": cc.read} {
		err := wait(what, c)
		var se *apiclient.StatusError
		if !errors.As(err, &se) || se.Status != status || se.Code != code || !strings.Contains(se.Message, why) {
			t.Errorf("%s: %v, want %d %s saying %q", what, err, status, code, why)
		}
	}
	for what, c := range map[string]chan string{"capsem exec": cc.cli, "capsem mcp's capsem_exec": cc.agent} {
		var msg string
		select {
		case msg = <-c:
		case <-time.After(time.Minute):
			t.Fatalf("%s: no answer a minute after it was cut off", what)
		}
		if !strings.Contains(msg, why) || !strings.Contains(msg, hint) || strings.HasPrefix(msg, "exit 0:") {
			t.Errorf("%s said %q, want it to fail saying %q and %q", what, msg, why, hint)
		}
		t.Logf("%s said: %s", what, msg)
	}
}

// slowWriter takes 1 MiB a second (first is closed at its first write):
// a 60 MB transfer into it stays in flight for a minute, and never waits
// on it for long.
type slowWriter struct {
	first   chan struct{}
	started bool
}

func (w *slowWriter) Write(p []byte) (int, error) {
	if !w.started {
		w.started = true
		close(w.first)
	}
	time.Sleep(time.Duration(len(p)) * time.Second / (1 << 20))
	return len(p), nil
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("the client's disk failed") }

// guestPeakKiB is a guest process's peak resident memory (VmHWM).
func guestPeakKiB(t *testing.T, c capsemCLI, pid int) int {
	t.Helper()
	out := c.must("exec", "dev", "--", "grep", "VmHWM", fmt.Sprintf("/proc/%d/status", pid))
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("VmHWM: %q", out)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("VmHWM: %q", out)
	}
	return n
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func writeRandom(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := os.Open("/dev/urandom")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := io.CopyN(f, r, n); err != nil {
		t.Fatal(err)
	}
}
