package run_test

import (
	"encoding/json"
	"fmt"
	"os"
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
	name := fmt.Sprintf("streams-%d", time.Now().UnixNano())
	stdout, stderr, code := testkit.CapsemRun(t, "--name", name, "--env", "GREETING=hello", "--", "sh", "-c", `echo "$GREETING from $(hostname)"; echo to-stderr >&2; exit 3`)
	if code != 3 {
		t.Fatalf("exit code %d, want 3\nstdout %s\nstderr %s", code, stdout, stderr)
	}
	if stdout != "hello from "+name+"\n" {
		t.Errorf("stdout %q", stdout)
	}
	if !strings.Contains(stderr, "to-stderr") {
		t.Errorf("stderr %q", stderr)
	}
	logs, _ := filepath.Glob(filepath.Join(testkit.CapsemHome(t), "run", "sessions", "*", "process.log"))
	for _, l := range logs {
		if b, err := os.ReadFile(l); err == nil && strings.Contains(string(b), `"vm":"`+name+`"`) {
			t.Errorf("the ephemeral VM's session directory was left behind: %s", filepath.Dir(l))
		}
	}
	if _, _, code := testkit.CapsemRun(t, "--env", "NOEQUALS", "--", "true"); code == 0 {
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

// TestRunReportsAProcessThatDiesBeforeReady: the VM process refuses a bad
// configuration before booting anything; `capsem run` learns it from the
// readiness pipe closing, at once, and shows the process's reason.
func TestRunReportsAProcessThatDiesBeforeReady(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(cfg, []byte("[mcp]\ndefault = \"perhaps\"\n"), 0o600)
	start := time.Now()
	_, stderr, code := testkit.CapsemRun(t, "--config", cfg, "--", "true")
	if code == 0 || !strings.Contains(stderr, `"perhaps" is not a decision`) {
		t.Fatalf("exit %d, stderr %q: want a failure with the process's reason", code, stderr)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v to report a process that failed before booting", d)
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
