package privsep

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/envvars"
)

// The test binary doubles as the sandboxed child. TestMain calls Enter
// exactly as capsem's main does, then runs one of these modes, named by
// argv[1] so that no test variable pollutes the environment under test.
const (
	modeProbe        = "__privsep_probe__"
	modeIntermediate = "__privsep_intermediate__"
	modeSleeper      = "__privsep_sleeper__"
	// modeSleeperOffMain is modeSleeper with Enter called off the main
	// thread, as it may be in a program whose main goroutine moved.
	modeSleeperOffMain = "__privsep_sleeper_off_main__"
	enterFailed        = 3 // exit status when Enter fails
)

func TestMain(m *testing.M) {
	enter := Enter
	if len(os.Args) >= 2 && os.Args[1] == modeSleeperOffMain {
		enter = enterOffMainThread
	}
	if err := enter(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(enterFailed)
	}
	if len(os.Args) >= 3 {
		switch os.Args[1] {
		case modeProbe:
			os.Exit(runProbe(os.Args[2]))
		case modeIntermediate:
			os.Exit(runIntermediate(os.Args[2]))
		}
	}
	if len(os.Args) >= 2 && (os.Args[1] == modeSleeper || os.Args[1] == modeSleeperOffMain) {
		fmt.Printf("ready %d\n", os.Getpid())
		time.Sleep(time.Hour)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// enterOffMainThread runs Enter on a thread other than the one the main
// goroutine holds. The parent-death signal armed at fork belongs to the
// thread that was forked; this is the case where the first stage must arm
// it again for the thread that execs.
func enterOffMainThread() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	errc := make(chan error, 1)
	go func() { errc <- Enter() }()
	return <-errc
}

type probeParams struct {
	DeniedDir  string
	DeniedFile string
	DeniedSock string
	Scratch    string
	TestPID    int
}

// probeReport is what the sandboxed child observes about itself. Results
// of operations are "ok", an errno name such as "EACCES", or an error text.
type probeReport struct {
	Status        map[string]string
	Threads       []map[string]string
	Env           []string
	Cwd           string
	Pid           int
	Pgid          int
	ParentPgid    int
	OpenDenied    string
	ListDenied    string
	CreateDenied  string
	DialDenied    string
	SocketPair    string
	ParentEnviron string
	SignalParent  string
	ReadHostname  string
	WriteScratch  string
	TruncDevNull  string
	// ThreadOpens are opens of the denied file from distinct locked OS
	// threads of the second stage; ThreadIDs proves they were distinct.
	ThreadOpens []string
	ThreadIDs   int
	Grandchild  string
	GrandErr    string
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

func procStatus(path string) map[string]string {
	out := map[string]string{}
	raw, err := os.ReadFile(path)
	if err != nil {
		out["error"] = err.Error()
		return out
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs" || k == "Seccomp") {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func runProbe(arg string) int {
	var p probeParams
	if err := json.Unmarshal([]byte(arg), &p); err != nil {
		fmt.Fprintln(os.Stderr, "probe params:", err)
		return 2
	}
	r := probeReport{Status: procStatus("/proc/self/status"), Env: os.Environ(), Pid: os.Getpid()}
	slices.Sort(r.Env)
	r.Cwd, _ = os.Getwd()
	r.Pgid, _ = unix.Getpgid(0)
	r.ParentPgid, _ = unix.Getpgid(unix.Getppid())

	_, err := os.ReadFile(p.DeniedFile)
	r.OpenDenied = result(err)
	_, err = os.ReadDir(p.DeniedDir)
	r.ListDenied = result(err)
	err = os.WriteFile(filepath.Join(p.DeniedDir, "planted"), []byte("x"), 0o600)
	r.CreateDenied = result(err)
	if c, err := net.Dial("unix", p.DeniedSock); err == nil {
		c.Close()
		r.DialDenied = "ok"
	} else {
		r.DialDenied = result(err)
	}
	if fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		r.SocketPair = "ok"
	} else {
		r.SocketPair = result(err)
	}
	_, err = os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.TestPID))
	r.ParentEnviron = result(err)
	r.SignalParent = result(unix.Kill(p.TestPID, 0))
	_, err = os.ReadFile("/etc/hostname")
	r.ReadHostname = result(err)
	f := filepath.Join(p.Scratch, "written")
	err = os.WriteFile(f, []byte("scratch"), 0o600)
	if err == nil {
		var b []byte
		if b, err = os.ReadFile(f); err == nil && string(b) != "scratch" {
			err = fmt.Errorf("read back %q", b)
		}
	}
	r.WriteScratch = result(err)
	if dn, err := os.OpenFile("/dev/null", os.O_WRONLY|os.O_TRUNC, 0); err == nil {
		dn.Close()
		r.TruncDevNull = "ok"
	} else {
		r.TruncDevNull = result(err)
	}

	// Open the denied file from several OS threads at once (each goroutine
	// holds its thread), to show the restriction is not confined to the
	// thread that built the ruleset in the first stage.
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	tids := map[int]bool{}
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			<-start
			_, err := os.ReadFile(p.DeniedFile)
			mu.Lock()
			tids[unix.Gettid()] = true
			r.ThreadOpens = append(r.ThreadOpens, result(err))
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	r.ThreadIDs = len(tids)
	// Read every thread's status after the goroutines above created threads.
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		st := procStatus("/proc/self/task/" + t.Name() + "/status")
		if e, ok := st["error"]; ok && strings.Contains(e, "no such file or directory") {
			continue // the thread exited after the listing: nothing left to check
		}
		r.Threads = append(r.Threads, st)
	}

	// The grandchild is a shell, as an external server would be, in a
	// sandbox nested in this one.
	self, err := os.Executable()
	if err != nil {
		r.GrandErr = err.Error()
	} else {
		script := `cat "$1"; echo "cat_rc=$?"; grep -E '^(NoNewPrivs|CapEff|CapBnd|Seccomp):' /proc/self/status; echo "pgid=$(cut -d' ' -f5 /proc/self/stat)"; ` +
			`cat /proc/$PPID/environ >/dev/null 2>&1; echo "parent_environ_rc=$?"; kill -0 $PPID 2>/dev/null; echo "signal_parent_rc=$?"; ` +
			`ls "$2" >/dev/null 2>&1; echo "list_parent_scratch_rc=$?"; echo mine >"$HOME/f" && echo "write_home_rc=0"; env`
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd, err := Command(ctx, Spec{
			Executable: self,
			Run:        []string{"/bin/sh", "-c", script, "sh", p.DeniedFile, p.Scratch},
			Env:        map[string]string{"GRANDCHILD_EXTRA": "1"},
			Scratch:    filepath.Join(p.Scratch, "grandchild"),
		})
		if err != nil {
			r.GrandErr = err.Error()
		} else {
			out, err := cmd.CombinedOutput()
			r.Grandchild = string(out)
			if err != nil {
				r.GrandErr = err.Error()
			}
		}
		cancel()
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "probe report:", err)
		return 2
	}
	return 0
}

