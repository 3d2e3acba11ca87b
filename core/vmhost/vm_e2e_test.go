package vmhost_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/core/vmhost"
)

// vmProc is one real `capsem process` with its QEMU guest, started as
// the service and `capsem run` start it (vmhost.Launch).
type vmProc struct {
	proc       *vmhost.Process
	client     *apiclient.ProcessClient
	sessionDir string
	info       *api.Info
	log        string
}

// testEnv is the environment of a test VM's process: the shared test home
// and cache, and no corp configuration.
func testEnv(t testing.TB) []string {
	return append(os.Environ(), "CAPSEM_HOME="+testkit.CapsemHome(t), "CAPSEM_CACHE_DIR="+testkit.CacheDir(t), testkit.NoCorpConfig(t))
}

// launchVM starts a VM whose session directory is dir/session, configured
// as edit says, and waits until it is ready. The caller stops it (the
// shared VM outlives the test that first asked for it).
func launchVM(t testing.TB, name, dir string, edit ...func(*vmhost.ProcessConfig)) *vmProc {
	t.Helper()
	session := paths.Session{Dir: filepath.Join(dir, "session")}
	cfg := vmhost.ProcessConfig{SessionDir: session.Dir, Socket: filepath.Join(dir, "process.sock"), Name: name,
		GuestBin: testkit.GuestBinary(t), VMConfig: api.VMConfig{NoAutodetect: true, CPUs: 2, RAMMB: 1024}}
	for _, e := range edit {
		e(&cfg)
	}
	proc, err := vmhost.Launch(cfg, vmhost.LaunchOptions{Executable: testkit.CapsemBinary(t), Env: testEnv(t)})
	if err != nil {
		t.Fatal(err)
	}
	v := &vmProc{proc: proc, client: proc.Client, sessionDir: session.Dir, log: session.ProcessLog()}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	info, err := proc.WaitReady(ctx, nil)
	if err != nil {
		proc.Kill()
		console, _ := os.ReadFile(session.ConsoleLog())
		t.Fatalf("VM %s not ready: %v\nguest console:\n%s", name, err, console)
	}
	v.info = info
	return v
}

// startVM starts a VM in a directory of its own, which stop removes.
func startVM(t testing.TB, name string, edit ...func(*vmhost.ProcessConfig)) *vmProc {
	t.Helper()
	dir, err := os.MkdirTemp("", "capsem-vm-")
	if err != nil {
		t.Fatal(err)
	}
	return launchVM(t, name, dir, edit...)
}

func (v *vmProc) stop(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.proc.Stop(ctx); err != nil {
		t.Errorf("stopping the VM: %v", err)
	}
	os.RemoveAll(filepath.Dir(v.sessionDir))
}

type execOut struct {
	ev             *api.ExecEvent
	stdout, stderr bytes.Buffer
	err            error
}

func (v *vmProc) exec(ctx context.Context, req *api.ExecRequest) *execOut {
	var o execOut
	o.ev, o.err = v.client.Exec(ctx, req, &o.stdout, &o.stderr)
	return &o
}

var (
	sharedOnce sync.Once
	shared     *vmProc
	sharedErr  string
)

// sharedVM is one VM for every test that does not need a fresh one.
func sharedVM(t *testing.T) *vmProc {
	t.Helper()
	sharedOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				sharedErr = fmt.Sprint(r)
			}
		}()
		shared = startVM(t, "shared")
	})
	if shared == nil {
		t.Fatalf("shared VM failed to boot %s", sharedErr)
	}
	return shared
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.stop(&testing.T{})
	}
	os.Exit(code)
}

