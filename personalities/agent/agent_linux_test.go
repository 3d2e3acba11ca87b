package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestctl"
	"github.com/capsem/capsem/core/guestctl/memchan"
	"github.com/capsem/capsem/core/guestwire"
)

func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// harness is a guest agent Server and a host guestctl Client joined by an
// in-memory channel, in this process.
type harness struct {
	client fileClient
	srv    *Server
	host   guestctl.Channel
	served chan error // Serve's result
}

// channelPair makes the two ends of a guest channel.
type channelPair func(t *testing.T) (host, guest guestctl.Channel)

func memPair(*testing.T) (guestctl.Channel, guestctl.Channel) {
	h, g := memchan.Pair()
	return h, g
}

// sessionPair is the real transport: yamux sessions (core/guestchan) over a
// socketpair standing in for the virtio-serial port.
func sessionPair(t *testing.T) (guestctl.Channel, guestctl.Channel) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "carrier")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	host, err := guestchan.Server(conns[0], testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	guest, err := guestchan.Client(conns[1], testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { guest.Close() })
	return host, guest
}

func start(t *testing.T, tune func(*Server)) *harness { return startOn(t, memPair, tune) }

func startOn(t *testing.T, pair channelPair, tune func(*Server)) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	host, guest := pair(t)
	reaper := NewReaper(testLog(t), false)
	srv := &Server{Log: testLog(t), Dial: guest.Dial, Reaper: reaper,
		Hello: guestwire.Hello{AgentVersion: "test", Boot: guestwire.BootTimings{ChannelMS: 1}}}
	if tune != nil {
		tune(srv)
	}
	h := &harness{srv: srv, host: host, served: make(chan error, 1)}
	go func() {
		// The host may not listen yet, as in a real boot.
		var conn net.Conn
		var err error
		for range 500 {
			if conn, err = guest.Dial(ctx, guestchan.PortControl); err == nil {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err != nil {
			h.served <- err
			return
		}
		h.served <- srv.Serve(ctx, conn)
	}()
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	c, err := guestctl.Accept(actx, host, guestctl.Options{Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	h.client = fileClient{c}
	t.Cleanup(func() {
		c.Close()
		cancel()
		host.Close()
		select {
		case <-h.served:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return")
		}
		reaper.Close()
	})
	return h
}

type execOut struct {
	res            *guestwire.ExecResult
	stdout, stderr bytes.Buffer
}

func (h *harness) exec(t *testing.T, req *guestwire.Exec) *execOut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var o execOut
	res, err := h.client.Exec(ctx, req, &o.stdout, &o.stderr)
	if err != nil {
		t.Fatalf("exec %+v: %v", req, err)
	}
	o.res = res
	return &o
}

func TestHello(t *testing.T) {
	h := start(t, nil)
	hello := h.client.Hello()
	if hello.ProtocolVersion != guestwire.ProtocolVersion || hello.AgentVersion != "test" || hello.Boot.ChannelMS != 1 {
		t.Fatalf("hello %+v", hello)
	}
}

func TestExecEcho(t *testing.T) {
	h := start(t, nil)
	o := h.exec(t, &guestwire.Exec{Argv: []string{"echo", "hello", "world"}})
	if o.stdout.String() != "hello world\n" || o.stderr.Len() != 0 || o.res.ExitCode != 0 || o.res.Signal != 0 {
		t.Fatalf("stdout %q stderr %q result %+v", o.stdout.String(), o.stderr.String(), o.res)
	}
	if o.res.StdoutBytes != 12 || o.res.StdoutSent != 12 || o.res.StdoutTruncated {
		t.Fatalf("counts %+v", o.res)
	}
}

func TestExecStderrOnlyAndKeptApart(t *testing.T) {
	h := start(t, nil)
	o := h.exec(t, &guestwire.Exec{Shell: "echo oops >&2"})
	if o.stdout.Len() != 0 || o.stderr.String() != "oops\n" || o.res.StderrBytes != 5 || o.res.StdoutBytes != 0 {
		t.Fatalf("stdout %q stderr %q result %+v", o.stdout.String(), o.stderr.String(), o.res)
	}
	o = h.exec(t, &guestwire.Exec{Shell: "for i in 1 2 3; do echo o$i; echo e$i >&2; done"})
	if o.stdout.String() != "o1\no2\no3\n" || o.stderr.String() != "e1\ne2\ne3\n" {
		t.Fatalf("stdout %q stderr %q", o.stdout.String(), o.stderr.String())
	}
}

func TestExecNonZeroExit(t *testing.T) {
	h := start(t, nil)
	o := h.exec(t, &guestwire.Exec{Shell: "echo partial; exit 3"})
	if o.res.ExitCode != 3 || o.res.Signal != 0 || o.res.TimedOut || o.stdout.String() != "partial\n" {
		t.Fatalf("result %+v stdout %q", o.res, o.stdout.String())
	}
	o = h.exec(t, &guestwire.Exec{Shell: "kill -TERM $$"})
	if o.res.Signal != int(unix.SIGTERM) || o.res.ExitCode != 128+int(unix.SIGTERM) {
		t.Fatalf("signal result %+v", o.res)
	}
}

func TestExecTruncatesAtCap(t *testing.T) {
	h := start(t, nil)
	const produced = 20 << 20
	o := h.exec(t, &guestwire.Exec{Shell: fmt.Sprintf("head -c %d /dev/zero; echo small >&2", produced)})
	r := o.res
	if !r.StdoutTruncated || r.StdoutBytes != produced || r.StdoutSent != guestwire.MinOutputCap || o.stdout.Len() != guestwire.MinOutputCap {
		t.Fatalf("stdout: got %d bytes, result %+v", o.stdout.Len(), r)
	}
	if r.StderrTruncated || o.stderr.String() != "small\n" || r.ExitCode != 0 {
		t.Fatalf("stderr %q result %+v", o.stderr.String(), r)
	}
	// A cap below the minimum is raised to it; a larger one is honoured.
	o = h.exec(t, &guestwire.Exec{Shell: fmt.Sprintf("head -c %d /dev/zero >&2", produced), StderrCap: 12 << 20, StdoutCap: 1})
	if o.stderr.Len() != 12<<20 || !o.res.StderrTruncated || o.res.StderrBytes != produced {
		t.Fatalf("stderr cap: got %d, result %+v", o.stderr.Len(), o.res)
	}
}

func TestConcurrentExecs(t *testing.T) {
	h := start(t, nil)
	dir := t.TempDir()
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each exec waits until all eight have started: they can only
			// finish if they run at the same time.
			script := `touch "$DIR/$N"; i=0; while [ "$(ls "$DIR" | wc -l)" -lt 8 ]; do i=$((i+1)); [ $i -gt 2000 ] && exit 99; sleep 0.01; done; echo "out$N"; echo "err$N" >&2`
			var out, errb bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := h.client.Exec(ctx, &guestwire.Exec{Shell: script, Env: map[string]string{"DIR": dir, "N": strconv.Itoa(i)}}, &out, &errb)
			switch {
			case err != nil:
				errs <- err
			case res.ExitCode != 0:
				errs <- fmt.Errorf("exec %d: exit %d (the execs did not run at once)", i, res.ExitCode)
			case out.String() != fmt.Sprintf("out%d\n", i) || errb.String() != fmt.Sprintf("err%d\n", i):
				errs <- fmt.Errorf("exec %d: stdout %q stderr %q", i, out.String(), errb.String())
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// gone reports whether pid has exited (no process, or a zombie waiting for
// whoever reaps it).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d is still running", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	h := start(t, nil)
	begin := time.Now()
	o := h.exec(t, &guestwire.Exec{Shell: "sleep 1000 & echo $!; echo $$; sleep 1000", TimeoutMS: 300})
	if !o.res.TimedOut || o.res.Signal != int(unix.SIGKILL) || o.res.ExitCode != 137 {
		t.Fatalf("result %+v", o.res)
	}
	if d := time.Since(begin); d > 20*time.Second {
		t.Fatalf("the timeout took %v", d)
	}
	fields := strings.Fields(o.stdout.String())
	if len(fields) != 2 {
		t.Fatalf("stdout %q", o.stdout.String())
	}
	for _, f := range fields {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		waitGone(t, pid) // the background child too: the whole group died
	}
}

func TestExecCancelKillsTheCommand(t *testing.T) {
	h := start(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := h.client.Exec(ctx, &guestwire.Exec{Shell: "echo $$ > " + pidFile + "; exec sleep 1000"}, nil, nil)
		done <- err
	}()
	pid := waitPidFile(t, pidFile)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Exec did not return at once on cancel")
	}
	waitGone(t, pid)
}

func TestExecChannelDeathFailsAtOnce(t *testing.T) {
	h := start(t, nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	done := make(chan error, 1)
	go func() {
		_, err := h.client.Exec(context.Background(), &guestwire.Exec{Shell: "echo $$ > " + pidFile + "; exec sleep 1000"}, nil, nil)
		done <- err
	}()
	pid := waitPidFile(t, pidFile)
	h.host.Close()
	select {
	case err := <-done:
		if !errors.Is(err, guestctl.ErrClosed) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Exec did not fail within a second of the channel's death")
	}
	if _, err := h.client.Ping(context.Background()); !errors.Is(err, guestctl.ErrClosed) {
		t.Fatalf("ping after death: %v", err)
	}
	// The guest side kills what it was running for a host that is gone.
	waitGone(t, pid)
}

func waitPidFile(t *testing.T, path string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCancelBeforeStart(t *testing.T) {
	h := start(t, nil)
	e := &guestwire.Exec{Argv: []string{"true"}, StreamID: 77}
	id, run, err := h.srv.registerExec(1, e)
	if err != nil || id != 77 {
		t.Fatal(id, err)
	}
	if _, _, err := h.srv.registerExec(2, e); !isCode(err, guestwire.CodeBusy) {
		t.Fatalf("duplicate exec id: %v", err)
	}
	h.srv.cancel(77)
	if _, err := h.srv.exec(context.Background(), id, run, e); err == nil || !strings.Contains(err.Error(), "cancelled before it started") {
		t.Fatalf("got %v", err)
	}
	if _, _, err := h.srv.registerExec(3, e); err != nil {
		t.Fatalf("the id was not released: %v", err)
	}
}

func TestExecDetachesFromBackgroundOutput(t *testing.T) {
	h := start(t, func(s *Server) { s.OutputGrace = 200 * time.Millisecond })
	o := h.exec(t, &guestwire.Exec{Shell: "sleep 30 & echo $!"})
	if !o.res.Detached || o.res.ExitCode != 0 {
		t.Fatalf("result %+v", o.res)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(o.stdout.String()))
	if err != nil {
		t.Fatalf("stdout %q", o.stdout.String())
	}
	if gone(pid) {
		t.Fatal("the background process was killed by detaching")
	}
	unix.Kill(pid, unix.SIGKILL)
	waitGone(t, pid)
}

func TestExecErrors(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	_, err := h.client.Exec(ctx, &guestwire.Exec{Argv: []string{"no-such-command-capsem"}}, nil, nil)
	var we *guestwire.Error
	if !errors.As(err, &we) || we.Code != guestwire.CodeNotFound || !strings.Contains(err.Error(), "no-such-command-capsem") {
		t.Fatalf("missing command: %v", err)
	}
	_, err = h.client.Exec(ctx, &guestwire.Exec{Argv: []string{"true"}, Cwd: "/no/such/dir"}, nil, nil)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "/no/such/dir") {
		t.Fatalf("missing cwd: %v", err)
	}
	// The guest refuses a duplicate stream id even from a host that sends one.
	resp := h.srv.handle(ctx, &guestwire.Message{Type: guestwire.TypeExec, ID: 1, Exec: &guestwire.Exec{}})
	if resp.Type != guestwire.TypeError || resp.Error.Code != guestwire.CodeInvalid {
		t.Fatalf("empty exec: %+v", resp)
	}
	o := h.exec(t, &guestwire.Exec{Argv: []string{"pwd"}, Cwd: "/tmp"})
	if o.stdout.String() != "/tmp\n" {
		t.Fatalf("cwd: %q", o.stdout.String())
	}
}

func TestEnvInjection(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	if err := h.client.SendBootConfig(ctx, &guestwire.BootConfig{Env: map[string]string{"FOO": "bar", "PATH": "/usr/bin:/bin", "SPACE": "a b"}}); err != nil {
		t.Fatal(err)
	}
	o := h.exec(t, &guestwire.Exec{Shell: `echo "$FOO|$PATH|$SPACE|$HOME"`})
	if o.stdout.String() != "bar|/usr/bin:/bin|a b|/root\n" {
		t.Fatalf("boot env: %q", o.stdout.String())
	}
	o = h.exec(t, &guestwire.Exec{Shell: `echo "$FOO"`, Env: map[string]string{"FOO": "exec wins"}})
	if o.stdout.String() != "exec wins\n" {
		t.Fatalf("exec env: %q", o.stdout.String())
	}
	refused := []string{"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "IFS", "PS4", "PROMPT_COMMAND",
		"SHELLOPTS", "BASHOPTS", "GLOBIGNORE", "BASH_FUNC_ls%%", "A=B", "A\x00B", ""}
	for _, key := range refused {
		env := map[string]string{key: "x", "LATER": "must not be applied"}
		// The host refuses before sending…
		err := h.client.SendBootConfig(ctx, &guestwire.BootConfig{Env: env})
		checkRefused(t, "host boot config", key, err)
		_, err = h.client.Exec(ctx, &guestwire.Exec{Argv: []string{"true"}, Env: env}, nil, nil)
		checkRefused(t, "host exec", key, err)
		// …and the guest refuses on its own, for a host that does not.
		resp := h.srv.handle(ctx, &guestwire.Message{Type: guestwire.TypeBootConfig, ID: 7, BootConfig: &guestwire.BootConfig{Env: env}})
		checkRefused(t, "guest boot config", key, respErr(resp))
		resp = h.srv.handle(ctx, &guestwire.Message{Type: guestwire.TypeExec, ID: 8, Exec: &guestwire.Exec{Argv: []string{"true"}, Env: env}})
		checkRefused(t, "guest exec", key, respErr(resp))
	}
	o = h.exec(t, &guestwire.Exec{Shell: `echo "${LATER:-unset}"`})
	if o.stdout.String() != "unset\n" {
		t.Fatalf("a refused boot config was partly applied: %q", o.stdout.String())
	}
}

func respErr(m *guestwire.Message) error {
	if m.Type == guestwire.TypeError {
		return m.Error
	}
	return nil
}

func checkRefused(t *testing.T, where, key string, err error) {
	t.Helper()
	var we *guestwire.Error
	if !errors.As(err, &we) || we.Code != guestwire.CodeInvalid {
		t.Errorf("%s: key %q: want an invalid-input error, got %v", where, key, err)
		return
	}
	if name := strings.TrimRight(strings.SplitN(key, "\x00", 2)[0], "%"); name != "" && !strings.Contains(err.Error(), name) {
		t.Errorf("%s: the error does not name key %q: %v", where, key, err)
	}
}

// realTempDir is a temp dir whose own path has no symbolic link, so the
// symlink tests test only the links they make.
func realTempDir(t *testing.T) string {
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestFileRoundTripBinary(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	data := make([]byte, 5<<20)
	rand.Read(data)
	path := filepath.Join(realTempDir(t), "new", "sub", "random.bin")
	if err := h.client.WriteFile(ctx, path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := h.client.ReadFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, data) {
		t.Fatal("5 MiB round trip changed the bytes")
	}
	info, err := h.client.Stat(ctx, path)
	if err != nil || info.Size != 5<<20 || fs.FileMode(info.Mode).Perm() != 0o600 || info.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Fatalf("stat %+v %v", info, err)
	}
	// Overwrite with less: the file is replaced, not partly rewritten.
	if err := h.client.WriteFile(ctx, path, []byte("short\x00"), 0); err != nil {
		t.Fatal(err)
	}
	if back, _ := os.ReadFile(path); string(back) != "short\x00" {
		t.Fatalf("overwrite: %q", back)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode 0 must keep the mode, got %v", st.Mode())
	}
	empty := filepath.Join(filepath.Dir(path), "empty")
	if err := h.client.WriteFile(ctx, empty, nil, 0); err != nil {
		t.Fatal(err)
	}
	if b, err := h.client.ReadFile(ctx, empty); err != nil || len(b) != 0 || b == nil {
		t.Fatalf("empty file: %q %v", b, err)
	}
	if st, _ := os.Stat(empty); st.Mode().Perm() != 0o644 {
		t.Fatalf("a new file's default mode is 0644, got %v", st.Mode())
	}
	if _, err := h.client.ReadFile(ctx, filepath.Join(filepath.Dir(path), "missing")); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestMkdir(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	dir := realTempDir(t)
	if err := h.client.Mkdir(ctx, dir+"/a/b/c", 0o700, true); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir + "/a/b/c"); err != nil || !st.IsDir() || st.Mode().Perm() != 0o700 {
		t.Fatalf("%v %v", st, err)
	}
	if err := h.client.Mkdir(ctx, dir+"/a/b/c", 0, true); err != nil {
		t.Fatalf("mkdir -p of an existing dir: %v", err)
	}
	if err := h.client.Mkdir(ctx, dir+"/a/b/c", 0, false); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("mkdir of an existing dir: %v", err)
	}
	if err := h.client.Mkdir(ctx, dir+"/x/y", 0, false); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("mkdir without parents: %v", err)
	}
	os.WriteFile(dir+"/file", nil, 0o644)
	if err := h.client.Mkdir(ctx, dir+"/file/sub", 0, true); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("mkdir under a file: %v", err)
	}
	if err := h.client.WriteFile(ctx, dir+"/a", []byte("x"), 0); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("write over a directory: %v", err)
	}
	if _, err := h.client.ReadFile(ctx, dir+"/a"); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("read of a directory: %v", err)
	}
}

