package doctor_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/guestfs"
)

// runDoctor runs `capsem doctor --json ARGS...` with env added and returns
// its results by "group/name", the summary and the exit status.
func runDoctor(t *testing.T, env []string, args ...string) (map[string]doctor.Result, doctor.Summary, int, string) {
	t.Helper()
	all := append([]string{"--log-level", "warn", "doctor", "--json", "--guest-binary", testkit.GuestBinary(t)}, args...)
	cmd := exec.Command(testkit.CapsemBinary(t), all...)
	cmd.Env = append(append(os.Environ(), "CAPSEM_HOME="+testkit.CapsemHome(t), "CAPSEM_CACHE_DIR="+testkit.CacheDir(t)), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("capsem doctor: %v", err)
	}
	results := map[string]doctor.Result{}
	var sum *doctor.Summary
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		r, s, ok := doctor.ParseLine(sc.Bytes())
		switch {
		case !ok:
			t.Fatalf("not a doctor line: %q (stderr %s)", sc.Text(), errb.String())
		case r != nil:
			results[r.Group+"/"+r.Name] = *r
		default:
			sum = s
		}
	}
	if sum == nil {
		t.Fatalf("no summary (exit %d): stderr %s", code, errb.String())
	}
	return results, *sum, code, errb.String()
}

func wantFail(t *testing.T, results map[string]doctor.Result, check, detail, hint string) {
	t.Helper()
	r, ok := results[check]
	if !ok || r.Status != doctor.Fail || !strings.Contains(r.Detail, detail) || !strings.Contains(r.Hint, hint) {
		t.Errorf("%s: %+v; want a failure naming %q with the fix %q", check, r, detail, hint)
	}
}

// TestDoctorPassesHere: every group, a real VM included, passes on this
// machine (warnings allowed: a host without a working KVM warns), with the
// everything reference server configured beside the builtin.
func TestDoctorPassesHere(t *testing.T) {
	testkit.SharedAssets(t)    // built, as after a first capsem run
	testkit.SharedRootImage(t) // and the full root, as after a first VM of it
	cmd, args := testkit.EverythingServer(t)
	cfg := filepath.Join(t.TempDir(), "policy.toml")
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	os.WriteFile(cfg, []byte(fmt.Sprintf("[[mcp.servers]]\nname = \"everything\"\ncommand = %q\nargs = [%s]\nconnect_timeout_secs = 120\n",
		cmd, strings.Join(quoted, ", "))), 0o600)
	results, sum, code, stderr := runDoctor(t, nil, "--config", cfg, "--no-autodetect")
	if code != 0 || sum.Result != "PASS" || sum.Fail != 0 {
		for k, r := range results {
			if r.Status != doctor.OK {
				t.Logf("%s: %s %s (%s)", k, r.Status, r.Detail, r.Hint)
			}
		}
		t.Fatalf("exit %d, summary %+v\nstderr %s", code, sum, stderr)
	}
	groups := map[string]bool{}
	for k, r := range results {
		groups[r.Group] = true
		// Only the accelerator may warn here: a host whose KVM is absent
		// or cannot run the guest runs VMs under TCG.
		if r.Status != doctor.OK && r.Group != "accel" {
			t.Errorf("%s: %s %s (%s)", k, r.Status, r.Detail, r.Hint)
		}
	}
	for _, g := range []string{"accel", "qemu", "assets", "storage", "sandbox", "config", "gateway", "service", "vm"} {
		if !groups[g] {
			t.Errorf("group %s reported nothing", g)
		}
	}
	if r := results["gateway/server everything"]; r.Status != doctor.OK || !strings.Contains(r.Detail, "stdio") {
		t.Errorf("the everything server: %+v", r)
	}
	if r := results["vm/guest-doctor"]; r.Status != doctor.OK || results["vm/mcp/relay"].Status != doctor.OK {
		t.Errorf("the VM's doctor: %+v %+v", r, results["vm/mcp/relay"])
	}
	if r := results["accel/kvm-proven"]; r.Status == doctor.Warn && !strings.Contains(r.Hint, "running under TCG") {
		t.Errorf("a host without KVM is not told what it costs: %+v", r)
	}
}