func TestExecBasics(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cases := []struct {
		name           string
		req            api.ExecRequest
		stdout, stderr string
		exit           int
	}{
		{"echo", api.ExecRequest{Argv: []string{"echo", "hello", "guest"}}, "hello guest\n", "", 0},
		{"stderr only", api.ExecRequest{Command: "echo oops >&2"}, "", "oops\n", 0},
		{"non-zero exit", api.ExecRequest{Command: "exit 42"}, "", "", 42},
		{"env injection", api.ExecRequest{Command: `echo "$CAPSEM_TEST_VAR"`, Env: map[string]string{"CAPSEM_TEST_VAR": "injected value"}}, "injected value\n", "", 0},
		{"cwd", api.ExecRequest{Command: "pwd", Cwd: "/tmp"}, "/tmp\n", "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := v.exec(ctx, &tc.req)
			if o.err != nil {
				t.Fatal(o.err)
			}
			if o.stdout.String() != tc.stdout || o.stderr.String() != tc.stderr || o.ev.ExitCode != tc.exit {
				t.Fatalf("got stdout %q stderr %q exit %d; want %q %q %d", o.stdout.String(), o.stderr.String(), o.ev.ExitCode, tc.stdout, tc.stderr, tc.exit)
			}
		})
	}
	// The guest runs Debian's generic kernel, not the host's.
	if o := v.exec(ctx, &api.ExecRequest{Argv: []string{"uname", "-r"}}); o.err != nil || !strings.HasSuffix(o.stdout.String(), "-amd64\n") {
		t.Errorf("uname -r: %v %q", o.err, o.stdout.String())
	}
	for _, key := range []string{"LD_PRELOAD", "BASH_ENV", "ENV", "IFS"} {
		o := v.exec(ctx, &api.ExecRequest{Command: "true", Env: map[string]string{key: "x"}})
		if o.err == nil || !strings.Contains(o.err.Error(), key) {
			t.Errorf("env %s must be refused by name, got %v", key, o.err)
		}
	}
}

func TestExecOutputCapAndConcurrency(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	o := v.exec(ctx, &api.ExecRequest{Command: "head -c 20971520 /dev/zero"})
	if o.err != nil {
		t.Fatal(o.err)
	}
	if !o.ev.StdoutTruncated || o.ev.StdoutBytes != 20<<20 || o.stdout.Len() != 10<<20 {
		t.Fatalf("20 MiB: truncated=%v bytes=%d received=%d", o.ev.StdoutTruncated, o.ev.StdoutBytes, o.stdout.Len())
	}
	var wg sync.WaitGroup
	results := make([]*execOut, 8)
	start := time.Now()
	for i := range results {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = v.exec(ctx, &api.ExecRequest{Command: fmt.Sprintf("sleep 1; echo %d", i)})
		}(i)
	}
	wg.Wait()
	for i, r := range results {
		if r.err != nil || r.stdout.String() != fmt.Sprintf("%d\n", i) {
			t.Fatalf("exec %d: %v %q", i, r.err, r.stdout.String())
		}
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("8 concurrent 1 s execs took %v: they did not run at once", d)
	}
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := v.exec(ctx, &api.ExecRequest{Command: "sleep 1000 & sleep 1000", TimeoutMS: 500})
	if o.err != nil || !o.ev.TimedOut {
		t.Fatalf("timeout: %v %+v", o.err, o.ev)
	}
	ps := v.exec(ctx, &api.ExecRequest{Command: "ps -o args | grep -c '^sleep 1000' || true"})
	if strings.TrimSpace(ps.stdout.String()) != "0" {
		t.Fatalf("sleep processes survived the timeout: %q", ps.stdout.String())
	}
}

