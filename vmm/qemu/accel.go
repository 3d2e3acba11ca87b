package qemu

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/filelock"
	"github.com/capsem/capsem/vmm"
)

// Accel is the accelerator a VM runs with; CPU is QEMU's -cpu value.
type Accel = vmm.Accel

// TCGCPU is the CPU model under TCG: every feature TCG can emulate, so the
// guest kernel picks its fast paths (e.g. RDRAND for early entropy), but
// for ERMS and FSRM. With them the guest's kernel and libc copy memory
// with "rep movsb", which TCG runs a byte per step; without them they
// copy in words and vectors, several times faster under emulation (make
// bench's data figures; under KVM the host's CPU is used as it is).
const TCGCPU = "max,-erms,-fsrm"

// AccelArgs are the accelerator's arguments for QEMU's command line.
func AccelArgs(a Accel) []string { return []string{"-accel", a.Name, "-cpu", a.CPU} }

// AccelKernelParams are what the guest kernel's command line needs under
// the accelerator ("" or TCGKernelParams).
func AccelKernelParams(a Accel) string {
	if a.Name == vmm.AccelTCG {
		return TCGKernelParams
	}
	return ""
}

// tcg is the TCG choice with its reason.
func tcg(reason string, forced bool) Accel {
	return Accel{Name: vmm.AccelTCG, CPU: TCGCPU, Reason: reason, Forced: forced}
}

// KVM is proven, not assumed: /dev/kvm opening read-write says nothing about
// whether it can run this kernel. On hosts whose /dev/kvm is PVM nested
// virtualization (dmesg: "kvm-pvm: loaded"), which runs only guest kernels
// built for it, QEMU either aborts at the first vCPU ("failed to set MSR
// 0x10a") or runs a stock kernel that never gets past its first steps. So
// before the first KVM VM the guest's own kernel and initramfs boot under
// KVM to a marker printed by userspace (probeTimeout), for each CPU model
// below in turn; the verdict is cached per host boot, QEMU binary and
// version, and kernel (Verdict).
//
// kvmCPUs are the KVM CPU models, tried in order; a model after the first
// is tried only when the one before failed with its After text, the
// failure it exists for.
var kvmCPUs = []struct{ Model, After string }{
	// The host's own CPU: the fastest, and what a /dev/kvm that is fine
	// runs.
	{Model: "host"},
	// Nested hosts that refuse the guest's write of IA32_ARCH_CAPABILITIES
	// (MSR 0x10a), which QEMU asserts on: the same CPU without that
	// feature. (On PVM it starts but the kernel still hangs, and the
	// verdict is TCG.)
	{Model: "host,-arch-capabilities", After: "failed to set MSR 0x10a"},
}

// probeTimeout bounds one probe boot: under a KVM that works the guest
// reaches userspace in well under a second.
const probeTimeout = 8 * time.Second

// verdictFormat is bumped whenever what a verdict means changes.
const verdictFormat = 1

// Verdict is the cached outcome of proving KVM on this host with a kernel.
type Verdict struct {
	Format       int       `json:"format"`
	BootID       string    `json:"boot_id"`
	QEMU         string    `json:"qemu"`
	QEMUVersion  string    `json:"qemu_version"`
	QEMUFile     fileID    `json:"qemu_file"`
	Kernel       string    `json:"kernel"`
	KernelSHA256 string    `json:"kernel_sha256"`
	KernelFile   fileID    `json:"kernel_file"`
	KVM          bool      `json:"kvm"`
	CPU          string    `json:"cpu,omitempty"` // the model that ran the guest, when KVM
	Reason       string    `json:"reason"`
	ProbedAt     time.Time `json:"probed_at"`
	ProbeMS      int64     `json:"probe_ms"`
}

// fileID identifies a file's content cheaply: if none of these changed,
// neither did its bytes (the same test guestfs's sum cache uses).
type fileID struct {
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime_ns"`
	CTime int64  `json:"ctime_ns"`
	Inode uint64 `json:"inode"`
}

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileID{Size: st.Size, MTime: st.Mtim.Nano(), CTime: st.Ctim.Nano(), Inode: st.Ino}, nil
}

// verdictFile is the cache: the verdicts of the kernels and QEMUs used on
// this host, newest first.
type verdictFile struct {
	Verdicts []Verdict `json:"verdicts"`
}

// maxVerdicts bounds the cache (one entry per kernel and QEMU in use).
const maxVerdicts = 16

// BootFiles are what a probe boots: the guest's kernel and initramfs, which
// must have a busybox /bin/sh (guestfs's always do), and the firmware.
type BootFiles struct {
	Kernel    string
	Initramfs string
	Firmware  string // "" means QEMU's default
}

// ChooseAccel decides the accelerator for the VM of spec (see ChooseAccelFor).
func (b *Backend) ChooseAccel(ctx context.Context, spec vmm.Spec) (Accel, error) {
	return b.ChooseAccelFor(ctx, spec.Accel, bootFiles(spec))
}

