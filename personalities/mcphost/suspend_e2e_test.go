package mcphost_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/testkit"
)

// TestSuspendResume: a suspended VM resumes with its processes where they
// were: a counter goes on from its value (not from zero), a file held open
// stays open and keeps growing, a process whose working directory is the
// workspace lives on and works there (a file it holds open in the
// workspace grows, its relative paths serve), the workspace serves again, and the guest's clock is
// the host's. A state that fails to load says why and is kept; resume with
// boot then boots the disk. Suspending what cannot be suspended is refused.
func TestSuspendResume(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	c := startMCP(t, env, runDir)
	exec := func(vm, command string) string { return strings.TrimSpace(c.shell(vm, command)) }
	number := func(s string) int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("not a number: %q", s)
		}
		return n
	}

	// A name the VM resolved before its suspend is still its to reach
	// after: the host's DNS pins are carried across.
	web := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprintf(rw, "hello from %s", r.Host) }))
	defer web.Close()
	_, webPort, _ := net.SplitHostPort(web.Listener.Addr().String())
	policy := filepath.Join(t.TempDir(), "net.toml")
	if err := os.WriteFile(policy, []byte(fmt.Sprintf(`[net]
allow = ["web.test"]
ports = [%s]
allow_private = ["web.test"]
hosts = { "web.test" = "127.0.0.1" }
`, webPort)), 0o600); err != nil {
		t.Fatal(err)
	}
	var vm hostmcp.VMOut
	c.must("capsem_create", map[string]any{"name": "sus", "ramMb": 1024, "config": policy}, &vm)
	webAddr := exec("sus", `(getent hosts web.test 2>/dev/null || nslookup web.test) | grep -o '198\.18\.[0-9.]*' | head -1`)
	if !strings.HasPrefix(webAddr, "198.18.") {
		t.Fatalf("web.test resolved to %q", webAddr)
	}
	// By its address alone, with no lookup: only a pin names it.
	fetchByAddress := "if command -v curl >/dev/null; then curl -sS -m 20 -H 'Host: web.test:" + webPort + "' http://" + webAddr + ":" + webPort + "/; " +
		"else wget -q -T 20 -O - --header 'Host: web.test:" + webPort + "' http://" + webAddr + ":" + webPort + "/; fi"
	if got := exec("sus", fetchByAddress); got != "hello from web.test:"+webPort {
		t.Fatalf("web.test by its address before the suspend: %q", got)
	}
	session := paths.Session{Dir: filepath.Join(runDir, "sessions", vm.ID)}
	exec("sus", `set -e
echo kept > /root/on-disk
echo hello > /root/workspace/hello.txt
(i=0; exec 3>>/var/tmp/held; while true; do i=$((i+1)); echo $i > /var/tmp/count.new; mv /var/tmp/count.new /var/tmp/count; echo $i >&3; sleep 0.2; done </dev/null >/dev/null 2>&1) &
echo $! > /var/tmp/counter.pid
cd /root/workspace && sleep 100000 </dev/null >/dev/null 2>&1 &
echo $! > /var/tmp/sleeper.pid
mkdir -p /root/workspace/proj
(cd /root/workspace/proj; exec 4>>log.txt; i=0; while true; do i=$((i+1)); echo $i >&4; ls . > listing.txt || echo $i > /var/tmp/ws-failed; sleep 0.2; done </dev/null >/dev/null 2>&1) &
echo $! > /var/tmp/wswriter.pid
sleep 1`)
	counter := exec("sus", "cat /var/tmp/counter.pid")
	sleeper := exec("sus", "cat /var/tmp/sleeper.pid")
	alive := func(pid string) string {
		t.Helper()
		return exec("sus", "kill -0 "+pid+" 2>/dev/null && echo alive || echo gone")
	}
	if alive(counter) != "alive" || alive(sleeper) != "alive" {
		t.Fatal("the background processes did not start")
	}
	before := number(exec("sus", "cat /var/tmp/count"))
	held := number(exec("sus", "wc -l < /var/tmp/held"))
	wsWriter := exec("sus", "cat /var/tmp/wswriter.pid")
	wsLog := filepath.Join(session.Workspace(), "proj", "log.txt")
	lines := func(path string) int {
		b, _ := os.ReadFile(path)
		return strings.Count(string(b), "\n")
	}

	var out hostmcp.VMOut
	c.must("capsem_suspend", map[string]any{"id": "sus"}, &out)
	if out.State != "suspended" {
		t.Fatalf("suspend: %+v", out)
	}
	c.refused("capsem_exec", map[string]any{"id": "sus", "command": "true"}, "suspended")
	c.refused("capsem_suspend", map[string]any{"id": "sus"}, "VM sus is suspended: suspend takes a VM that is running")
	time.Sleep(3 * time.Second) // the host's clock moves on meanwhile

	c.must("capsem_resume", map[string]any{"name": "sus"}, &out)
	if out.State != "running" {
		t.Fatalf("resume: %+v", out)
	}
	if alive(counter) != "alive" {
		t.Errorf("the counter's process %s is gone", counter)
	}
	if alive(sleeper) != "alive" {
		t.Errorf("the process %s whose working directory is the workspace is gone", sleeper)
	}
	after := number(exec("sus", "sleep 1; cat /var/tmp/count"))
	if after <= before || after > before+200 {
		t.Errorf("the counter was %d before the suspend and is %d after: not carried on", before, after)
	}
	if got := number(exec("sus", "wc -l < /var/tmp/held")); got <= held {
		t.Errorf("the file held open had %d lines, has %d: not written on", held, got)
	}
	if got := exec("sus", "readlink /proc/"+counter+"/fd/3"); got != "/var/tmp/held" {
		t.Errorf("the counter's descriptor 3 is %q", got)
	}
	if got := exec("sus", "cat /root/workspace/hello.txt; echo more > /root/workspace/after.txt; cat /root/on-disk"); got != "hello\nkept" {
		t.Errorf("the workspace and disk after the resume: %q", got)
	}
	if b, err := os.ReadFile(filepath.Join(session.Workspace(), "after.txt")); err != nil || string(b) != "more\n" {
		t.Errorf("the workspace's host side after the resume: %q, %v", b, err)
	}
	// A process working in the workspace carries on: its descriptor opened
	// there writes on (the lines reach the host), its working directory
	// there serves its relative paths.
	wsBefore := lines(wsLog)
	time.Sleep(time.Second)
	if got := lines(wsLog); got <= wsBefore {
		t.Errorf("the workspace file held open had %d lines on the host, has %d a second later: not written on", wsBefore, got)
	}
	if got := exec("sus", "readlink /proc/"+wsWriter+"/fd/4 /proc/"+wsWriter+"/cwd; cat /var/tmp/ws-failed 2>/dev/null || echo none"); got != "/root/workspace/proj/log.txt\n/root/workspace/proj\nnone" {
		t.Errorf("the workspace writer after the resume (its fd 4, its cwd, a failed relative write): %q", got)
	}
	if got := exec("sus", fetchByAddress); got != "hello from web.test:"+webPort {
		t.Errorf("web.test by the address its lookup gave before the suspend: %q (the DNS pins were not carried across)", got)
	}
	guestClock := number(exec("sus", "date +%s"))
	if d := time.Now().Unix() - int64(guestClock); d < -5 || d > 5 {
		t.Errorf("the guest's clock is %d s off the host's after the resume", d)
	}

	// A state that does not load says why, and is kept; boot discards it.
	c.must("capsem_suspend", map[string]any{"id": "sus"}, nil)
	states, _ := filepath.Glob(filepath.Join(session.Suspend(), "*.state"))
	if len(states) != 1 {
		t.Fatalf("suspend states: %v", states)
	}
	if err := os.WriteFile(states[0], []byte("not a state"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.refused("capsem_resume", map[string]any{"name": "sus"}, "did not resume from its suspended state")
	c.must("capsem_info", map[string]any{"id": "sus"}, &out)
	if out.State != "suspended" {
		t.Errorf("after a failed resume: %+v", out)
	}
	c.must("capsem_resume", map[string]any{"name": "sus", "boot": true}, &out)
	// The counter's file is on the disk, and no longer counts.
	if got := exec("sus", `cat /root/on-disk; a=$(cat /var/tmp/count); sleep 1; [ "$a" = "$(cat /var/tmp/count)" ] && echo stopped`); got != "kept\nstopped" {
		t.Errorf("after a resume with boot: %q", got)
	}

	var eph hostmcp.VMOut
	c.must("capsem_create", map[string]any{"ramMb": 512, "base": "minimal"}, &eph)
	c.refused("capsem_suspend", map[string]any{"id": eph.ID}, "only a persistent VM can be suspended")
	c.must("capsem_stop", map[string]any{"id": "sus"}, nil)
	c.refused("capsem_suspend", map[string]any{"id": "sus"}, "VM sus is stopped: suspend takes a VM that is running")
}

// TestMemoryFork: an image with memory of a running VM makes VMs that
// start with the source's processes running (a counter carries on from
// where it was), each with its own host name and machine id, independent
// of each other and of the source, which runs on. Its VMs keep its memory
// size; a stopped VM has no memory to fork.
func TestMemoryFork(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	c := startMCP(t, env, runDir)
	rm := exec.Command(testkit.CapsemBinary(t), "image", "rm", "memfork-img")
	rm.Env = env
	rm.Run() // left by a run that died midway
	t.Cleanup(func() {
		for _, vm := range []string{"memfork-a", "memfork-b", "memfork-src"} {
			c.call("capsem_delete", map[string]any{"id": vm}, nil)
		}
		c.call("capsem_delete", map[string]any{"id": "memfork-img"}, nil)
	})
	run := func(vm, command string) string { return strings.TrimSpace(c.shell(vm, command)) }
	c.must("capsem_create", map[string]any{"name": "memfork-src", "ramMb": 768}, nil)
	run("memfork-src", `(i=0; while true; do i=$((i+1)); echo $i > /var/tmp/count.new; mv /var/tmp/count.new /var/tmp/count; sleep 0.2; done </dev/null >/dev/null 2>&1) &
echo $! > /var/tmp/counter.pid; echo from-source > /root/file; sleep 1`)
	srcID := run("memfork-src", "cat /etc/machine-id")
	counting := func(vm string) (int, int) {
		t.Helper()
		out := strings.Fields(run(vm, `kill -0 $(cat /var/tmp/counter.pid) || echo dead; a=$(cat /var/tmp/count); sleep 1; echo $a $(cat /var/tmp/count)`))
		if len(out) != 2 {
			t.Fatalf("%s: the counter: %q", vm, out)
		}
		a, _ := strconv.Atoi(out[0])
		b, _ := strconv.Atoi(out[1])
		if b <= a {
			t.Errorf("%s: the counter does not count (%d then %d)", vm, a, b)
		}
		return a, b
	}
	_, atFork := counting("memfork-src")

	var img hostmcp.ImageOut
	c.must("capsem_fork", map[string]any{"id": "memfork-src", "name": "memfork-img", "memory": true}, &img)
	if !img.Memory || img.StateBytes <= 0 || img.SourceState != "running" {
		t.Fatalf("memory fork: %+v", img)
	}
	t.Logf("memory fork: %d ms, state %d bytes, image %d bytes", img.ForkMs, img.StateBytes, img.SizeBytes)
	counting("memfork-src") // the source runs on

	c.refused("capsem_create", map[string]any{"image": "memfork-img", "ramMb": 1024}, "its VMs have its 768 MB")
	for _, child := range []string{"memfork-a", "memfork-b"} {
		var v hostmcp.VMOut
		c.must("capsem_create", map[string]any{"name": child, "image": "memfork-img"}, &v)
		if v.RAMMb != 768 {
			t.Errorf("%s: %d MB", child, v.RAMMb)
		}
		if first, _ := counting(child); first < atFork {
			t.Errorf("%s: the counter is at %d, below the source's %d before the fork: it started again", child, first, atFork)
		}
		if got := run(child, "hostname; cat /root/file"); got != child+"\nfrom-source" {
			t.Errorf("%s: %q", child, got)
		}
		if id := run(child, "cat /etc/machine-id"); id == srcID || len(id) != 32 {
			t.Errorf("%s: machine id %q (the source's: %q)", child, id, srcID)
		}
		run(child, "echo "+child+" > /root/file")
	}
	if got := run("memfork-src", "cat /root/file") + run("memfork-a", "cat /root/file"); got != "from-sourcememfork-a" {
		t.Errorf("the VMs are not independent: %q", got)
	}
	c.must("capsem_stop", map[string]any{"id": "memfork-src"}, nil)
	c.refused("capsem_fork", map[string]any{"id": "memfork-src", "name": "memfork-x", "memory": true}, "a fork with memory takes a VM that is running or suspended")
}

// TestSuspendOutlivesAnUpgrade: a VM suspended by one capsem resumes under
// another build whose guest binary, and so whose initramfs, differs (the
// initramfs is in the suspended guest's RAM already), its processes
// carrying on.
func TestSuspendOutlivesAnUpgrade(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	old := testkit.CapsemBinary(t)
	run := func(capsem string, args ...string) string {
		t.Helper()
		cmd := exec.Command(capsem, args...)
		cmd.Env = env
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("%s %v: %v\n%s", filepath.Base(filepath.Dir(capsem)), args, err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	home := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "CAPSEM_HOME="); ok {
			home = v
		}
	}
	minimalRef := func() string {
		b, _ := os.ReadFile(filepath.Join(home, "assets", "refs", "minimal"))
		return strings.TrimSpace(string(b))
	}

	run(old, "create", "upg", "--base", "minimal", "--ram-mb", "512")
	t.Cleanup(func() {
		cmd := exec.Command(old, "rm", "upg")
		cmd.Env = env
		cmd.Run()
	})
	run(old, "exec", "upg", "--", "sh", "-c", `(i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done) </dev/null >/dev/null 2>&1 & sleep 1`)
	before, _ := strconv.Atoi(run(old, "exec", "upg", "--", "cat", "/tmp/count"))
	oldMinimal := minimalRef()
	run(old, "suspend", "upg")
	run(old, "service", "stop")

	// The upgrade: another capsem build, its guest binary another file
	// (bytes after an ELF's end change nothing it runs).
	dir := t.TempDir()
	upgraded := filepath.Join(dir, "capsem")
	for _, f := range []struct{ from, to string }{{old, upgraded}, {filepath.Join(filepath.Dir(old), "capsem-guest"), filepath.Join(dir, "capsem-guest")}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f.to) == "capsem-guest" {
			b = append(b, "another build"...)
		}
		if err := os.WriteFile(f.to, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		cmd := exec.Command(upgraded, "service", "stop")
		cmd.Env = env
		cmd.Run()
	})
	run(upgraded, "resume", "upg")
	if minimalRef() == oldMinimal {
		t.Fatalf("the upgraded capsem did not make another minimal root (%s)", oldMinimal)
	}
	after, _ := strconv.Atoi(run(upgraded, "exec", "upg", "--", "sh", "-c", "sleep 1; cat /tmp/count"))
	if after <= before || after > before+200 {
		t.Errorf("the counter was %d before the suspend and is %d after the upgrade's resume", before, after)
	}
	run(upgraded, "rm", "upg")
}