// TestDoctorNamesFaults: each fault made on purpose fails its check with
// its fix, and the doctor exits 1.
func TestDoctorNamesFaults(t *testing.T) {
	t.Run("no QEMU on PATH", func(t *testing.T) {
		results, _, code, _ := runDoctor(t, []string{"PATH=" + t.TempDir()}, "-k", "qemu", "-k", "accel")
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantFail(t, results, "qemu/binary", "qemu-system-x86_64 not found", "install qemu-system-x86")
		wantFail(t, results, "accel/tcg", "cannot list", "install qemu-system-x86")
	})
	t.Run("a policy file with a bad key", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "bad.toml")
		os.WriteFile(cfg, []byte("[mcp]\ndefault = \"allow\"\nbogus_key = 1\n"), 0o600)
		results, _, code, _ := runDoctor(t, nil, "-k", "config", "--config", cfg, "--no-autodetect")
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantFail(t, results, "config/policy", "bogus_key", "fix the file")
		if !strings.Contains(results["config/policy"].Detail, cfg) {
			t.Errorf("the error does not name the file: %+v", results["config/policy"])
		}
	})
	t.Run("an unwritable CAPSEM_HOME", func(t *testing.T) {
		home := filepath.Join(t.TempDir(), "home")
		os.MkdirAll(home, 0o700)
		args := []string{testkit.CapsemBinary(t), "--log-level", "warn", "doctor", "--json", "-k", "storage"}
		var cmd *exec.Cmd
		if os.Geteuid() == 0 {
			// Root writes through any mode: a read-only bind mount in a
			// mount namespace of the doctor's own.
			cmd = exec.Command("unshare", append([]string{"-m", "--propagation", "private", "sh", "-c",
				`mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"`, home}, args...)...)
		} else {
			os.Chmod(home, 0o500)
			defer os.Chmod(home, 0o700)
			cmd = exec.Command(args[0], args[1:]...)
		}
		cmd.Env = append(os.Environ(), "CAPSEM_HOME="+home)
		out, err := cmd.Output()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("exit %v, want 1: %s", err, out)
		}
		results := map[string]doctor.Result{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if r, _, ok := doctor.ParseLine([]byte(line)); ok && r != nil {
				results[r.Group+"/"+r.Name] = *r
			}
		}
		wantFail(t, results, "storage/home-writable", "not writable", "CAPSEM_HOME")
	})
	t.Run("a corrupt asset", func(t *testing.T) {
		home, a := testkit.PrivateAssets(t)
		initramfs := a.Initramfs
		data, err := os.ReadFile(initramfs)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/3] ^= 0x55
		if err := os.WriteFile(initramfs, data, 0o644); err != nil {
			t.Fatal(err)
		}
		results, _, code, _ := runDoctor(t, []string{"CAPSEM_HOME=" + home}, "-k", "assets")
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantFail(t, results, "assets/hashes", guestfs.FileInitramfs, "rebuilds it")
	})
	t.Run("a server that does not connect", func(t *testing.T) {
		cfg := filepath.Join(t.TempDir(), "policy.toml")
		os.WriteFile(cfg, []byte("[[mcp.servers]]\nname = \"broken\"\ncommand = \"/nonexistent/mcp-server\"\nconnect_timeout_secs = 10\n"), 0o600)
		results, _, code, _ := runDoctor(t, nil, "-k", "gateway", "--config", cfg, "--no-autodetect")
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		wantFail(t, results, "gateway/server broken", "did not connect", cfg)
		if results["gateway/gateway"].Status != doctor.OK || results["gateway/server builtin"].Status != doctor.OK {
			t.Errorf("the broken server took the gateway down: %+v %+v", results["gateway/gateway"], results["gateway/server builtin"])
		}
	})
}

// TestDoctorServiceGroup: with no service the group passes and says one
// starts on first use; with one serving it names it; a VM whose process
// died warns with the VM and the fix; a run directory open to others warns.
func TestDoctorServiceGroup(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	extra := []string{"CAPSEM_RUN_DIR=" + runDir, "CAPSEM_NO_AUTODETECT=1"}
	capsem := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(testkit.CapsemBinary(t), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("capsem %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	results, _, code, _ := runDoctor(t, extra, "-k", "service")
	if code != 0 || results["service/serving"].Status != doctor.OK || !strings.Contains(results["service/serving"].Detail, "starts one") {
		t.Fatalf("no service: exit %d %+v", code, results)
	}
	capsem("create", "dies", "--ram-mb", "512", "--cpus", "1")
	var info struct{ PID int }
	if err := json.Unmarshal([]byte(capsem("info", "dies", "--json")), &info); err != nil || info.PID == 0 {
		t.Fatalf("info: %v", err)
	}
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(capsem("ls"), "defunct") {
		if time.Now().After(deadline) {
			t.Fatal("the killed VM never went defunct")
		}
		time.Sleep(50 * time.Millisecond)
	}
	os.Chmod(runDir, 0o755)
	results, _, code, _ = runDoctor(t, extra, "-k", "service")
	if r := results["service/serving"]; r.Status != doctor.OK || !strings.Contains(r.Detail, "serving on") {
		t.Errorf("serving: %+v", r)
	}
	if r := results["service/vms"]; r.Status != doctor.Warn || !strings.Contains(r.Detail, "1 defunct") || !strings.Contains(r.Hint, "capsem logs vm-") {
		t.Errorf("vms: %+v", r)
	}
	if r := results["service/run-dir"]; r.Status != doctor.Warn || !strings.Contains(r.Detail, "mode 0755") {
		t.Errorf("run-dir: %+v", r)
	}
	if code != 0 {
		t.Errorf("warnings alone exit %d, want 0", code)
	}
}