// ChooseAccelFor decides the accelerator for a VM booting files. specAccel
// ("", "kvm", "tcg") wins over CAPSEM_ACCEL; "tcg" skips the proof and "kvm"
// fails with the proof's reason when KVM cannot run the guest. The
// decision otherwise is KVM when proven, else TCG with the reason.
func (b *Backend) ChooseAccelFor(ctx context.Context, specAccel string, files BootFiles) (Accel, error) {
	forced, source := specAccel, "the VM spec"
	if forced == "" {
		if env := b.getenv(envvars.Accel.Name()); env != "" {
			forced, source = env, envvars.Accel.Name()
		}
	}
	switch forced {
	case vmm.AccelTCG:
		return tcg("TCG: forced by "+source, true), nil
	case vmm.AccelKVM, "":
	default:
		return Accel{}, fmt.Errorf("qemu: accelerator %q from %s: want %q or %q", forced, source, vmm.AccelKVM, vmm.AccelTCG)
	}
	v, err := b.Verdict(ctx, files)
	if err != nil {
		return Accel{}, err
	}
	switch {
	case v.KVM && forced != "":
		return Accel{Name: vmm.AccelKVM, CPU: v.CPU, Reason: "KVM: forced by " + source + " (" + v.Reason + ")", Forced: true}, nil
	case v.KVM:
		return Accel{Name: vmm.AccelKVM, CPU: v.CPU, Reason: v.Reason}, nil
	case forced != "":
		return Accel{}, fmt.Errorf("qemu: KVM forced by %s but it cannot run this guest: %s", source, v.Reason)
	default:
		return tcg(v.Reason+"; using TCG", false), nil
	}
}

// bootFiles are the files of spec the accelerator's proof boots.
func bootFiles(spec vmm.Spec) BootFiles {
	return BootFiles{Kernel: spec.Kernel, Initramfs: spec.Initramfs, Firmware: spec.Firmware}
}

// DemoteAccel is DemoteKVM for the files of spec (vmm.AccelBackend).
func (b *Backend) DemoteAccel(ctx context.Context, spec vmm.Spec, why error) error {
	return b.DemoteKVM(ctx, bootFiles(spec), why)
}

// Verdict returns the cached verdict on KVM for files on this host, proving
// it first when there is none for this host boot, QEMU and kernel. One
// probe runs at a time per cache file; a caller that waited for another's
// probe gets its verdict.
func (b *Backend) Verdict(ctx context.Context, files BootFiles) (Verdict, error) {
	if err := b.openKVM(); err != nil {
		// No device: nothing to prove, and nothing worth caching.
		return Verdict{Format: verdictFormat, Reason: fmt.Sprintf("KVM not available (%v)", err), Kernel: files.Kernel}, nil
	}
	if b.VerdictPath == "" {
		key, err := b.verdictKey(files, nil)
		if err != nil {
			return Verdict{}, err
		}
		return b.prove(ctx, files, key), nil
	}
	unlock, err := filelock.Lock(ctx, b.VerdictPath+".lock")
	if err != nil {
		return Verdict{}, err
	}
	defer unlock()
	cache := readVerdicts(b.VerdictPath)
	key, err := b.verdictKey(files, cache.Verdicts)
	if err != nil {
		return Verdict{}, err
	}
	for _, v := range cache.Verdicts {
		if !sameKey(v, key) {
			continue
		}
		if v.Kernel != key.Kernel || v.KernelFile != key.KernelFile || v.QEMUFile != key.QEMUFile {
			// The same bytes under a new path or identity (new assets of
			// the same kernel): recorded, so the next decision need not
			// hash the kernel again.
			v.Kernel, v.KernelFile, v.QEMUFile = key.Kernel, key.KernelFile, key.QEMUFile
			if err := writeVerdict(b.VerdictPath, cache, v); err != nil {
				b.log().Warn("updating the accelerator verdict", "err", err)
			}
		}
		return v, nil
	}
	v := b.prove(ctx, files, key)
	if ctx.Err() != nil {
		return v, nil // a probe cut short proves nothing: not cached
	}
	return v, writeVerdict(b.VerdictPath, cache, v)
}

// DemoteKVM records that a VM of files did not start under KVM although the
// probe passed (why says how it failed), so later VMs run under TCG.
func (b *Backend) DemoteKVM(ctx context.Context, files BootFiles, why error) error {
	if b.VerdictPath == "" {
		return nil
	}
	unlock, err := filelock.Lock(ctx, b.VerdictPath+".lock")
	if err != nil {
		return err
	}
	defer unlock()
	cache := readVerdicts(b.VerdictPath)
	key, err := b.verdictKey(files, cache.Verdicts)
	if err != nil {
		return err
	}
	key.KVM, key.CPU = false, ""
	key.Reason = "KVM passed the probe but a VM did not start under it (" + summarizeQEMUError(why.Error()) + ")"
	key.ProbedAt = time.Now().UTC()
	return writeVerdict(b.VerdictPath, cache, key)
}