func TestWriteThroughSymlinkRefused(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	dir := realTempDir(t)
	os.Mkdir(dir+"/real", 0o755)
	os.Symlink(dir+"/real", dir+"/link")
	os.WriteFile(dir+"/target", []byte("original"), 0o644)
	os.Symlink(dir+"/target", dir+"/filelink")
	os.Symlink(dir+"/nowhere", dir+"/dangling")

	for _, tc := range []struct{ path, mention string }{
		{dir + "/link/f", `"link"`},
		{dir + "/link/new/deeper/f", `"link"`},
		{dir + "/filelink", "symbolic link"},
		{dir + "/dangling", "symbolic link"},
	} {
		err := h.client.WriteFile(ctx, tc.path, []byte("evil"), 0)
		var we *guestwire.Error
		if !errors.As(err, &we) || we.Code != guestwire.CodeSymlink || !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("write %s: want a symlink refusal naming %s, got %v", tc.path, tc.mention, err)
		}
	}
	if _, err := os.Stat(dir + "/real/f"); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a write through a symlinked directory created the file")
	}
	if _, err := os.Stat(dir + "/real/new"); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a write through a symlinked directory created parents")
	}
	if b, _ := os.ReadFile(dir + "/target"); string(b) != "original" {
		t.Error("a write to a symlink changed its target")
	}
	if _, err := os.Stat(dir + "/nowhere"); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a write to a dangling symlink created its target")
	}
	if err := h.client.Mkdir(ctx, dir+"/link/sub", 0, true); !isCode(err, guestwire.CodeSymlink) {
		t.Errorf("mkdir through a symlink: %v", err)
	}
	if err := h.client.Mkdir(ctx, dir+"/link", 0, true); !isCode(err, guestwire.CodeSymlink) {
		t.Errorf("mkdir -p of a symlink: %v", err)
	}
	// The same write through the real path works.
	if err := h.client.WriteFile(ctx, dir+"/real/f", []byte("ok"), 0); err != nil {
		t.Fatal(err)
	}
	if err := h.client.WriteFile(ctx, dir+"/../x", nil, 0); !isCode(err, guestwire.CodeInvalid) {
		t.Errorf("a .. path: %v", err)
	}
}

