package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/testkit"
)

type capsemCLI struct {
	t   *testing.T
	env []string
}

// run runs `capsem ARGS...` and returns its stdout, stderr and status.
func (c capsemCLI) run(args ...string) (string, string, int) {
	c.t.Helper()
	cmd := exec.Command(testkit.CapsemBinary(c.t), args...)
	cmd.Env = c.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &exit):
		return out.String(), errb.String(), exit.ExitCode()
	}
	c.t.Fatalf("capsem %v: %v", args, err)
	return "", "", 0
}

func (c capsemCLI) must(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("capsem %v: exit %d\n%s%s", args, code, out, errOut)
	}
	return out
}

// TestCLIVerbs drives a VM with the CLI a person uses: every verb goes
// through a service the first one starts.
func TestCLIVerbs(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	c := capsemCLI{t: t, env: env}

	published := freePort(t)
	// The minimal base: busybox's httpd serves the published port.
	id := strings.TrimSpace(c.must("create", "dev", "--base", "minimal", "--ram-mb", "512", "--cpus", "1", "-e", "WHO=cli", "--publish", fmt.Sprintf("%d:3000", published)))
	if !strings.HasPrefix(id, "vm-") {
		t.Fatalf("create printed %q, want an id", id)
	}
	checkPublishedPorts(t, c, "dev", published)
	out, errOut, code := c.run("exec", "dev", "--", "sh", "-c", `echo "out $WHO"; echo err >&2; exit 5`)
	if out != "out cli\n" || errOut != "err\n" || code != 5 {
		t.Fatalf("exec: %q %q %d", out, errOut, code)
	}
	if _, errOut, code := c.run("exec", "--timeout", "1s", "dev", "--", "sleep", "30"); code != 124 || !strings.Contains(errOut, "timed out") {
		t.Fatalf("exec with a timeout: exit %d %q", code, errOut)
	}
	if _, errOut, code := c.run("exec", "ghost", "--", "true"); code != 1 || !strings.Contains(errOut, `no VM named "ghost"`) {
		t.Fatalf("exec on an unknown VM: exit %d %q", code, errOut)
	}

	var vms []api.VM
	if err := json.Unmarshal([]byte(c.must("ls", "--json")), &vms); err != nil || len(vms) != 1 || vms[0].Name != "dev" || vms[0].ID != id {
		t.Fatalf("ls --json: %+v %v", vms, err)
	}
	if table := c.must("ls"); !strings.Contains(table, "dev") || !strings.Contains(table, "running") || !strings.Contains(table, "persistent") {
		t.Fatalf("ls: %s", table)
	}
	var info api.VM
	if err := json.Unmarshal([]byte(c.must("info", "dev", "--json")), &info); err != nil || info.Process == nil || info.Process.Accel == "" {
		t.Fatalf("info --json: %+v %v", info, err)
	}

	dir := t.TempDir()
	src := filepath.Join(dir, "in.bin")
	blob := append([]byte("binary\x00\xff\xfe"), bytes.Repeat([]byte{0x80}, 1<<20)...)
	os.WriteFile(src, blob, 0o600)
	c.must("cp", src, "dev:/root/workspace/in.bin")
	back := filepath.Join(dir, "back.bin")
	c.must("cp", "dev:/root/workspace/in.bin", back)
	if got, _ := os.ReadFile(back); !bytes.Equal(got, blob) {
		t.Fatalf("cp round trip: %d bytes back, want %d", len(got), len(blob))
	}
	// Into a directory, either way, the file keeps its name.
	c.must("cp", src, "dev:/tmp/")
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	c.must("cp", "dev:/tmp/in.bin", filepath.Join(dir, "sub"))
	if got, _ := os.ReadFile(filepath.Join(dir, "sub", "in.bin")); !bytes.Equal(got, blob) {
		t.Fatalf("cp into directories: %d bytes", len(got))
	}
	if _, errOut, code := c.run("cp", src, back); code == 0 || !strings.Contains(errOut, "exactly one of") {
		t.Fatalf("cp host to host: exit %d %q", code, errOut)
	}

	if q := c.must("inspect", "dev", "SELECT command FROM exec_events ORDER BY timestamp LIMIT 1"); !strings.Contains(q, "COMMAND") && !strings.Contains(q, "command") {
		t.Fatalf("inspect: %s", q)
	}
	if _, errOut, code := c.run("inspect", "dev", "DELETE FROM exec_events"); code == 0 || !strings.Contains(errOut, "refused") {
		t.Fatalf("inspect a write: exit %d %q", code, errOut)
	}
	if schema := c.must("inspect", "dev", "--schema"); !strings.Contains(schema, "CREATE TABLE mcp_calls") {
		t.Fatalf("inspect --schema: %s", schema)
	}
	// The last command on the timeline, and how many before it were left out.
	if tl := c.must("timeline", "dev", "--layer", "exec", "--limit", "1"); !strings.Contains(tl, "earlier events left out") || !strings.Contains(tl, "  exec  api: sleep 30 → timed out") {
		t.Fatalf("timeline: %s", tl)
	}
	if _, errOut, code := c.run("timeline", "dev", "--since", "yesterday"); code == 0 || !strings.Contains(errOut, `--since: since "yesterday"`) {
		t.Fatalf("timeline --since yesterday: exit %d %q", code, errOut)
	}
	if logs := c.must("logs", "dev", "-n", "3"); !strings.Contains(logs, "== serial console ==") {
		t.Fatalf("logs: %s", logs)
	}

	c.must("stop", "dev")
	if _, errOut, code := c.run("exec", "dev", "--", "true"); code == 0 || !strings.Contains(errOut, "not running") {
		t.Fatalf("exec on a stopped VM: exit %d %q", code, errOut)
	}
	c.must("resume", "dev")
	checkPortsAfterResume(t, c, "dev", published)
	if out := c.must("exec", "dev", "--", "cat", "/root/workspace/in.bin"); out != string(blob) {
		t.Fatalf("the workspace after resume: %d bytes", len(out))
	}
	eph := strings.TrimSpace(c.must("create", "--ram-mb", "512", "--cpus", "1"))
	c.must("persist", eph, "second")
	c.must("rm", "dev", "second")
	if out := c.must("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("VMs left: %s", out)
	}
	if status := c.must("service", "status"); !strings.Contains(status, "0 VM(s)") {
		t.Fatalf("service status: %s", status)
	}
}