// verdictKey is a verdict with the key fields filled in: the host's boot
// id, QEMU's path, identity and version, the kernel's path, identity and
// hash. Version and hash come from a known verdict when the file's identity
// is the one it recorded, and are computed otherwise.
func (b *Backend) verdictKey(files BootFiles, known []Verdict) (Verdict, error) {
	bin, err := b.binaryPath()
	if err != nil {
		return Verdict{}, err
	}
	v := Verdict{Format: verdictFormat, BootID: hostBootID(), QEMU: bin, Kernel: files.Kernel}
	if v.QEMUFile, err = statID(bin); err != nil {
		return Verdict{}, fmt.Errorf("qemu: %w", err)
	}
	if v.KernelFile, err = statID(files.Kernel); err != nil {
		return Verdict{}, fmt.Errorf("qemu: the guest kernel: %w", err)
	}
	for _, k := range known {
		if k.QEMU == v.QEMU && k.QEMUFile == v.QEMUFile && v.QEMUVersion == "" {
			v.QEMUVersion = k.QEMUVersion
		}
		if k.Kernel == v.Kernel && k.KernelFile == v.KernelFile && v.KernelSHA256 == "" {
			v.KernelSHA256 = k.KernelSHA256
		}
	}
	if v.QEMUVersion == "" {
		if v.QEMUVersion, err = Version(bin); err != nil {
			return Verdict{}, err
		}
	}
	if v.KernelSHA256 == "" {
		if v.KernelSHA256, err = sha256File(files.Kernel); err != nil {
			return Verdict{}, fmt.Errorf("qemu: hashing the guest kernel: %w", err)
		}
	}
	return v, nil
}

func sameKey(a, b Verdict) bool {
	return a.Format == b.Format && a.BootID == b.BootID && a.QEMU == b.QEMU && a.QEMUVersion == b.QEMUVersion &&
		a.KernelSHA256 == b.KernelSHA256
}

// prove boots files under KVM with each CPU model in turn (kvmCPUs) and
// returns key completed with the outcome.
func (b *Backend) prove(ctx context.Context, files BootFiles, key Verdict) Verdict {
	t := time.Now()
	var failures []string
	last := ""
	for i, c := range kvmCPUs {
		if i > 0 && !strings.Contains(last, c.After) {
			continue
		}
		timeout := b.ProbeTimeout
		if timeout <= 0 {
			timeout = probeTimeout
		}
		boot := MarkerBoot{Binary: key.QEMU, Files: files, Accel: Accel{Name: vmm.AccelKVM, CPU: c.Model}, Timeout: timeout}
		took, err := boot.Run(ctx)
		if err == nil {
			key.KVM, key.CPU = true, c.Model
			key.Reason = fmt.Sprintf("KVM proven: the guest reached userspace in %d ms (-cpu %s)", took.Milliseconds(), c.Model)
			break
		}
		last = err.Error()
		failures = append(failures, "-cpu "+c.Model+": "+summarizeQEMUError(last))
		b.log().Info("KVM probe failed", "cpu", c.Model, "err", err)
	}
	if !key.KVM {
		key.Reason = "KVM present but cannot run this kernel (" + strings.Join(failures, "; ") + ")"
	}
	key.ProbedAt = time.Now().UTC()
	key.ProbeMS = time.Since(t).Milliseconds()
	b.log().Info("KVM probe", "kvm", key.KVM, "cpu", key.CPU, "reason", key.Reason, "ms", key.ProbeMS)
	return key
}

// summarizeQEMUError turns QEMU's output in an error into the one line a
// user needs: its first error, assertion or KVM failure, without the
// program's name.
func summarizeQEMUError(s string) string {
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		for _, mark := range []string{"KVM internal error", "error: ", "Assertion"} {
			if i := strings.Index(line, mark); i >= 0 {
				msg := strings.TrimPrefix(line[i:], "error: ")
				if mark == "error: " {
					return "QEMU aborted: " + msg
				}
				return "QEMU: " + msg
			}
		}
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// Version is QEMU's version line ("QEMU emulator version 7.2.19 ...").
func Version(bin string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("qemu: %s --version: %w", bin, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line), nil
}

// hostBootID identifies this boot of the host: a KVM that worked before a
// reboot (a module reloaded, a host kernel changed) is proven again.
func hostBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// OpenKVM reports whether /dev/kvm opens read-write, which is what QEMU
// needs before it can even try KVM; the error says why not.
func OpenKVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// ReadVerdicts returns the verdicts cached at path (none when it is missing
// or unreadable), for diagnosis.
func ReadVerdicts(path string) []Verdict { return readVerdicts(path).Verdicts }

func readVerdicts(path string) verdictFile {
	var f verdictFile
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &f) != nil {
		return verdictFile{}
	}
	return f
}

// writeVerdict puts v first in the cache, replacing an entry of the same
// key, and writes the file atomically.
func writeVerdict(path string, f verdictFile, v Verdict) error {
	out := []Verdict{v}
	for _, o := range f.Verdicts {
		if !sameKey(o, v) && o.Format == verdictFormat && len(out) < maxVerdicts {
			out = append(out, o)
		}
	}
	b, err := json.MarshalIndent(verdictFile{Verdicts: out}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("qemu: accelerator verdict directory: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("qemu: writing the accelerator verdict: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("qemu: writing the accelerator verdict: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("qemu: writing the accelerator verdict: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("qemu: writing the accelerator verdict: %w", err)
	}
	return nil
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