func isCode(err error, code string) bool {
	var we *guestwire.Error
	return errors.As(err, &we) && we.Code == code
}

func TestReadSymlinkRefused(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	dir := realTempDir(t)
	os.WriteFile(dir+"/target", []byte("secret-ish"), 0o644)
	os.Symlink(dir+"/target", dir+"/link")
	_, err := h.client.ReadFile(ctx, dir+"/link")
	if !isCode(err, guestwire.CodeSymlink) || !strings.Contains(err.Error(), dir+"/link") {
		t.Fatalf("read of a symlink: %v", err)
	}
	res, err := h.client.read(ctx, &guestwire.FileRequest{Path: dir + "/link", FollowSymlink: true})
	if err != nil || string(res) != "secret-ish" {
		t.Fatalf("read following the link: %v", err)
	}
	info, err := h.client.Stat(ctx, dir+"/link")
	if err != nil || info.Mode&unix.S_IFMT != unix.S_IFLNK || info.LinkTarget != dir+"/target" {
		t.Fatalf("stat of a link: %+v %v", info, err)
	}
	// Links in directories are followed for reads (Debian's /bin is one).
	os.Mkdir(dir+"/d", 0o755)
	os.WriteFile(dir+"/d/f", []byte("via dir"), 0o644)
	os.Symlink(dir+"/d", dir+"/dlink")
	if b, err := h.client.ReadFile(ctx, dir+"/dlink/f"); err != nil || string(b) != "via dir" {
		t.Fatalf("read through a directory link: %q %v", b, err)
	}
	// A FIFO is refused without blocking.
	unix.Mkfifo(dir+"/fifo", 0o644)
	if _, err := h.client.ReadFile(ctx, dir+"/fifo"); !isCode(err, guestwire.CodeNotRegular) {
		t.Fatalf("read of a FIFO: %v", err)
	}
	if err := h.client.WriteFile(ctx, dir+"/fifo", []byte("x"), 0); !isCode(err, guestwire.CodeNotRegular) {
		t.Fatalf("write of a FIFO: %v", err)
	}
}