func TestFilesRoundTripAndSymlinks(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	data := make([]byte, 5<<20)
	rand.Read(data)
	if err := v.client.WriteFile(ctx, "/root/blob.bin", data, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := v.client.ReadFile(ctx, "/root/blob.bin", false, 0)
	if err != nil || !bytes.Equal(back, data) {
		t.Fatalf("5 MiB round trip: %v (len %d)", err, len(back))
	}
	sum := v.exec(ctx, &api.ExecRequest{Command: "wc -c < /root/blob.bin; stat -c %a /root/blob.bin"})
	if got := strings.Fields(sum.stdout.String()); len(got) != 2 || got[0] != fmt.Sprint(5<<20) || got[1] != "600" {
		t.Fatalf("guest sees size and mode %q, want %d bytes, mode 600", sum.stdout.String(), 5<<20)
	}
	// An empty file is a file, not a missing body.
	if err := v.client.WriteFile(ctx, "/root/empty", nil, 0); err != nil {
		t.Fatal(err)
	}
	if back, err := v.client.ReadFile(ctx, "/root/empty", false, 0); err != nil || len(back) != 0 {
		t.Fatalf("empty file: %q, %v", back, err)
	}
	if _, err := v.client.ReadFile(ctx, "/root/no-such-file", false, 0); err == nil || !strings.Contains(err.Error(), "no-such-file") {
		t.Fatalf("reading a missing file: %v", err)
	}
	v.exec(ctx, &api.ExecRequest{Command: "mkdir -p /tmp/real && ln -sfn /etc /tmp/linkdir && ln -sf /etc/hostname /tmp/linkfile"})
	if err := v.client.WriteFile(ctx, "/tmp/linkdir/evil", []byte("x"), 0o644); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("write through a symlinked directory: %v", err)
	}
	if _, err := v.client.ReadFile(ctx, "/tmp/linkfile", false, 0); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("read of a symlink: %v", err)
	}
	host, err := v.client.ReadFile(ctx, "/etc/hostname", false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := v.client.ReadFile(ctx, "/tmp/linkfile", true, 0); err != nil || !bytes.Equal(b, host) {
		t.Fatalf("read following the symlink: %q, %v; want %q", b, err, host)
	}
	if _, err := v.client.ReadFile(ctx, "/nonexistent/file", false, 0); err == nil {
		t.Fatal("missing file read succeeded")
	}
}

