package qemu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/vmm"
)

// accelFixture is a backend whose QEMU is this test binary behaving as
// mode (fakeAccel), with a kernel file to hash, a verdict cache and a log
// of every QEMU run.
type accelFixture struct {
	b      *Backend
	files  BootFiles
	runLog string
	dir    string
}

func newAccelFixture(t *testing.T, mode string, env map[string]string) *accelFixture {
	t.Setenv(fakeEnv, mode)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	kernel := filepath.Join(dir, "vmlinux")
	if err := os.WriteFile(kernel, []byte("kernel "+mode), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &accelFixture{dir: dir, runLog: filepath.Join(dir, "runs.log"),
		files: BootFiles{Kernel: kernel, Initramfs: filepath.Join(dir, "initramfs.cpio")}}
	t.Setenv(fakeLogEnv, f.runLog)
	f.b = &Backend{Binary: exe, Log: testLogger(t), OpenKVM: func() error { return nil },
		Getenv: func(k string) string { return env[k] }, VerdictPath: filepath.Join(dir, "accel.json"),
		ProbeTimeout: 300 * time.Millisecond, StopGrace: 300 * time.Millisecond}
	return f
}

// probes counts the probe boots the fake ran.
func (f *accelFixture) probes(t *testing.T) int { return f.runs(t, Marker) }

// runs counts the fake's runs whose argv holds s.
func (f *accelFixture) runs(t *testing.T, s string) int {
	b, err := os.ReadFile(f.runLog)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), s)
}