func TestOversizedRefused(t *testing.T) {
	const limit = 1 << 20
	h := start(t, func(s *Server) { s.MaxFileSize = limit })
	ctx := context.Background()
	dir := realTempDir(t)
	err := h.client.WriteFile(ctx, dir+"/big", make([]byte, limit+1), 0)
	if !isCode(err, guestwire.CodeTooLarge) || !strings.Contains(err.Error(), strconv.Itoa(limit)) {
		t.Fatalf("oversized write: %v", err)
	}
	if _, err := os.Stat(dir + "/big"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("an oversized write created the file")
	}
	os.WriteFile(dir+"/big", make([]byte, limit+1), 0o644)
	_, err = h.client.ReadFile(ctx, dir+"/big")
	if !isCode(err, guestwire.CodeTooLarge) || !strings.Contains(err.Error(), strconv.Itoa(limit)) {
		t.Fatalf("oversized read: %v", err)
	}
	_, err = h.client.read(ctx, &guestwire.FileRequest{Path: dir + "/big", MaxSize: 10})
	if !isCode(err, guestwire.CodeTooLarge) {
		t.Fatalf("read past the requested max: %v", err)
	}
	os.WriteFile(dir+"/exact", make([]byte, limit), 0o644)
	if b, err := h.client.ReadFile(ctx, dir+"/exact"); err != nil || len(b) != limit {
		t.Fatalf("a read of exactly the limit: %d %v", len(b), err)
	}
	// The host refuses past the protocol's bound before sending anything.
	_, err = h.client.WriteFileFrom(ctx, &guestwire.FileRequest{Path: dir + "/huge", MaxSize: guestwire.MaxFileSize + 1}, strings.NewReader("x"))
	if !isCode(err, guestwire.CodeTooLarge) || !strings.Contains(err.Error(), strconv.Itoa(guestwire.MaxFileSize)) {
		t.Fatalf("write past MaxFileSize: %v", err)
	}
	// A sized-0 /proc file is read to EOF, within the bound.
	if b, err := h.client.ReadFile(ctx, "/proc/self/status"); err != nil || !bytes.Contains(b, []byte("Name:")) {
		t.Fatalf("/proc read: %v", err)
	}
}