// TestGuestCannotDriveTheTerminal: a hostile guest writes OSC 52 (set the
// clipboard) and OSC 0 (retitle the window) to its console and into its
// ledger. capsem logs and capsem inspect show them escaped, not one ESC
// byte reaching the terminal; --raw (and exec, which the person asked for)
// pass them as they are, and --json escapes them in its own way.
func TestGuestCannotDriveTheTerminal(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	c := capsemCLI{t: t, env: env}
	c.must("create", "osc", "--ram-mb", "512", "--cpus", "1")

	const (
		clipboard = "\x1b]52;c;Y2Fwc2VtLXBhc3RlZA==\x07"
		title     = "\x1b]0;capsem-pwned\x07"
		shown     = `\x1b]52;c;Y2Fwc2VtLXBhc3RlZA==\x07\x1b]0;capsem-pwned\x07 osc-marker`
	)
	script := `printf '\033]52;c;Y2Fwc2VtLXBhc3RlZA==\007\033]0;capsem-pwned\007 osc-marker\n' | tee /dev/console`
	if out := c.must("exec", "osc", "--", "sh", "-c", script); out != clipboard+title+" osc-marker\n" {
		t.Fatalf("exec output is not passed as it is: %q", out)
	}

	var logs string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		logs = c.must("logs", "osc", "--grep", "osc-marker")
		if strings.Contains(logs, "osc-marker") || time.Now().After(deadline) {
			break
		}
	}
	if strings.ContainsRune(logs, 0x1b) || !strings.Contains(logs, shown) {
		t.Fatalf("capsem logs: want the console's escapes shown as %q, no ESC byte:\n%q", shown, logs)
	}
	if raw := c.must("logs", "osc", "--raw", "--grep", "osc-marker"); !strings.Contains(raw, clipboard+title) {
		t.Fatalf("capsem logs --raw: want the bytes as they are:\n%q", raw)
	}

	const query = "SELECT stdout_preview FROM exec_events WHERE stdout_preview LIKE '%osc-marker%'"
	if table := c.must("inspect", "osc", query); strings.ContainsRune(table, 0x1b) || !strings.Contains(table, shown+`\n`) {
		t.Fatalf("capsem inspect: want the cell shown as %q, no ESC byte:\n%q", shown+`\n`, table)
	}
	if raw := c.must("inspect", "osc", "--raw", query); !strings.Contains(raw, clipboard+title) {
		t.Fatalf("capsem inspect --raw: want the bytes as they are:\n%q", raw)
	}
	js := c.must("inspect", "osc", "--json", query)
	var r api.InspectResult
	if strings.ContainsRune(js, 0x1b) || json.Unmarshal([]byte(js), &r) != nil || len(r.Rows) != 1 || r.Rows[0][0] != clipboard+title+" osc-marker\n" {
		t.Fatalf("capsem inspect --json: want the cell escaped by JSON and decoding to the guest's bytes:\n%q", js)
	}
}