// TestAccelDecision: each kind of /dev/kvm leads to its verdict, its
// reason, its cache entry, and a VM that runs under the chosen accelerator.
func TestAccelDecision(t *testing.T) {
	for _, c := range []struct {
		mode       string
		wantKVM    bool
		wantCPU    string
		wantReason []string
		wantProbes int
	}{
		{"pvm", false, "", []string{"KVM present but cannot run this kernel", "-cpu host: QEMU aborted: failed to set MSR 0x10a",
			"-cpu host,-arch-capabilities: the guest printed nothing from userspace", "Probing EDD"}, 2},
		{"kvm-hang", false, "", []string{"KVM present but cannot run this kernel", "-cpu host: the guest printed nothing"}, 1},
		{"nested-msr", true, "host,-arch-capabilities", []string{"KVM proven", "-cpu host,-arch-capabilities"}, 2},
		{"kvm-works", true, "host", []string{"KVM proven", "-cpu host"}, 1},
	} {
		t.Run(c.mode, func(t *testing.T) {
			f := newAccelFixture(t, c.mode, nil)
			ctx := context.Background()
			a, err := f.b.ChooseAccelFor(ctx, "", f.files)
			if err != nil {
				t.Fatal(err)
			}
			wantAccel, wantCPU := vmm.AccelTCG, TCGCPU
			if c.wantKVM {
				wantAccel, wantCPU = vmm.AccelKVM, c.wantCPU
			}
			if a.Name != wantAccel || a.CPU != wantCPU || a.Forced {
				t.Fatalf("chose %+v, want %s -cpu %s", a, wantAccel, wantCPU)
			}
			for _, w := range c.wantReason {
				if !strings.Contains(a.Reason, w) {
					t.Errorf("reason %q lacks %q", a.Reason, w)
				}
			}
			if !c.wantKVM && !strings.HasSuffix(a.Reason, "; using TCG") {
				t.Errorf("reason %q does not say TCG is used", a.Reason)
			}
			if n := f.probes(t); n != c.wantProbes {
				t.Errorf("%d probe boots, want %d", n, c.wantProbes)
			}
			// Cached: the next decision (another VM, another process)
			// boots nothing.
			vs := ReadVerdicts(f.b.VerdictPath)
			if len(vs) != 1 || vs[0].KVM != c.wantKVM || vs[0].CPU != c.wantCPU || vs[0].BootID != hostBootID() ||
				vs[0].KernelSHA256 == "" || !strings.Contains(vs[0].QEMUVersion, "7.2.99") {
				t.Fatalf("cache holds %+v", vs)
			}
			again, err := (&Backend{Binary: f.b.Binary, OpenKVM: f.b.OpenKVM, VerdictPath: f.b.VerdictPath, Getenv: f.b.Getenv}).ChooseAccelFor(ctx, "", f.files)
			if err != nil || again != a {
				t.Fatalf("second decision %+v, %v; want %+v", again, err, a)
			}
			if n := f.probes(t); n != c.wantProbes {
				t.Errorf("the cached verdict was proven again: %d probe boots", n)
			}
			// Nor does it ask QEMU its version again (or hash the
			// kernel): the identities vouch for both.
			if n := f.runs(t, "--version"); n != 1 {
				t.Errorf("QEMU was asked its version %d times, want once", n)
			}
			// And a VM created now runs under the chosen accelerator.
			spec := fakeSpec(f.dir)
			spec.Kernel, spec.Initramfs = f.files.Kernel, f.files.Initramfs
			vm, err := f.b.Create(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			m := vm.(*Machine)
			if m.AccelChoice() != a || argAfter(m.Argv(), "-accel") != wantAccel || argAfter(m.Argv(), "-cpu") != wantCPU {
				t.Fatalf("machine %+v argv %q", m.AccelChoice(), m.Argv())
			}
			if err := m.Start(ctx); err != nil {
				t.Fatalf("the VM under %s did not start: %v", wantAccel, err)
			}
			if err := m.Stop(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAccelProvedAgain: a verdict is for one host boot, QEMU and kernel;
// any other gets its own proof.
func TestAccelProvedAgain(t *testing.T) {
	f := newAccelFixture(t, "kvm-works", nil)
	ctx := context.Background()
	if _, err := f.b.ChooseAccelFor(ctx, "", f.files); err != nil {
		t.Fatal(err)
	}
	// An earlier host boot's verdict does not count.
	vs := ReadVerdicts(f.b.VerdictPath)
	vs[0].BootID = "an-earlier-boot"
	if err := writeVerdict(f.b.VerdictPath, verdictFile{}, vs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.ChooseAccelFor(ctx, "", f.files); err != nil {
		t.Fatal(err)
	}
	if n := f.probes(t); n != 2 {
		t.Fatalf("%d probes after the boot id changed, want 2", n)
	}
	// A new kernel (same path, new bytes) is proven too, and both verdicts
	// are kept.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(f.files.Kernel, []byte("another kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.ChooseAccelFor(ctx, "", f.files); err != nil {
		t.Fatal(err)
	}
	if n := f.probes(t); n != 3 {
		t.Fatalf("%d probes after the kernel changed, want 3", n)
	}
	if vs := ReadVerdicts(f.b.VerdictPath); len(vs) != 3 {
		t.Fatalf("%d verdicts cached, want 3 (newest first): %+v", len(vs), vs)
	}
	// The same bytes written again (a new identity) need no new proof.
	if err := os.WriteFile(f.files.Kernel, []byte("another kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.b.ChooseAccelFor(ctx, "", f.files); err != nil {
		t.Fatal(err)
	}
	if n := f.probes(t); n != 3 {
		t.Fatalf("%d probes for the same kernel bytes, want 3", n)
	}
	// ...and its new identity is recorded, so the next decision does not
	// hash the kernel again.
	id, err := statID(f.files.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	if vs := ReadVerdicts(f.b.VerdictPath); vs[0].KernelFile != id {
		t.Fatalf("the cache keeps the old identity %+v, the kernel's is %+v", vs[0].KernelFile, id)
	}
}

func TestAccelForced(t *testing.T) {
	ctx := context.Background()
	// tcg skips the proof.
	f := newAccelFixture(t, "pvm", map[string]string{envvars.Accel.Name(): "tcg"})
	a, err := f.b.ChooseAccelFor(ctx, "", f.files)
	if err != nil || a.Name != vmm.AccelTCG || !a.Forced || !strings.Contains(a.Reason, envvars.Accel.Name()) {
		t.Fatalf("CAPSEM_ACCEL=tcg: %+v %v", a, err)
	}
	if n := f.probes(t); n != 0 {
		t.Fatalf("forced TCG still probed KVM %d times", n)
	}
	// kvm fails with the proof's reason when KVM cannot run the guest...
	f = newAccelFixture(t, "pvm", map[string]string{envvars.Accel.Name(): "kvm"})
	_, err = f.b.ChooseAccelFor(ctx, "", f.files)
	if err == nil || !strings.Contains(err.Error(), "KVM forced by CAPSEM_ACCEL") || !strings.Contains(err.Error(), "failed to set MSR 0x10a") {
		t.Fatalf("CAPSEM_ACCEL=kvm on a PVM host: %v", err)
	}
	// ...and so does Create, leaving nothing behind.
	spec := fakeSpec(f.dir)
	spec.Kernel = f.files.Kernel
	if _, err := f.b.Create(ctx, spec); err == nil || !strings.Contains(err.Error(), "MSR 0x10a") {
		t.Fatalf("Create with CAPSEM_ACCEL=kvm on a PVM host: %v", err)
	}
	// The spec's choice wins over the environment's.
	if a, err := f.b.ChooseAccelFor(ctx, vmm.AccelTCG, f.files); err != nil || a.Name != vmm.AccelTCG || !strings.Contains(a.Reason, "spec") {
		t.Fatalf("spec tcg over CAPSEM_ACCEL=kvm: %+v %v", a, err)
	}
	f = newAccelFixture(t, "kvm-works", map[string]string{envvars.Accel.Name(): "kvm"})
	if a, err := f.b.ChooseAccelFor(ctx, "", f.files); err != nil || a.Name != vmm.AccelKVM || a.CPU != "host" || !a.Forced {
		t.Fatalf("CAPSEM_ACCEL=kvm on a working KVM: %+v %v", a, err)
	}
	f = newAccelFixture(t, "kvm-works", map[string]string{envvars.Accel.Name(): "hvf"})
	if _, err := f.b.ChooseAccelFor(ctx, "", f.files); err == nil || !strings.Contains(err.Error(), `"hvf"`) {
		t.Fatalf("CAPSEM_ACCEL=hvf: %v", err)
	}
}

func TestAccelWithoutDevice(t *testing.T) {
	f := newAccelFixture(t, "kvm-works", nil)
	f.b.OpenKVM = func() error { return os.ErrNotExist }
	a, err := f.b.ChooseAccelFor(context.Background(), "", f.files)
	if err != nil || a.Name != vmm.AccelTCG || !strings.Contains(a.Reason, "KVM not available") {
		t.Fatalf("no /dev/kvm: %+v %v", a, err)
	}
	if f.probes(t) != 0 {
		t.Fatal("probed without a device")
	}
	if _, err := os.Stat(f.b.VerdictPath); !os.IsNotExist(err) {
		t.Fatalf("a verdict was cached without a device: %v", err)
	}
	f.b.Getenv = func(string) string { return "kvm" }
	if _, err := f.b.ChooseAccelFor(context.Background(), "", f.files); err == nil || !strings.Contains(err.Error(), "KVM not available") {
		t.Fatalf("CAPSEM_ACCEL=kvm without a device: %v", err)
	}
}

// TestDemoteKVM: a VM that fails under a proven KVM turns the verdict to
// TCG for the VMs after it.
func TestDemoteKVM(t *testing.T) {
	f := newAccelFixture(t, "kvm-works", nil)
	ctx := context.Background()
	if a, _ := f.b.ChooseAccelFor(ctx, "", f.files); a.Name != vmm.AccelKVM {
		t.Fatalf("chose %+v", a)
	}
	if err := f.b.DemoteKVM(ctx, f.files, errors.New("qemu-system-x86_64: error: KVM internal error. Suberror: 1")); err != nil {
		t.Fatal(err)
	}
	a, err := f.b.ChooseAccelFor(ctx, "", f.files)
	if err != nil || a.Name != vmm.AccelTCG || !strings.Contains(a.Reason, "KVM passed the probe but a VM did not start") ||
		!strings.Contains(a.Reason, "KVM internal error") {
		t.Fatalf("after the demotion: %+v %v", a, err)
	}
	if f.probes(t) != 1 {
		t.Fatalf("%d probes, want 1", f.probes(t))
	}
}

// TestConcurrentDecisionsProveOnce: VMs starting together wait for one
// probe instead of each running their own.
func TestConcurrentDecisionsProveOnce(t *testing.T) {
	f := newAccelFixture(t, "kvm-hang", nil)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			a, err := f.b.ChooseAccelFor(context.Background(), "", f.files)
			if err == nil && a.Name != vmm.AccelTCG {
				err = errors.New("chose " + a.Name)
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := f.probes(t); n != 1 {
		t.Fatalf("%d probes for 4 concurrent decisions, want 1", n)
	}
}

func TestSummarizeQEMUError(t *testing.T) {
	for in, want := range map[string]string{
		"qemu exited (signal: aborted): qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69\nqemu-system-x86_64: kvm.c:3183: Assertion failed": "QEMU aborted: failed to set MSR 0x10a to 0x69",
		"x: KVM internal error. Suberror: 1\nemulation failure": "QEMU: KVM internal error. Suberror: 1",
		"the guest printed nothing from userspace within 8s":    "the guest printed nothing from userspace within 8s",
	} {
		if got := summarizeQEMUError(in); got != want {
			t.Errorf("summarizeQEMUError(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOpenKVMHere(t *testing.T) {
	// Whatever this host has, the check answers and the error (if any)
	// names the device.
	if err := OpenKVM(); err != nil && !strings.Contains(err.Error(), "/dev/kvm") {
		t.Fatalf("OpenKVM: %v", err)
	} else {
		t.Logf("OpenKVM: %v", err)
	}
}

// TestAccelCacheDamaged: a cache file that is not a verdict file is proven
// again and replaced, never trusted.
func TestAccelCacheDamaged(t *testing.T) {
	f := newAccelFixture(t, "kvm-works", nil)
	for _, junk := range []string{"", "{", `{"verdicts":[{"format":1,"kvm":true,"cpu":"host; rm -rf /"}]}`, "\x00\xff"} {
		if err := os.WriteFile(f.b.VerdictPath, []byte(junk), 0o600); err != nil {
			t.Fatal(err)
		}
		before := f.probes(t)
		a, err := f.b.ChooseAccelFor(context.Background(), "", f.files)
		if err != nil || a.Name != vmm.AccelKVM || a.CPU != "host" {
			t.Fatalf("cache %q: %+v %v", junk, a, err)
		}
		if f.probes(t) != before+1 {
			t.Fatalf("cache %q was trusted", junk)
		}
		if vs := ReadVerdicts(f.b.VerdictPath); len(vs) == 0 || vs[0].BootID != hostBootID() {
			t.Fatalf("cache %q not replaced: %+v", junk, vs)
		}
	}
}