func TestPingAndShutdown(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	for range 3 {
		if _, err := h.client.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.client.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-h.served:
		if !errors.Is(err, ErrShutdown) {
			t.Fatalf("Serve returned %v", err)
		}
		h.served <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after shutdown")
	}
}

// TestSuspendParks: a suspend with a bad marker is refused and the
// session goes on; one with a good marker is answered after the channel
// was readied with that marker, and Serve returns ErrPark. An agent that
// cannot park refuses.
func TestSuspendParks(t *testing.T) {
	ctx := context.Background()
	cannot := start(t, nil)
	if err := cannot.client.Suspend(ctx, make([]byte, guestwire.MinWakeMarker)); err == nil || !strings.Contains(err.Error(), "cannot park") {
		t.Errorf("suspend of an agent that cannot park: %v", err)
	}
	var readied []byte
	h := start(t, func(s *Server) { s.BeforePark = func(m []byte) { readied = m } })
	if err := h.client.Suspend(ctx, []byte("short")); err == nil {
		t.Error("a marker of 5 bytes was taken")
	}
	if _, err := h.client.Ping(ctx); err != nil {
		t.Fatalf("the session after a refused suspend: %v", err)
	}
	marker := []byte("0123456789abcdef-marker")
	if err := h.client.Suspend(ctx, marker); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-h.served:
		if !errors.Is(err, ErrPark) {
			t.Fatalf("Serve returned %v", err)
		}
		h.served <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the suspend")
	}
	if !bytes.Equal(readied, marker) {
		t.Errorf("the channel was readied with %q, want %q", readied, marker)
	}
}

func TestBootConfigFilesAndHooks(t *testing.T) {
	var gotClock time.Time
	var gotHost string
	h := start(t, func(s *Server) {
		s.SetClock = func(t time.Time) error { gotClock = t; return nil }
		s.SetHostname = func(n string) error { gotHost = n; return nil }
	})
	dir := realTempDir(t)
	os.Symlink(dir, dir+"/link")
	err := h.client.SendBootConfig(context.Background(), &guestwire.BootConfig{
		Files:         []guestwire.BootFile{{Path: dir + "/etc/a.conf", Mode: 0o600, Data: []byte("a=1\n")}},
		ClockUnixNano: 1796000000123456789, Hostname: "vm-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dir + "/etc/a.conf"); string(b) != "a=1\n" {
		t.Fatalf("boot file %q", b)
	}
	if gotClock.UnixNano() != 1796000000123456789 || gotHost != "vm-1" {
		t.Fatalf("clock %v host %q", gotClock, gotHost)
	}
	err = h.client.SendBootConfig(context.Background(), &guestwire.BootConfig{Files: []guestwire.BootFile{{Path: dir + "/link/b", Data: []byte("x")}}})
	if !isCode(err, guestwire.CodeSymlink) || !strings.Contains(err.Error(), "boot config file") {
		t.Fatalf("boot file through a link: %v", err)
	}
}

func TestUnknownAndUndecodableRequests(t *testing.T) {
	h := start(t, nil)
	resp := h.srv.handle(context.Background(), &guestwire.Message{Type: "frobnicate", ID: 4})
	if resp.Type != guestwire.TypeError || resp.ID != 4 || resp.Error.Code != guestwire.CodeUnknown || !strings.Contains(resp.Error.Message, "frobnicate") {
		t.Fatalf("%+v", resp)
	}
	resp = h.srv.handle(context.Background(), &guestwire.Message{Type: guestwire.TypeFileRead, ID: 5})
	if resp.Type != guestwire.TypeError || resp.Error.Code != guestwire.CodeInvalid {
		t.Fatalf("%+v", resp)
	}
}

func TestMCPBridge(t *testing.T) {
	host, guest := memchan.Pair()
	defer host.Close()
	ln, err := host.Listen(guestchan.PortMCP)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// Echo until the guest half-closes, then one last line.
				b := make([]byte, 4096)
				for {
					n, err := c.Read(b)
					c.Write(b[:n])
					if err != nil {
						c.Write([]byte("bye"))
						return
					}
				}
			}()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	sock := filepath.Join(t.TempDir(), "run", "capsem", "mcp.sock")
	served := make(chan error, 1)
	go func() { served <- ServeMCPBridge(ctx, testLog(t), sock, guest.Dial) }()
	var c net.Conn
	for range 500 {
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode %v %v", st, err)
	}
	c.Write([]byte("ping"))
	c.(*net.UnixConn).CloseWrite()
	got := make([]byte, 0, 16)
	buf := make([]byte, 16)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			break
		}
	}
	if string(got) != "pingbye" {
		t.Fatalf("bridged %q", got)
	}
	c.Close()
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