// TestCLISendsNothingToAnotherUser: another local user listens on the
// service's socket: in a shared directory where it bound first
// (CAPSEM_UDS_PATH in /tmp), or on a socket file of this user's, where only
// the kernel's record of who listens tells. capsem refuses, naming the
// socket and why, and the listener receives not one byte: not the command,
// not the secret given with -e.
func TestCLISendsNothingToAnotherUser(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	places := []struct {
		name    string
		listen  func(t *testing.T, path string) *testkit.ForeignListener
		refusal string
	}{
		{"a shared directory", func(t *testing.T, path string) *testkit.ForeignListener {
			if err := os.Chmod(filepath.Dir(path), 0o777|os.ModeSticky); err != nil {
				t.Fatal(err)
			}
			return testkit.ListenAsNobody(t, path)
		}, "other users can create and replace files in it (mode 1777)"},
		{"a socket of this user's", func(t *testing.T, path string) *testkit.ForeignListener {
			l := testkit.MoveInAsNobody(t, path)
			if err := os.Lchown(path, os.Geteuid(), os.Getegid()); err != nil {
				t.Fatal(err)
			}
			return l
		}, "runs as uid 65534, not as you"},
	}
	for _, p := range places {
		t.Run(p.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "csu-")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(dir)
			os.Chmod(dir, 0o755)
			sock := filepath.Join(dir, "service.sock")
			l := p.listen(t, sock)
			c := capsemCLI{t: t, env: append(slices.Clip(env), "CAPSEM_UDS_PATH="+sock)}
			for _, args := range [][]string{
				{"exec", "-e", "API_KEY=sk-must-not-leave", "dev", "--", "env"},
				{"ls"},
				{"service", "start"},
				{"service", "stop"},
				{"service", "status"},
			} {
				out, errOut, code := c.run(args...)
				if code == 0 || !strings.Contains(errOut, "refusing to connect to "+sock+": ") || !strings.Contains(errOut, p.refusal) {
					t.Errorf("capsem %v: exit %d, stdout %q, stderr %q; want a refusal naming %s and %q", args, code, out, errOut, sock, p.refusal)
				}
			}
			if _, bytes := l.Stop(); bytes != 0 {
				t.Errorf("the other user's listener received %d bytes", bytes)
			}
		})
	}
}