// requireLandlock skips (or, under CI, fails) when the kernel has no
// Landlock; the fail-closed path is covered by TestApplyLandlockUnavailable.
func requireLandlock(t *testing.T) int {
	t.Helper()
	abi, err := landlockABI()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("landlock unavailable under CI: %v", err)
		}
		t.Skipf("landlock unavailable: %v", err)
	}
	return abi
}

func testExecutable(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// deniedFixture makes a directory the child must not reach, holding a
// secret file and a listening Unix socket (stand-ins for the session
// directory, session.db and the service socket).
func deniedFixture(t *testing.T) (dir, file, sock string) {
	t.Helper()
	dir = t.TempDir()
	file = filepath.Join(dir, "session.db")
	if err := os.WriteFile(file, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock = filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return dir, file, sock
}

func TestSandboxFromChildView(t *testing.T) {
	abi := requireLandlock(t)
	exe := testExecutable(t)
	deniedDir, deniedFile, deniedSock := deniedFixture(t)
	scratch := filepath.Join(t.TempDir(), "scratch") // Command creates it
	cache := t.TempDir()

	t.Setenv("LANG", "C.UTF-8")
	t.Setenv("SECRET_TOKEN", "must-not-leak")
	t.Setenv("CAPSEM_MCP_LOG", "debug")
	t.Setenv("CAPSEM_OTHER", "not passed")

	params, err := json.Marshal(probeParams{
		DeniedDir: deniedDir, DeniedFile: deniedFile, DeniedSock: deniedSock,
		Scratch: scratch, TestPID: os.Getpid(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, err := Command(ctx, Spec{
		Executable: exe,
		Args:       []string{modeProbe, string(params)},
		Env:        map[string]string{"SERVER_OPT": "x"},
		PassEnv:    []string{"CAPSEM_MCP_*"},
		Scratch:    scratch,
		CacheDir:   cache,
		Protect:    []string{deniedDir},
	})
	if err != nil {
		t.Fatalf("Command: %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe: %v\nstderr:\n%s", err, stderr.String())
	}
	var r probeReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("probe report: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	t.Logf("child view: %+v", r)

	const zero = "0000000000000000"
	root := os.Geteuid() == 0
	checkStatus := func(what string, st map[string]string) {
		t.Helper()
		if st["NoNewPrivs"] != "1" {
			t.Errorf("%s: NoNewPrivs = %q, want 1", what, st["NoNewPrivs"])
		}
		for _, k := range []string{"CapEff", "CapPrm", "CapInh", "CapAmb"} {
			if st[k] != zero {
				t.Errorf("%s: %s = %q, want %s", what, k, st[k], zero)
			}
		}
		if root && st["CapBnd"] != zero {
			t.Errorf("%s: CapBnd = %q, want %s (parent is root)", what, st["CapBnd"], zero)
		}
		if st["Seccomp"] != "2" {
			t.Errorf("%s: Seccomp = %q, want 2 (filter)", what, st["Seccomp"])
		}
	}
	checkStatus("process", r.Status)
	if len(r.Threads) < 2 {
		t.Errorf("saw %d threads, want several", len(r.Threads))
	}
	for i, st := range r.Threads {
		checkStatus(fmt.Sprintf("thread %d", i), st)
	}

	// The environment is exactly the allowlist.
	want := map[string]string{
		"PATH": SafePath, "HOME": scratch, "TMPDIR": scratch,
		"XDG_CACHE_HOME": cache, "npm_config_cache": filepath.Join(cache, "npm"),
		"LANG": "C.UTF-8", "CAPSEM_MCP_LOG": "debug", "SERVER_OPT": "x",
	}
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		if name == "USER" || name == "LOGNAME" || name == "LANGUAGE" || name == "TZ" || strings.HasPrefix(name, "LC_") {
			want[name] = value
		}
	}
	wantSandbox := "nnp,caps,landlock-v" + strconv.Itoa(abi) + ",seccomp"
	want[envvars.Sandbox.Name()] = wantSandbox
	var wantEnv []string
	for k, v := range want {
		wantEnv = append(wantEnv, k+"="+v)
	}
	slices.Sort(wantEnv)
	if !slices.Equal(r.Env, wantEnv) {
		t.Errorf("child environment:\n got %q\nwant %q", r.Env, wantEnv)
	}

	if r.Cwd != scratch {
		t.Errorf("working directory = %q, want %q", r.Cwd, scratch)
	}
	if r.Pgid != r.Pid || r.Pgid == r.ParentPgid || r.Pgid == unix.Getpgrp() {
		t.Errorf("process group: pid %d pgid %d, parent's pgid %d, test's %d; want own group",
			r.Pid, r.Pgid, r.ParentPgid, unix.Getpgrp())
	}
	for what, got := range map[string]string{
		"open denied file": r.OpenDenied, "list denied dir": r.ListDenied,
		"create in denied dir": r.CreateDenied, "connect to denied socket": r.DialDenied,
		"read parent's /proc environ": r.ParentEnviron,
	} {
		if got != "EACCES" {
			t.Errorf("%s: %s, want EACCES", what, got)
		}
	}
	if abi >= 6 && r.SignalParent != "EPERM" {
		t.Errorf("signal parent: %s, want EPERM (landlock signal scope)", r.SignalParent)
	}
	for what, got := range map[string]string{
		"read /etc/hostname": r.ReadHostname, "write scratch": r.WriteScratch,
		"open /dev/null O_TRUNC": r.TruncDevNull, "socketpair": r.SocketPair,
	} {
		if got != "ok" {
			t.Errorf("%s: %s, want ok", what, got)
		}
	}
	if r.ThreadIDs < 2 {
		t.Errorf("denied opens ran on %d distinct threads, want several", r.ThreadIDs)
	}
	for i, got := range r.ThreadOpens {
		if got != "EACCES" {
			t.Errorf("open from thread %d: %s, want EACCES", i, got)
		}
	}
	if _, err := os.Stat(filepath.Join(deniedDir, "planted")); err == nil {
		t.Errorf("child planted a file in the denied directory")
	}

	// The grandchild (a shell, as an external server would be) is in a
	// sandbox nested in the child's: it keeps every restriction, and it
	// cannot reach its parent's /proc entries, signal it or list its
	// scratch directory.
	g := r.Grandchild
	if r.GrandErr != "" {
		t.Errorf("grandchild: %s\n%s", r.GrandErr, g)
	}
	wantGrand := []string{"Permission denied", "cat_rc=1", "NoNewPrivs:\t1", "CapEff:\t" + zero, "Seccomp:\t2", "GRANDCHILD_EXTRA=1",
		"CAPSEM_SANDBOX=" + wantSandbox, "parent_environ_rc=1", "list_parent_scratch_rc=2", "write_home_rc=0",
		"HOME=" + filepath.Join(scratch, "grandchild")}
	if abi >= 6 {
		wantGrand = append(wantGrand, "signal_parent_rc=1")
	}
	for _, s := range wantGrand {
		if !strings.Contains(g, s) {
			t.Errorf("grandchild output lacks %q:\n%s", s, g)
		}
	}
	if root && !strings.Contains(g, "CapBnd:\t"+zero) {
		t.Errorf("grandchild bounding set not empty:\n%s", g)
	}
	for _, s := range []string{"secret", "SECRET_TOKEN", "CAPSEM_MCP_LOG", "CAPSEM_PRIVSEP", "CAPSEM_PARENT_PID", "SERVER_OPT"} {
		if strings.Contains(g, s) {
			t.Errorf("grandchild output contains %q:\n%s", s, g)
		}
	}
	if strings.Contains(g, fmt.Sprintf("pgid=%d\n", r.Pgid)) {
		t.Errorf("grandchild shares the child's process group:\n%s", g)
	}
}

// TestParentDeathKillsChild kills the process that started a sandboxed
// child and expects the kernel to SIGKILL the child. The test process
// becomes a subreaper so the orphan is reparented to it and its wait
// status can be read.
func TestParentDeathKillsChild(t *testing.T) {
	requireLandlock(t)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("become subreaper: %v", err)
	}
	defer unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
	t.Run("enter on main thread", func(t *testing.T) { testParentDeath(t, modeSleeper) })
	t.Run("enter off main thread", func(t *testing.T) { testParentDeath(t, modeSleeperOffMain) })
}

func testParentDeath(t *testing.T, mode string) {
	params, err := json.Marshal(Spec{
		Executable: testExecutable(t),
		Args:       []string{mode},
		Scratch:    t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	mid := exec.Command(testExecutable(t), modeIntermediate, string(params))
	var stderr bytes.Buffer
	mid.Stderr = &stderr
	// A surviving child holds the stderr pipe; do not let Wait hang on it.
	mid.WaitDelay = 5 * time.Second
	out, err := mid.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := mid.Start(); err != nil {
		t.Fatal(err)
	}
	defer mid.Process.Kill()

	// The sleeper prints "ready PID" from its second stage, so the kill
	// below tests the signal as the restricted image carries it.
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var child int
	timeout := time.After(time.Minute)
	for child == 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("intermediate exited before the child was ready; stderr:\n%s", stderr.String())
			}
			if v, ok := strings.CutPrefix(l, "ready "); ok {
				child, _ = strconv.Atoi(v)
			}
		case <-timeout:
			t.Fatalf("child not ready; stderr:\n%s", stderr.String())
		}
	}
	if err := mid.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	mid.Wait()

	type waited struct {
		ws  unix.WaitStatus
		err error
	}
	done := make(chan waited, 1)
	go func() {
		var ws unix.WaitStatus
		_, err := unix.Wait4(child, &ws, 0, nil)
		done <- waited{ws, err}
	}()
	select {
	case w := <-done:
		if w.err != nil {
			t.Fatalf("wait for orphaned child %d: %v", child, w.err)
		}
		if !w.ws.Signaled() || w.ws.Signal() != unix.SIGKILL {
			t.Fatalf("child %d ended with %v, want SIGKILL", child, w.ws)
		}
	case <-time.After(30 * time.Second):
		unix.Kill(child, unix.SIGKILL)
		t.Fatalf("child %d still alive 30s after its parent died", child)
	}
}

// runIntermediate starts the sandboxed sleeper and waits to be killed.
func runIntermediate(arg string) int {
	var spec Spec
	if err := json.Unmarshal([]byte(arg), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "intermediate params:", err)
		return 2
	}
	cmd, err := Command(context.Background(), spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "intermediate:", err)
		return 2
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "intermediate:", err)
		return 2
	}
	cmd.Wait()
	return 0
}