func TestRunRefusesWhenNotPID1(t *testing.T) {
	t.Setenv(envvars.AgentAllowNotPID1.Name(), "")
	err := (&Cmd{}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "PID 1") || !strings.Contains(err.Error(), envvars.AgentAllowNotPID1.Name()) {
		t.Fatalf("got %v", err)
	}
}

func TestLoadModulesList(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "load-order")
	os.WriteFile(list, []byte("# comment\n\nkernel/missing.ko\n/nonexistent/virtio.ko.xz debug=1\n"), 0o644)
	r := startModules(testLog(t), list).finish()
	loaded, failed := r.loaded, r.failed
	if loaded != 0 || len(failed) != 2 {
		t.Fatalf("loaded %d failed %v", loaded, failed)
	}
	if !strings.Contains(failed[0].Error(), filepath.Join(dir, "kernel/missing.ko")) || !strings.Contains(failed[1].Error(), "/nonexistent/virtio.ko.xz") {
		t.Fatalf("errors do not name the module: %v", failed)
	}
	if r := startModules(testLog(t), filepath.Join(dir, "absent")).finish(); r.loaded != 0 || r.failed != nil {
		t.Fatalf("a missing list is not an error: %d %v", r.loaded, r.failed)
	}
}

// Drivers load only for devices that are there (or that the command line
// configures). The loader here records the order and, like the kernel,
// makes devices appear when their bus driver loads.
func TestLoadModulesForPresentDevices(t *testing.T) {
	dir := t.TempDir()
	addDevice := func(bus, dev, alias string) {
		os.MkdirAll(filepath.Join(dir, "bus", bus, "devices", dev), 0o755)
		os.WriteFile(filepath.Join(dir, "bus", bus, "devices", dev, "modalias"), []byte(alias+"\n"), 0o444)
	}
	addDevice("pci", "0000:00:02.0", "pci:v00001AF4d00001043sv00001AF4sd00001100bc07sc80i00")
	cmdline := filepath.Join(dir, "cmdline")
	os.WriteFile(cmdline, []byte("console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 quiet\n"), 0o444)
	list := filepath.Join(dir, "load-order")
	os.WriteFile(list, []byte(strings.Join([]string{
		"/m/always.ko",
		// Listed before the transport that makes its device appear: it
		// must wait for it, not be dropped.
		"/m/virtio_console.ko | virtio:d00000003v*",
		"/m/vsock.ko | virtio:d00000013v*",
		"/m/virtio_pci.ko | pci:v00001AF4d*sv*sd*bc*sc*i*",
		"/m/vmw_vsock_virtio_transport.ko | virtio:d00000013v*",
		"/m/virtio_mmio.ko | acpi*:LNRO0005:*",
		"/m/virtio-rng.ko | virtio:d00000004v*",
		"/m/ext4.ko",
	}, "\n")), 0o644)
	var order []string
	load := func(path, params string) error {
		name := filepath.Base(path)
		order = append(order, name)
		switch name {
		case "virtio_pci.ko":
			addDevice("virtio", "virtio0", "virtio:d00000003v00001AF4")
			addDevice("virtio", "virtio1", "virtio:d00000013v00001AF4")
		case "ext4.ko":
			return errors.New("module " + path + ": finit_module: EINVAL")
		}
		return nil
	}
	r := startModulesWith(testLog(t), list, filepath.Join(dir, "bus"), cmdline, load).finish()
	loaded, failed, skipped := r.loaded, r.failed, r.skipped
	want := []string{"always.ko", "virtio_pci.ko", "virtio_console.ko", "vsock.ko", "vmw_vsock_virtio_transport.ko", "virtio_mmio.ko", "ext4.ko"}
	if !slices.Equal(order, want) {
		t.Fatalf("load order %v, want %v", order, want)
	}
	if loaded != 6 || len(failed) != 1 || !strings.Contains(failed[0].Error(), "/m/ext4.ko") {
		t.Fatalf("loaded %d, failed %v", loaded, failed)
	}
	if !slices.Equal(skipped, []string{"virtio_rng"}) {
		t.Fatalf("skipped %v", skipped)
	}
	// A malformed list is one clear error, and nothing loads.
	os.WriteFile(list, []byte("/m/a.ko |\n"), 0o644)
	if r := startModules(testLog(t), list).finish(); r.loaded != 0 || len(r.failed) != 1 || !strings.Contains(r.failed[0].Error(), "line 1") {
		t.Fatalf("malformed list: %d %v", r.loaded, r.failed)
	}
}