// TestServiceRefusesASharedRunDir: CAPSEM_RUN_DIR names a shared directory
// (sticky and world-writable, as /tmp is, and this user's: the test runs
// as root) or another user's. The service refuses to start, saying why,
// and the directory keeps its mode and owner, and gets no file.
func TestServiceRefusesASharedRunDir(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	tests := []struct {
		name    string
		mode    os.FileMode
		owner   int // -1: this user
		refusal string
	}{
		{"sticky and world-writable", 0o777 | os.ModeSticky, -1, "other users can create and replace files in it (mode 1777)"},
		{"another user's", 0o755, testkit.NobodyUID, "it belongs to uid 65534, not to you"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run, err := os.MkdirTemp("", "csr-shared-")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(run)
			if err := os.Chmod(run, tt.mode); err != nil {
				t.Fatal(err)
			}
			if tt.owner >= 0 {
				if err := os.Chown(run, tt.owner, tt.owner); err != nil {
					t.Fatalf("giving the directory to another user (the test runs as root, as make test does): %v", err)
				}
			}
			before, _ := os.Stat(run)
			c := capsemCLI{t: t, env: append(slices.Clip(env), "CAPSEM_RUN_DIR="+run)}
			// Should the service serve after all, the timeout ends it.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, testkit.CapsemBinary(t), "service")
			cmd.Env = c.env
			out, err := cmd.CombinedOutput()
			want := "refusing the run directory: " + run + " is not private to you: " + tt.refusal
			if err == nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), "CAPSEM_RUN_DIR") {
				t.Errorf("capsem service: %v\n%s\nwant %q", err, out, want)
			}
			for _, args := range [][]string{{"service", "start"}, {"ls"}} {
				if _, errOut, code := c.run(args...); code == 0 || !strings.Contains(errOut, run+" is not private to you: "+tt.refusal) {
					t.Errorf("capsem %v: exit %d %q", args, code, errOut)
				}
			}
			after, _ := os.Stat(run)
			if after.Mode() != before.Mode() || after.Sys().(*syscall.Stat_t).Uid != before.Sys().(*syscall.Stat_t).Uid {
				t.Errorf("the run directory changed: %v to %v", before.Mode(), after.Mode())
			}
			if entries, _ := os.ReadDir(run); len(entries) > 0 {
				t.Errorf("%d entries left in the refused directory, first %s", len(entries), entries[0].Name())
			}
		})
	}
}

// ptyOutput collects what a program writes to its pseudo-terminal.
type ptyOutput struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *ptyOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// waitFor waits until the output since from holds want, and returns the
// offset past it.
func (o *ptyOutput) waitFor(t *testing.T, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		o.mu.Lock()
		s := o.buf.String()
		o.mu.Unlock()
		if i := strings.Index(s[from:], want); i >= 0 {
			return from + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal never showed %q; it shows:\n%q", want, s[from:])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShell drives `capsem shell` through a pseudo-terminal, as a person
// at a terminal would: a command typed and its output read, a window
// resize seen by stty, Ctrl-C interrupting sleep, and the shell's exit
// status returned.
func TestShell(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	c := capsemCLI{t: t, env: env}
	c.must("create", "term", "--ram-mb", "512", "--cpus", "1")

	cmd := exec.Command(testkit.CapsemBinary(t), "shell", "term")
	cmd.Env = append(env, "TERM=xterm")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var out ptyOutput
	go io.Copy(&out, ptmx)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
		}
	}()

	type_ := func(s string) {
		if _, err := ptmx.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	type_("echo hello-$((40+2)) $TERM\r")
	at := out.waitFor(t, 0, "hello-42 xterm")
	type_("stty size\r")
	at = out.waitFor(t, at, "24 80")
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	// The resize travels asynchronously: ask until the guest sees it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		type_("stty size\r")
		out.mu.Lock()
		seen := strings.Contains(out.buf.String()[at:], "40 100")
		out.mu.Unlock()
		if seen {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest never saw the resize")
		}
		time.Sleep(200 * time.Millisecond)
	}
	at = out.waitFor(t, at, "40 100")
	type_("sleep 100\r")
	time.Sleep(500 * time.Millisecond)
	type_("\x03") // Ctrl-C
	type_("echo after-int-$((1+1))\r")
	at = out.waitFor(t, at, "after-int-2")
	type_("exit 7\r")
	select {
	case err := <-exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 7 {
			t.Fatalf("capsem shell ended with %v, want exit status 7", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("capsem shell did not exit after the shell did")
	}
	// The session is on the record.
	q := c.must("inspect", "term", "SELECT exit_code FROM exec_events WHERE source = 'terminal'", "--json")
	var r api.InspectResult
	if err := json.Unmarshal([]byte(q), &r); err != nil || len(r.Rows) != 1 || r.Rows[0][0] != 7.0 {
		t.Fatalf("the terminal session's row: %s %v", q, err)
	}
	if _, errOut, code := c.run("shell", "ghost"); code == 0 || !strings.Contains(errOut, `no VM named "ghost"`) {
		t.Fatalf("shell into an unknown VM: exit %d %q", code, errOut)
	}
}
