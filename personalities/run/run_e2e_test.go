package run_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/testkit"
)

// TestRunStreamsAndExits is the README's main command: boot, run, stream
// stdout and stderr apart, exit with the command's code, remove the VM.
func TestRunStreamsAndExits(t *testing.T) {
	// Other tests' VMs come and go in the same home: this one is known by
	// its name, which its process log carries.
	env, runDir := testkit.ServiceEnv(t)
	name := "streams"
	stdout, stderr, code := testkit.CapsemRunIn(t, env, "--name", name, "--env", "GREETING=hello", "--", "sh", "-c", `echo "$GREETING from $(hostname)"; echo to-stderr >&2; exit 3`)
	if code != 3 {
		t.Fatalf("exit code %d, want 3\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	if stdout != "hello from "+name+"\n" {
		t.Errorf("stdout %q", stdout)
	}
	if !strings.Contains(stderr, "to-stderr") {
		t.Errorf("stderr %q", stderr)
	}
	// Removed before capsem run exits: its session, its record, its name.
	if left, _ := filepath.Glob(filepath.Join(runDir, "sessions", "*")); len(left) > 0 {
		t.Errorf("the ephemeral VM's session directory was left behind: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(runDir, "vms", "*.json")); len(left) > 0 {
		t.Errorf("the ephemeral VM's record was left behind: %v", left)
	}
	if stdout, stderr, code := testkit.CapsemRunIn(t, env, "--name", name, "--", "hostname"); code != 0 || stdout != name+"\n" {
		t.Errorf("the name was not free again after the run: exit %d, %q %q", code, stdout, stderr)
	}
	if _, _, code := testkit.CapsemRunIn(t, env, "--env", "NOEQUALS", "--", "true"); code == 0 {
		t.Error("a malformed --env was accepted")
	}
}

// TestRunAppliesPolicy: `capsem run --config` puts the VM's gateway under
// that policy; the guest's MCP call is blocked and the tool is not listed.
func TestRunAppliesPolicy(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "policy.toml")
	os.WriteFile(cfg, []byte("[mcp.tools]\n\"builtin__http_head\" = \"block\"\n"), 0o600)
	script := `printf '%s\n' ` +
		`'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"guest","version":"1"}}}' ` +
		`'{"jsonrpc":"2.0","id":2,"method":"tools/list"}' ` +
		`'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"builtin__http_head","arguments":{"url":"http://127.0.0.1:9/"}}}' ` +
		`| capsem-mcp-server`
	stdout, stderr, code := testkit.CapsemRun(t, "--config", cfg, "--", "sh", "-c", script)
	if code != 0 || !strings.Contains(stdout, `"id":3,"error":{"code":-32600`) || !strings.Contains(stdout, "tools.builtin__http_head") {
		t.Fatalf("exit %d\nstdout %.3000s\nstderr %s", code, stdout, stderr)
	}
	if strings.Contains(stdout, `"name":"builtin__http_head"`) || !strings.Contains(stdout, `"name":"builtin__http_get"`) {
		t.Errorf("tools/list does not hide exactly the blocked tool: %.3000s", stdout)
	}
}

// TestRunRefusesABadConfigurationAtOnce: a configuration the VM's
// process would refuse is refused before anything boots, with its reason,
// and leaves nothing behind.
func TestRunRefusesABadConfigurationAtOnce(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(cfg, []byte("[mcp]\ndefault = \"perhaps\"\n"), 0o600)
	env, runDir := testkit.ServiceEnv(t)
	start := time.Now()
	_, stderr, code := testkit.CapsemRunIn(t, env, "--config", cfg, "--", "true")
	if code == 0 || !strings.Contains(stderr, `"perhaps" is not a decision`) || !strings.Contains(stderr, "bad.toml") {
		t.Fatalf("exit %d, stderr %q: want a failure naming the file and its problem", code, stderr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v to refuse a configuration before booting", d)
	}
	if left, _ := filepath.Glob(filepath.Join(runDir, "sessions", "*")); len(left) > 0 {
		t.Errorf("a refused run left a session behind: %v", left)
	}
	if procs := testkit.VMProcesses(runDir); len(procs) > 0 {
		t.Errorf("a refused run started a VM process: %v", procs)
	}
}

// TestRunNamesTheAccelerator: whatever this host's /dev/kvm (absent,
// present but unable to run the guest, or working), the VM runs and the log
// says under which accelerator and why, agreeing with the host.
func TestRunNamesTheAccelerator(t *testing.T) {
	stdout, stderr, code := testkit.CapsemRun(t, "--", "uname", "-r")
	if code != 0 || !strings.Contains(stdout, "amd64") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	var ready struct {
		Msg   string `json:"msg"`
		Accel string `json:"accel"`
		Why   string `json:"why"`
	}
	for _, line := range strings.Split(stderr, "\n") {
		if json.Unmarshal([]byte(line), &ready) == nil && ready.Msg == "VM ready" {
			break
		}
	}
	if ready.Msg != "VM ready" {
		t.Fatalf("no VM ready line on stderr: %s", stderr)
	}
	t.Logf("accelerator %s: %s", ready.Accel, ready.Why)
	kvm, kvmErr := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if kvmErr == nil {
		kvm.Close()
	}
	switch {
	case os.Getenv("CAPSEM_ACCEL") != "":
		if ready.Accel != os.Getenv("CAPSEM_ACCEL") || !strings.Contains(ready.Why, "forced by CAPSEM_ACCEL") {
			t.Errorf("CAPSEM_ACCEL=%s, yet %s: %s", os.Getenv("CAPSEM_ACCEL"), ready.Accel, ready.Why)
		}
	case kvmErr != nil:
		if ready.Accel != "tcg" || !strings.Contains(ready.Why, "KVM not available") {
			t.Errorf("no usable /dev/kvm (%v), yet %s: %s", kvmErr, ready.Accel, ready.Why)
		}
	case ready.Accel == "kvm":
		if !strings.HasPrefix(ready.Why, "KVM proven") {
			t.Errorf("under KVM without its proof: %s", ready.Why)
		}
	default:
		if ready.Accel != "tcg" || !strings.HasSuffix(ready.Why, "; using TCG") ||
			!(strings.HasPrefix(ready.Why, "KVM present but cannot run this kernel") || strings.HasPrefix(ready.Why, "KVM passed the probe")) {
			t.Errorf("/dev/kvm opens, yet %s: %s", ready.Accel, ready.Why)
		}
	}
}

// cli runs capsem with env and returns its stdout (stderr too, when it
// fails).
func cli(t *testing.T, env []string, args ...string) (string, error) {
	cmd := exec.Command(testkit.CapsemBinary(t), args...)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// startRun starts `capsem run --name name -- sleep 600` with env and waits
// until its VM answers `capsem exec name -- hostname` with its name; it
// returns the run and its stderr.
func startRun(t *testing.T, env []string, name string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	testkit.GuestBinary(t)
	run := exec.Command(testkit.CapsemBinary(t), "run", "--no-autodetect", "--name", name, "--", "sleep", "600")
	run.Env = env
	stderr := &strings.Builder{}
	run.Stderr = stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.Process.Kill() })
	deadline := time.Now().Add(4 * time.Minute)
	for {
		out, err := cli(t, env, "exec", name, "--", "hostname")
		if err == nil && out == name+"\n" {
			return run, stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's VM never answered exec by its name: %q %v; capsem run: %s", out, err, stderr.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestRunKilledLeavesNothing: while it runs, a run's VM is a VM of the
// service like any other (listed, ephemeral, reached by its name, under
// the service's options: here a bounded TCG cache); a capsem run killed
// with SIGKILL mid-command, which cannot clean up, still leaves nothing:
// the service sees its stream break, kills the command and removes the VM.
func TestRunKilledLeavesNothing(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	env = append(env, "CAPSEM_TCG_CACHE_MIB=32") // read by the service this test's run starts
	capsem := func(args ...string) (string, error) { return cli(t, env, args...) }
	run, _ := startRun(t, env, "sleeper")
	deadline := time.Now().Add(time.Minute)
	out, err := capsem("ls", "--json")
	var vms []struct {
		Name       string `json:"name"`
		Persistent bool   `json:"persistent"`
		State      string `json:"state"`
	}
	if err != nil || json.Unmarshal([]byte(out), &vms) != nil || len(vms) != 1 || vms[0].Name != "sleeper" || vms[0].Persistent || vms[0].State != "running" {
		t.Fatalf("capsem ls during the run: %v %s", err, out)
	}
	out, err = capsem("info", "sleeper", "--json")
	var info struct {
		PID     int `json:"pid"`
		Process struct {
			Accel   string `json:"accel"`
			QEMUPID int    `json:"qemu_pid"`
		} `json:"process"`
	}
	if err != nil || json.Unmarshal([]byte(out), &info) != nil || info.Process.QEMUPID == 0 {
		t.Fatalf("capsem info during the run: %v %s", err, out)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", info.Process.QEMUPID))
	wantAccel := "\x00-accel\x00" + info.Process.Accel + "\x00"
	if info.Process.Accel == "tcg" {
		wantAccel = "\x00-accel\x00tcg,tb-size=32\x00"
	}
	if err != nil || !strings.Contains(string(cmdline), wantAccel) {
		t.Errorf("QEMU's command line lacks %q: %v %q", wantAccel, err, cmdline)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", info.PID)); err != nil || !strings.Contains(string(cmdline), "\x00--tcg-cache-mib\x0032\x00") {
		t.Errorf("the VM's process was not given the service's TCG cache bound: %v %q", err, cmdline)
	}
	run.Process.Kill()
	run.Wait()
	for {
		out, err := capsem("ls", "--json")
		left, _ := filepath.Glob(filepath.Join(runDir, "sessions", "*"))
		if err == nil && strings.TrimSpace(out) == "[]" && len(left) == 0 && len(testkit.VMProcesses(runDir)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the killed run's VM was not removed: ls %s (%v), sessions %v, processes %v", out, err, left, testkit.VMProcesses(runDir))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestServiceStopEndsARun: a service that stops ends the runs it serves
// (their clients' streams cannot outlive it): the run's command is
// killed, capsem run fails saying so, and nothing of the VM is left.
func TestServiceStopEndsARun(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	run, runErr := startRun(t, env, "cut-short")
	if out, err := cli(t, env, "service", "stop"); err != nil {
		t.Fatalf("service stop: %v %s", err, out)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("capsem run exited 0 although its command was killed; stderr %s", runErr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("capsem run still runs after its service stopped; stderr %s", runErr.String())
	}
	if procs := testkit.VMProcesses(runDir); len(procs) > 0 {
		t.Errorf("the run's VM process outlived the service: %v", procs)
	}
	if left, _ := filepath.Glob(filepath.Join(runDir, "sessions", "*")); len(left) > 0 {
		t.Errorf("the run's session directory outlived the service: %v", left)
	}
	if left, _ := filepath.Glob(filepath.Join(runDir, "vms", "*.json")); len(left) > 0 {
		t.Errorf("the run's record outlived the service: %v", left)
	}
}

// TestRunWithoutADisk: by default a VM has the full root's image and its
// own disk; the minimal base has the disk alone, and --disk-gb 0 none
// (the guest runs from RAM), which the full base refuses, saying why.
func TestRunWithoutADisk(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	for _, tc := range []struct {
		args       []string
		want, fail string
	}{
		{nil, "capsem-base\ncapsem-upper\n", ""},
		{[]string{"--base", "minimal"}, "capsem-upper\n", ""},
		{[]string{"--base", "minimal", "--disk-gb", "0"}, "", ""},
		{[]string{"--disk-gb", "0"}, "", `base "full" needs a disk`},
	} {
		args := append(tc.args, "--", "sh", "-c", "for d in /sys/block/vd*; do [ -e $d/serial ] && echo $(cat $d/serial); done | sort")
		stdout, stderr, code := testkit.CapsemRunIn(t, env, args...)
		if tc.fail != "" {
			if code == 0 || !strings.Contains(stderr, tc.fail) {
				t.Errorf("capsem run %v: exit %d, stderr %s; want a refusal naming %q", tc.args, code, stderr, tc.fail)
			}
			continue
		}
		if code != 0 || stdout != tc.want {
			t.Errorf("capsem run %v: exit %d, disks %q, want %q; stderr %s", tc.args, code, stdout, tc.want, stderr)
		}
	}
}

// TestRunSpeaksToPeople: with text logs (a terminal's default) capsem run
// says what it does in short lines, no JSON; a pipe gets JSON lines.
func TestRunSpeaksToPeople(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	cmd := exec.Command(testkit.CapsemBinary(t), "--log-format", "text", "run", "--no-autodetect", "--", "true")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("capsem run: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	ready := false
	for _, l := range lines {
		if !strings.HasPrefix(l, "capsem: ") || strings.Contains(l, `{"`) {
			t.Errorf("not a line for people: %q", l)
		}
		ready = ready || strings.HasPrefix(l, "capsem: VM ready (vm vm-")
	}
	if !ready {
		t.Fatalf("no VM ready line:\n%s", out)
	}
}