// Chains load side by side, each in its own order; capsem.module_workers
// sets how many at once (the default is one per CPU).
func TestLoadModuleChainsInParallel(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "load-order")
	cmdline := filepath.Join(dir, "cmdline")
	os.WriteFile(list, []byte("/m/crc16.ko\n/m/jbd2.ko\n/m/ext4.ko\n---\n/m/virtio_ring.ko\n/m/virtio.ko\n/m/virtio_console.ko\n---\n/m/overlay.ko\n"), 0o644)
	var mu sync.Mutex
	running, most := 0, 0
	var order []string
	load := func(path, params string) error {
		mu.Lock()
		running++
		most = max(most, running)
		order = append(order, filepath.Base(path))
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	}
	for _, workers := range []int{2, 1} {
		os.WriteFile(cmdline, []byte("quiet "+ModuleWorkersParam+"="+strconv.Itoa(workers)+"\n"), 0o644)
		most, order = 0, nil
		r := startModulesWith(testLog(t), list, filepath.Join(dir, "bus"), cmdline, load).finish()
		if r.loaded != 7 || len(r.failed) != 0 || r.chains != 3 || r.workers != workers {
			t.Fatalf("%s=%d: report %+v", ModuleWorkersParam, workers, r)
		}
		if most != workers {
			t.Fatalf("%s=%d: at most %d loads at once", ModuleWorkersParam, workers, most)
		}
		pos := map[string]int{}
		for i, m := range order {
			pos[m] = i
		}
		for _, pair := range [][2]string{{"crc16.ko", "jbd2.ko"}, {"jbd2.ko", "ext4.ko"}, {"virtio_ring.ko", "virtio.ko"}, {"virtio.ko", "virtio_console.ko"}} {
			if pos[pair[0]] > pos[pair[1]] {
				t.Fatalf("%s=%d: %s loaded after %s: %v", ModuleWorkersParam, workers, pair[0], pair[1], order)
			}
		}
	}
	// Without the parameter: one chain per CPU.
	os.Remove(cmdline)
	if r := startModulesWith(testLog(t), list, filepath.Join(dir, "bus"), cmdline, load).finish(); r.workers != min(3, runtime.NumCPU()) {
		t.Fatalf("default workers %d, want one per CPU (%d)", r.workers, runtime.NumCPU())
	}
}

// A boot step waits only for its own modules: the channel's driver is
// reported in while another chain is still loading.
func TestModuleLoaderWaitsForNamedModules(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "load-order")
	os.WriteFile(filepath.Join(dir, "cmdline"), []byte(ModuleWorkersParam+"=2\n"), 0o644)
	os.WriteFile(list, []byte("/m/crc16.ko\n/m/ext4.ko\n---\n/m/virtio.ko\n/m/virtio_console.ko\n/m/virtio_rng.ko | virtio:d00000004v*\n"), 0o644)
	release := make(chan struct{})
	load := func(path, params string) error {
		if filepath.Base(path) == "ext4.ko" {
			<-release // the heavy chain is still busy
		}
		return nil
	}
	l := startModulesWith(testLog(t), list, filepath.Join(dir, "bus"), filepath.Join(dir, "cmdline"), load)
	waited := make(chan struct{})
	go func() {
		l.wait("virtio_console", "virtio_rng", "built_in_or_unknown")
		close(waited)
	}()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("waiting for virtio_console (and a module with no device) blocked on another chain")
	}
	done := make(chan moduleReport)
	go func() { done <- l.finish() }()
	select {
	case <-done:
		t.Fatal("finish returned while ext4 was still loading")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	r := <-done
	if r.loaded != 4 || !slices.Equal(r.skipped, []string{"virtio_rng"}) || r.elapsed <= 0 {
		t.Fatalf("report %+v", r)
	}
	l.wait("ext4") // settled: returns at once
}

// The power-off grace ends as soon as no process but init and the caller
// runs a program; kernel threads and zombies (empty cmdline) do not count.
func TestWaitForNoProcesses(t *testing.T) {
	root := t.TempDir()
	proc := func(pid, cmdline string) {
		os.MkdirAll(filepath.Join(root, pid), 0o755)
		os.WriteFile(filepath.Join(root, pid, "cmdline"), []byte(cmdline), 0o444)
	}
	proc("1", "/init\x00")
	proc("2", "")                 // kthreadd
	proc("77", "")                // a zombie
	proc("100", "/init\x00agent") // the caller
	os.MkdirAll(filepath.Join(root, "self"), 0o755)
	start := time.Now()
	if !waitForNoProcesses(root, 100, time.Second) || time.Since(start) > 500*time.Millisecond {
		t.Fatalf("waited %v with nothing left to wait for", time.Since(start))
	}
	proc("200", "sleep\x00100\x00")
	start = time.Now()
	if waitForNoProcesses(root, 100, 100*time.Millisecond) || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("a running program did not hold the grace (%v)", time.Since(start))
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(filepath.Join(root, "200", "cmdline"), nil, 0o444) // it exited
	}()
	if !waitForNoProcesses(root, 100, 5*time.Second) {
		t.Fatal("the grace did not end when the last program exited")
	}
	if waitForNoProcesses(filepath.Join(root, "missing"), 100, 20*time.Millisecond) {
		t.Fatal("an unreadable /proc ended the grace early")
	}
}