// runFirstStage runs a Command child with one environment entry replaced,
// and returns its exit code and stderr.
func runFirstStage(t *testing.T, name, value string) (int, string, string) {
	t.Helper()
	deniedDir, deniedFile, deniedSock := deniedFixture(t)
	params, _ := json.Marshal(probeParams{DeniedDir: deniedDir, DeniedFile: deniedFile, DeniedSock: deniedSock, TestPID: os.Getpid()})
	cmd, err := Command(context.Background(), Spec{
		Executable: testExecutable(t),
		Args:       []string{modeProbe, string(params)},
		Scratch:    t.TempDir(),
	})
	if err != nil {
		t.Fatalf("Command: %v", err)
	}
	i := slices.IndexFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, name+"=") })
	if i < 0 {
		t.Fatalf("%s not in the command's environment", name)
	}
	cmd.Env[i] = name + "=" + value
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("first stage with %s=%q: %v, want an exit error", name, value, err)
	}
	return ee.ExitCode(), stdout.String(), stderr.String()
}

func TestFirstStageFailsClosed(t *testing.T) {
	requireLandlock(t)
	other := "1"
	if os.Getpid() == 1 {
		other = "2"
	}
	cases := []struct{ name, env, value, wantErr string }{
		{"parent already gone", envvars.ParentPID.Name(), other, "parent process is gone"},
		{"bad parent pid", envvars.ParentPID.Name(), "x", `CAPSEM_PARENT_PID="x": not a pid`},
		{"tampered policy", envvars.PrivsepPolicy.Name(), "e30", "version 0"},
		{"garbage policy", envvars.PrivsepPolicy.Name(), "%%%", "base64"},
		{"unknown stage", envvars.PrivsepStage.Name(), "later", "unknown sandbox stage"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runFirstStage(t, tc.env, tc.value)
			if code != enterFailed || !strings.Contains(stderr, tc.wantErr) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr, enterFailed, tc.wantErr)
			}
			if stdout != "" {
				t.Fatalf("probe ran despite the failed first stage: %s", stdout)
			}
		})
	}
}