func TestGuestMCPThroughTheRelay(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	script := `printf '%s\n' ` +
		`'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"guest","version":"1"}}}' ` +
		`'{"jsonrpc":"2.0","method":"notifications/initialized"}' ` +
		`'{"jsonrpc":"2.0","id":2,"method":"tools/list"}' ` +
		`'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"builtin__http_head","arguments":{"url":"http://127.0.0.1:9/"}}}' ` +
		`| capsem-mcp-server`
	o := v.exec(ctx, &api.ExecRequest{Command: script})
	if o.err != nil || o.ev.ExitCode != 0 {
		t.Fatalf("relay in the guest: %v exit %d stderr %s", o.err, o.ev.ExitCode, o.stderr.String())
	}
	out := o.stdout.String()
	for _, want := range []string{`"id":1,"result"`, `"capsem-gateway"`, `"builtin__fetch_http"`, `"id":3,"result"`, `private or loopback`} {
		if !strings.Contains(out, want) {
			t.Errorf("relay output lacks %s:\n%.2000s", want, out)
		}
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(v.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	// The relay's parent in the guest is the shell running the pipeline.
	db.QueryRow(`SELECT COUNT(*) FROM mcp_calls WHERE method IN ('initialize','tools/list','tools/call') AND process_name='sh' AND transport='frame'`).Scan(&n)
	if n != 3 {
		t.Errorf("%d ledger rows attributed to the guest's sh, want 3", n)
	}
	db.QueryRow(`SELECT COUNT(*) FROM net_events WHERE domain='127.0.0.1' AND decision='denied'`).Scan(&n)
	if n != 1 {
		t.Errorf("net_events denied rows: %d", n)
	}
	db.QueryRow(`SELECT COUNT(*) FROM exec_events WHERE command LIKE '%capsem-mcp-server%' AND exit_code = 0`).Scan(&n)
	if n != 1 {
		t.Errorf("exec_events rows for the relay run: %d", n)
	}
}

// TestGuestMCPPolicyReload: `capsem policy reload` reaches a running VM's
// endpoint, and the guest's next request sees the new policy.
func TestGuestMCPPolicyReload(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "policy.toml")
	if err := os.WriteFile(cfg, []byte("[mcp]\ndefault = \"allow\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := startVM(t, "policyvm", func(c *vmhost.ProcessConfig) { c.Config = cfg })
	defer v.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	script := `printf '%s\n' ` +
		`'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"guest","version":"1"}}}' ` +
		`'{"jsonrpc":"2.0","id":2,"method":"tools/list"}' ` +
		`'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"builtin__http_head","arguments":{"url":"http://127.0.0.1:9/"}}}' ` +
		`| capsem-mcp-server`
	o := v.exec(ctx, &api.ExecRequest{Command: script})
	if o.err != nil || !strings.Contains(o.stdout.String(), `"id":3,"result"`) || !strings.Contains(o.stdout.String(), `"builtin__http_head"`) {
		t.Fatalf("before the reload: %v\n%s", o.err, o.stdout.String())
	}
	os.WriteFile(cfg, []byte("[mcp.tools]\n\"builtin__http_head\" = \"block\"\n"), 0o600)
	reload := exec.CommandContext(ctx, testkit.CapsemBinary(t), "policy", "reload")
	reload.Env = append(os.Environ(), "CAPSEM_HOME="+testkit.CapsemHome(t))
	out, err := reload.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reloaded vm policyvm") {
		t.Fatalf("policy reload: %v\n%s", err, out)
	}
	o = v.exec(ctx, &api.ExecRequest{Command: script})
	got := o.stdout.String()
	if o.err != nil || !strings.Contains(got, `"id":3,"error":{"code":-32600`) || !strings.Contains(got, "tools.builtin__http_head") {
		t.Fatalf("after the reload the call was not blocked: %v\n%s", o.err, got)
	}
	if strings.Contains(got, `"builtin__http_head"`) || !strings.Contains(got, `"builtin__http_get"`) {
		t.Errorf("tools/list after the reload does not hide exactly the blocked tool:\n%.3000s", got)
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(v.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	db.QueryRow(`SELECT COUNT(*) FROM mcp_calls WHERE tool_name='builtin__http_head' AND decision='denied' AND policy_rule='tools.builtin__http_head' AND process_name='sh'`).Scan(&n)
	if n != 1 {
		t.Errorf("%d denied rows for the blocked guest call, want 1", n)
	}
}

func TestKillingQEMUFailsTheExecAtOnce(t *testing.T) {
	v := startVM(t, "victim")
	defer os.RemoveAll(filepath.Dir(v.sessionDir))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan *execOut, 1)
	go func() { done <- v.exec(ctx, &api.ExecRequest{Command: "sleep 1000"}) }()
	time.Sleep(500 * time.Millisecond)
	qemu := v.info.QEMUPID
	killed := time.Now()
	if err := syscall.Kill(qemu, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-done:
		if o.err == nil {
			t.Fatalf("exec survived QEMU's death: %+v", o.ev)
		}
		// It says what happened, with the code a guest that is gone has.
		var se *apiclient.StatusError
		if !errors.As(o.err, &se) || se.Code != api.CodeUnavailable || !strings.Contains(se.Message, "QEMU exited during the call") {
			t.Fatalf("exec when QEMU died: %v", o.err)
		}
		if d := time.Since(killed); d > time.Second {
			t.Fatalf("exec failed %v after QEMU died, want < 1s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec still waiting 10 s after QEMU died")
	}
	select {
	case <-v.proc.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the VM process did not exit after QEMU died")
	}
	// QEMU was reaped: no zombie remains.
	if err := syscall.Kill(qemu, 0); err == nil {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", qemu))
		t.Fatalf("QEMU %d still exists: %s", qemu, b)
	}
}

func TestConsoleLogs(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs, err := v.client.Logs(ctx, 500, "")
	if err != nil {
		t.Fatal(err)
	}
	// The agent logs to the console: a line as soon as init runs, or for
	// a VM resumed from a saved boot as soon as it is woken (so a start
	// that hangs shows how far it got), then its connect line.
	first := `"msg":"init started"`
	if v.info.Start == vmhost.ModeResume.String() {
		first = `"msg":"woken"`
	}
	started, connected := strings.Index(logs, first), strings.Index(logs, "connected to the host")
	if started < 0 || connected < started {
		t.Fatalf("console log of a %s VM lacks %s before the agent's connect line:\n%.1500s", v.info.Start, first, logs)
	}
	only, err := v.client.Logs(ctx, 5, "connected to the host")
	if err != nil || strings.Count(strings.TrimSpace(only), "\n") > 4 || !strings.Contains(only, "connected") {
		t.Fatalf("grep/tail: %v %q", err, only)
	}
	if _, err := v.client.Logs(ctx, -1, ""); err != nil {
		t.Fatalf("tail<=0 means the default: %v", err)
	}
}

// TestGuestKernelLoadedTheImageModules: the modules the image builder
// patched loaded without the kernel complaining (a wrong patch shows up as a
// warning, a fault or an unknown symbol), the filesystems they provide are
// registered, and the tables it left unloaded are absent as the README
// says: no module trace events in tracefs, while the kernel's own remain.
func TestGuestKernelLoadedTheImageModules(t *testing.T) {
	v := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const script = `dmesg
echo "::fs $(grep -cwE 'ext4|overlay|9p' /proc/filesystems)"
mkdir -p /sys/kernel/tracing && mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
echo "::events $(ls /sys/kernel/tracing/events | tr '\n' ' ')"
`
	o := v.exec(ctx, &api.ExecRequest{Command: script})
	if o.err != nil || o.ev.ExitCode != 0 {
		t.Fatalf("exec: %v (exit %d) %s", o.err, o.ev.ExitCode, o.stderr.String())
	}
	out := o.stdout.String()
	var events []string
	filesystems := ""
	for _, line := range strings.Split(out, "\n") {
		// Faults and loader refusals only: a stall report (RCU, soft lockup,
		// hung task) says the host starved the VM, not that a module is bad.
		for _, bad := range []string{"WARNING:", "Oops", "kernel BUG at", "BUG: unable to handle", "BUG: kernel NULL pointer",
			"general protection fault", "Unknown symbol", "disagrees about version", "invalid module format"} {
			if strings.Contains(line, bad) {
				t.Errorf("guest kernel log: %s", line)
			}
		}
		if rest, ok := strings.CutPrefix(line, "::fs "); ok {
			filesystems = rest
		}
		if rest, ok := strings.CutPrefix(line, "::events "); ok {
			events = strings.Fields(rest)
		}
	}
	if filesystems != "3" {
		t.Errorf("%q of ext4, overlay and 9p registered in /proc/filesystems, want 3", filesystems)
	}
	if !slices.Contains(events, "sched") {
		t.Fatalf("tracefs lists no kernel events (%v): the check below would prove nothing", events)
	}
	for _, e := range []string{"ext4", "jbd2", "9p"} {
		if slices.Contains(events, e) {
			t.Errorf("tracefs lists the %s module's events; the image should leave them unloaded", e)
		}
	}
}

// launchFailure launches a VM that must fail before it is ready and
// returns why (with the last lines of its log).
func launchFailure(t *testing.T, dir string, edit func(*vmhost.ProcessConfig)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return launchFailureWithin(ctx, t, dir, edit)
}

func launchFailureWithin(ctx context.Context, t *testing.T, dir string, edit func(*vmhost.ProcessConfig)) error {
	t.Helper()
	cfg := vmhost.ProcessConfig{SessionDir: filepath.Join(dir, "session"), Socket: filepath.Join(dir, "p.sock"), Name: "failing",
		GuestBin: testkit.GuestBinary(t), VMConfig: api.VMConfig{NoAutodetect: true, CPUs: 2, RAMMB: 1024}}
	edit(&cfg)
	proc, err := vmhost.Launch(cfg, vmhost.LaunchOptions{Executable: testkit.CapsemBinary(t), Env: testEnv(t)})
	if err != nil {
		return err
	}
	defer proc.Kill()
	info, err := proc.WaitReady(ctx, nil)
	if err == nil {
		t.Fatalf("the VM became ready: %+v", info)
	}
	if werr := proc.Wait(); werr == nil {
		t.Errorf("the failed process exited 0")
	}
	return err
}

// TestBadConfigFailsBeforeBoot: an invalid policy file stops `capsem
// process` with an error naming the file and key, before any VM exists.
func TestBadConfigFailsBeforeBoot(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bad.toml")
	os.WriteFile(cfg, []byte("[mcp]\ndefault = \"perhaps\"\n"), 0o600)
	err := launchFailure(t, dir, func(c *vmhost.ProcessConfig) { c.SessionDir = filepath.Join(dir, "s"); c.Config = cfg })
	if !strings.Contains(err.Error(), "bad.toml") || !strings.Contains(err.Error(), `mcp.default: "perhaps" is not a decision`) {
		t.Fatalf("want a failure naming the file and key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "s", "console.log")); !os.IsNotExist(err) {
		t.Errorf("a VM was started for an invalid configuration: %v", err)
	}
}

// TestLedgerFailureStopsTheBoot: the ledger opens beside the boot, so a
// session.db that cannot be opened is found only once the guest is up;
// the process must still fail, name the ledger, and leave no QEMU behind.
func TestLedgerFailureStopsTheBoot(t *testing.T) {
	dir := t.TempDir()
	session := filepath.Join(dir, "s")
	if err := os.MkdirAll(filepath.Join(session, "session.db"), 0o700); err != nil {
		t.Fatal(err)
	}
	// A process that wrongly boots on would serve forever: bound it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := launchFailureWithin(ctx, t, dir, func(c *vmhost.ProcessConfig) { c.SessionDir = session })
	if ctx.Err() != nil || !strings.Contains(err.Error(), "opening session ledger") {
		t.Fatalf("want a failure naming the ledger: %v", err)
	}
	// QEMU died with the process (it is reaped in teardown; the console
	// log shows the guest got as far as its agent).
	if b, err := exec.Command("pgrep", "-f", "qemu-system.*"+session).Output(); err == nil && len(bytes.TrimSpace(b)) > 0 {
		t.Fatalf("QEMU still runs after the failed boot: pids %s", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "p.sock")); !os.IsNotExist(err) {
		t.Errorf("the API socket exists after a failed boot: %v", err)
	}
}

// cpuTime is the CPU time process pid has used so far (user and system).
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// After the command name in parentheses: state is field 3, utime 14
	// and stime 15, in clock ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	var user, sys int64
	if _, err := fmt.Sscan(f[11], &user); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscan(f[12], &sys); err != nil {
		t.Fatal(err)
	}
	return time.Duration(user+sys) * 10 * time.Millisecond
}

// TestConsoleLogIsBoundedWhileTheVMRuns: a guest writing its serial console
// as fast as it can fills no more than the console log's bound and one
// rotated predecessor, costs the per-VM process little CPU (QEMU writes the
// console a byte at a time), the newest lines stay readable through the
// logs route, and the VM runs on.
func TestConsoleLogIsBoundedWhileTheVMRuns(t *testing.T) {
	const bound = 64 << 10
	v := startVM(t, "noisy", func(c *vmhost.ProcessConfig) { c.ConsoleLogMaxKiB = bound >> 10; c.DiskGB = new(0) })
	defer v.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 600 KB, about ten times the bound, then a last line.
	cpu := cpuTime(t, v.info.PID)
	o := v.exec(ctx, &api.ExecRequest{Command: `head -c 600000 /dev/zero | tr '\0' x > /dev/ttyS0; echo; echo the-last-line > /dev/ttyS0`})
	if o.err != nil || o.ev.ExitCode != 0 {
		t.Fatalf("writing the console: %+v %v %s", o.ev, o.err, o.stderr.String())
	}
	// Read as it came, the console cost this process 2.5 s of CPU here;
	// gathered from a pipe, 0.05 s.
	if used := cpuTime(t, v.info.PID) - cpu; used > time.Second {
		t.Errorf("the per-VM process used %v of CPU while the guest wrote 600 KB to its console", used)
	} else {
		t.Logf("the per-VM process used %v of CPU while the guest wrote 600 KB to its console", used)
	}
	console := filepath.Join(v.sessionDir, "console.log")
	deadline := time.Now().Add(30 * time.Second)
	for {
		text, err := v.client.Logs(ctx, 3, "")
		if err == nil && strings.Contains(text, "the-last-line") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last console line never showed in the logs route: %q %v", text, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var total int64
	for _, p := range []string{console, console + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: %v (the log should have rotated)", p, err)
		}
		// A write that would pass the bound starts a new file first, so a
		// file passes it only by one copy buffer (32 KiB) at most.
		if st.Size() > bound+32<<10 {
			t.Errorf("%s is %d bytes, the bound is %d", p, st.Size(), bound)
		}
		total += st.Size()
	}
	if _, err := os.Stat(console + ".2"); err == nil {
		t.Error("more than one rotated console log is kept")
	}
	if total >= 600000 {
		t.Fatalf("the console logs hold %d bytes after the guest wrote 600000", total)
	}
	if o := v.exec(ctx, &api.ExecRequest{Argv: []string{"echo", "alive"}}); o.err != nil || o.stdout.String() != "alive\n" {
		t.Fatalf("after the flood: %q %v", o.stdout.String(), o.err)
	}
}