func TestMountHelpers(t *testing.T) {
	if !isMountPoint("/proc") {
		t.Fatal("/proc is a mount point")
	}
	if isMountPoint(t.TempDir()) {
		t.Fatal("a temp dir is not a mount point")
	}
	if up, err := kernelUptime(); err != nil || up <= 0 {
		t.Fatalf("uptime %v %v", up, err)
	}
}

// TestOverGuestchanSession runs the main paths over the real multiplexer
// instead of the in-memory channel.
func TestOverGuestchanSession(t *testing.T) {
	h := startOn(t, sessionPair, nil)
	ctx := context.Background()
	o := h.exec(t, &guestwire.Exec{Shell: "echo out; echo err >&2; exit 4"})
	if o.stdout.String() != "out\n" || o.stderr.String() != "err\n" || o.res.ExitCode != 4 {
		t.Fatalf("%q %q %+v", o.stdout.String(), o.stderr.String(), o.res)
	}
	o = h.exec(t, &guestwire.Exec{Shell: "head -c 20971520 /dev/urandom"})
	if o.stdout.Len() != guestwire.MinOutputCap || !o.res.StdoutTruncated || o.res.StdoutBytes != 20<<20 {
		t.Fatalf("truncation: %d %+v", o.stdout.Len(), o.res)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out bytes.Buffer
			res, err := h.client.Exec(ctx, &guestwire.Exec{Argv: []string{"echo", strconv.Itoa(i)}}, &out, nil)
			if err != nil || res.ExitCode != 0 || out.String() != strconv.Itoa(i)+"\n" {
				t.Errorf("exec %d: %v %q", i, err, out.String())
			}
		}()
	}
	wg.Wait()
	data := make([]byte, 5<<20)
	rand.Read(data)
	path := filepath.Join(realTempDir(t), "f.bin")
	if err := h.client.WriteFile(ctx, path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if back, err := h.client.ReadFile(ctx, path); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("round trip: %v", err)
	}
	if _, err := h.client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// The carrier dies under a running exec: the caller hears within a second.
	done := make(chan error, 1)
	go func() {
		_, err := h.client.Exec(ctx, &guestwire.Exec{Shell: "sleep 1000"}, nil, nil)
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	h.host.Close()
	select {
	case err := <-done:
		if !errors.Is(err, guestctl.ErrClosed) {
			t.Fatalf("got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("no error within a second of the channel's death")
	}
}

func TestInitSignals(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stop := handleInitSignals(testLog(t), cancel)
	defer stop()
	unix.Kill(os.Getpid(), unix.SIGHUP)
	time.Sleep(50 * time.Millisecond)
	if ctx.Err() != nil {
		t.Fatal("SIGHUP must be ignored by init")
	}
	unix.Kill(os.Getpid(), unix.SIGUSR2)
	select {
	case <-ctx.Done():
		if !errors.Is(context.Cause(ctx), errGuestPowerOff) {
			t.Fatalf("cause %v", context.Cause(ctx))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SIGUSR2 (busybox poweroff) did not stop init")
	}
}

// TestCmdParsesKernelArgs: the kernel may pass init extra words; a parse
// error in PID 1 would panic the kernel.
func TestCmdParsesKernelArgs(t *testing.T) {
	for _, args := range [][]string{{"agent"}, {"agent", "single", "-x", "--weird"}, {"agent", "--allow-not-pid1"}} {
		var cli struct {
			Agent Cmd `cmd:""`
		}
		p, err := kong.New(&cli, kong.Exit(func(int) { t.Fatalf("kong exited on %q", args) }))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Parse(args); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if args[len(args)-1] == "--allow-not-pid1" && !cli.Agent.AllowNotPID1 {
			t.Fatal("flag not parsed")
		}
	}
}

// fileClient gives the tests whole-file reads and writes over the
// streaming protocol.
type fileClient struct{ *guestctl.Client }

func (c fileClient) read(ctx context.Context, req *guestwire.FileRequest) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := c.ReadFileTo(ctx, req, &buf); err != nil {
		return nil, err
	}
	return append([]byte{}, buf.Bytes()...), nil
}

func (c fileClient) ReadFile(ctx context.Context, path string) ([]byte, error) {
	return c.read(ctx, &guestwire.FileRequest{Path: path})
}

func (c fileClient) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	_, err := c.WriteFileFrom(ctx, &guestwire.FileRequest{Path: path, Mode: uint32(mode.Perm()), Parents: true}, bytes.NewReader(data))
	return err
}

// TestAbandonedReadsGiveTheirSlotsBack: a host that stops reading a file
// part-way (its client went away) tells the guest, whose transfer, blocked
// on a stream nobody reads, ends and frees its slot; more abandoned reads
// than the guest has slots leave later reads working.
func TestAbandonedReadsGiveTheirSlotsBack(t *testing.T) {
	h := start(t, nil)
	ctx := context.Background()
	dir := realTempDir(t)
	big := make([]byte, 4<<20)
	if err := os.WriteFile(dir+"/big", big, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 2 * guestwire.MaxFileTransfers {
		_, err := h.client.ReadFileTo(ctx, &guestwire.FileRequest{Path: dir + "/big"}, &failAfter{n: 64 << 10})
		if err == nil {
			t.Fatalf("read %d: a writer that failed did not fail the read", i)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := h.client.ReadFile(ctx, dir+"/big")
		if err == nil && len(b) == len(big) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d abandoned reads: %v", 2*guestwire.MaxFileTransfers, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failAfter takes n bytes, then fails.
type failAfter struct{ n int }

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("the client went away")
	}
	f.n -= len(p)
	return len(p), nil
}