func TestCommandRefuses(t *testing.T) {
	exe := testExecutable(t)
	session := t.TempDir()
	cases := []struct {
		name    string
		spec    Spec
		wantErr string
	}{
		{"relative executable", Spec{Executable: "capsem", Scratch: t.TempDir()}, "not absolute"},
		{"missing executable", Spec{Executable: "/nonexistent/capsem", Scratch: t.TempDir()}, "no such file"},
		{"directory executable", Spec{Executable: "/usr", Scratch: t.TempDir()}, "not a regular file"},
		{"no scratch", Spec{Executable: exe}, "scratch directory"},
		{"relative scratch", Spec{Executable: exe, Scratch: "scratch"}, "not absolute"},
		{"grant covers protected", Spec{Executable: exe, Scratch: t.TempDir(), ReadOnly: []string{session}, Protect: []string{filepath.Join(session, "session.db")}}, "overlaps protected"},
		{"reserved env", Spec{Executable: exe, Scratch: t.TempDir(), Env: map[string]string{envvars.ParentPID.Name(): "1"}}, "reserved"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Command(context.Background(), tc.spec); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Command error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestCommandCancelKillsGroup(t *testing.T) {
	requireLandlock(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd, err := Command(ctx, Spec{Executable: testExecutable(t), Args: []string{modeSleeper}, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("sleeper: %q, %v", line, err)
	}
	cancel()
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("wait: %v, want exit error", err)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != unix.SIGKILL {
		t.Fatalf("sleeper ended with %v, want SIGKILL", ws)
	}
}

func TestApplyLandlockUnavailable(t *testing.T) {
	missing := func() (int, error) { return 0, unix.ENOSYS }
	abi, err := applyLandlock(policy{Version: policyVersion, BestEffort: true}, missing)
	if err != nil || abi != 0 {
		t.Fatalf("best effort: abi %d, err %v; want 0, nil", abi, err)
	}
	_, err = applyLandlock(policy{Version: policyVersion}, missing)
	if !errors.Is(err, ErrLandlockUnavailable) || !errors.Is(err, unix.ENOSYS) {
		t.Fatalf("strict: err %v, want ErrLandlockUnavailable wrapping ENOSYS", err)
	}
	_, err = applyLandlock(policy{Version: policyVersion}, func() (int, error) { return 0, nil })
	if !errors.Is(err, ErrLandlockUnavailable) {
		t.Fatalf("ABI 0: err %v, want ErrLandlockUnavailable", err)
	}
}

func TestFSRightsForABI(t *testing.T) {
	v1 := uint64(1<<13 - 1)
	cases := map[int]uint64{
		0:  0,
		1:  v1,
		2:  v1 | llRefer,
		3:  v1 | llRefer | llTruncate,
		4:  v1 | llRefer | llTruncate,
		5:  v1 | llRefer | llTruncate | llIoctlDev,
		7:  v1 | llRefer | llTruncate | llIoctlDev,
		9:  v1 | llRefer | llTruncate | llIoctlDev | llResolveUnix,
		42: v1 | llRefer | llTruncate | llIoctlDev | llResolveUnix,
	}
	for abi, want := range cases {
		if got := fsRightsForABI(abi); got != want {
			t.Errorf("fsRightsForABI(%d) = %#x, want %#x", abi, got, want)
		}
	}
	// Grants never include device-node creation or device ioctls.
	for _, a := range []access{accessRead, accessReadExec, accessReadWrite, accessRWExec, accessDevice} {
		if r := rightsFor(a); r&(llMakeChar|llMakeBlock|llIoctlDev) != 0 {
			t.Errorf("rightsFor(%q) = %#x grants device rights", a, r)
		}
	}
	if rightsFor(accessReadWrite)&llExecute != 0 || rightsFor(accessDevice)&^llFileRights != 0 {
		t.Errorf("rw grants execute or device grants directory rights")
	}
}

func TestSeccompProgramJumps(t *testing.T) {
	for _, deny := range []bool{false, true} {
		prog := seccompProgram(deny)
		last := prog[len(prog)-1]
		if last.Code != unix.BPF_RET|unix.BPF_K || last.K != unix.SECCOMP_RET_ALLOW {
			t.Errorf("denyUnix=%v: program does not end in ALLOW", deny)
		}
		for i, ins := range prog {
			if ins.Code&0x07 == unix.BPF_JMP {
				if i+1+int(ins.Jt) >= len(prog) || i+1+int(ins.Jf) >= len(prog) {
					t.Errorf("denyUnix=%v: instruction %d jumps past the end", deny, i)
				}
			}
		}
	}
}

// TestKernelSupport: what every kernel this project runs on has (Linux
// 3.5+), reported as present.
func TestKernelSupport(t *testing.T) {
	s := KernelSupport()
	if !s.NoNewPrivs || !s.Pdeathsig || s.NoNewPrivsErr != nil || s.PdeathsigErr != nil {
		t.Fatalf("%+v", s)
	}
	if (s.LandlockErr == nil) != (s.LandlockABI >= 1) || s.ScopesSignals != (s.LandlockABI >= 6) {
		t.Fatalf("inconsistent Landlock report %+v", s)
	}
	if s.SeccompFilter != (s.SeccompErr == nil) {
		t.Fatalf("inconsistent seccomp report %+v", s)
	}
	t.Logf("%+v", s)
}
