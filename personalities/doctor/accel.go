package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/qemu"
)

const (
	installQEMU = "install qemu-system-x86 (apt-get install qemu-system-x86)"
	tcgHint     = "KVM unusable: running under TCG, expect ~3x slower boots"
)

func (h *host) checkKVMDevice(_ context.Context, r *doctor.Reporter) {
	if err := qemu.OpenKVM(); err != nil {
		r.Warnf("no hardware virtualization here (or no access to /dev/kvm): "+tcgHint, "/dev/kvm does not open read-write: %v", err)
		return
	}
	r.Okf("/dev/kvm opens read-write (it must still prove it runs the guest)")
}

func (h *host) checkKVMProven(ctx context.Context, r *doctor.Reporter) {
	if _, err := exec.LookPath(qemu.DefaultBinary); err != nil {
		r.Failf(installQEMU, "%s not found: nothing to prove KVM with", qemu.DefaultBinary)
		return
	}
	a, err := h.installedAssets()
	if err != nil {
		r.Warnf("build them (capsem image build): KVM is proven with them", "no guest assets to prove KVM with yet: %v", err)
		return
	}
	b, err := h.backend()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	t := time.Now()
	accel, err := b.ChooseAccelFor(ctx, "", qemu.BootFiles{Kernel: a.Kernel, Initramfs: a.Initramfs, Firmware: qemu.PreferredFirmware()})
	took := time.Since(t).Round(time.Millisecond)
	switch {
	case err != nil:
		r.Failf("unset CAPSEM_ACCEL, or set it to tcg", "%v", err)
	case accel.Name == vmm.AccelKVM:
		r.Okf("VMs run under KVM -cpu %s: %s (decided in %v)", accel.CPU, accel.Reason, took)
	case accel.Forced:
		r.Okf("VMs run under TCG: %s", accel.Reason)
	default:
		r.Warnf(tcgHint, "VMs run under TCG: %s (decided in %v)", accel.Reason, took)
	}
}

// qemuHelp is QEMU's answer to one of its help options, "" with the
// error when it cannot say.
func qemuHelp(ctx context.Context, args ...string) (string, error) {
	path, err := exec.LookPath(qemu.DefaultBinary)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return "", errors.New(strings.TrimSpace(string(out)) + " " + err.Error())
	}
	return string(out), nil
}

func (h *host) checkTCG(ctx context.Context, r *doctor.Reporter) {
	out, err := qemuHelp(ctx, "-accel", "help")
	switch {
	case err != nil:
		r.Failf(installQEMU, "QEMU cannot list its accelerators: %v", err)
	case !strings.Contains(out, "tcg"):
		r.Failf(installQEMU, "this QEMU has no TCG (accelerators: %s)", strings.Join(strings.Fields(out), " "))
	default:
		r.Okf("TCG is available (the fallback every host has)")
	}
}

func (h *host) checkQEMUBinary(_ context.Context, r *doctor.Reporter) {
	path, err := exec.LookPath(qemu.DefaultBinary)
	if err != nil {
		r.Failf(installQEMU, "%s not found in PATH", qemu.DefaultBinary)
		return
	}
	v, err := qemu.Version(path)
	if err != nil {
		r.Failf(installQEMU, "%s does not run: %v", path, err)
		return
	}
	r.Okf("%s: %s", path, v)
}

func (h *host) checkMachine(ctx context.Context, r *doctor.Reporter) {
	out, err := qemuHelp(ctx, "-machine", "help")
	if err != nil || !strings.Contains(out, vmm.DefaultMachine+" ") && !strings.Contains(out, vmm.DefaultMachine+"\n") {
		r.Failf(installQEMU, "QEMU lacks the %s machine type (%v)", vmm.DefaultMachine, err)
		return
	}
	r.Okf("machine type %s", vmm.DefaultMachine)
}

// devices are the QEMU devices a capsem VM is made of.
var devices = []string{"virtio-serial-pci", "virtserialport", "virtio-blk-pci"}

func (h *host) checkDevices(ctx context.Context, r *doctor.Reporter) {
	out, err := qemuHelp(ctx, "-device", "help")
	if err != nil {
		r.Failf(installQEMU, "QEMU cannot list its devices: %v", err)
		return
	}
	var missing []string
	for _, d := range devices {
		if !strings.Contains(out, `"`+d+`"`) {
			missing = append(missing, d)
		}
	}
	if len(missing) > 0 {
		r.Failf(installQEMU+" (Debian's build has them all)", "QEMU lacks the devices %s", strings.Join(missing, ", "))
		return
	}
	r.Okf("%s", strings.Join(devices, ", "))
}

func (h *host) checkFirmware(_ context.Context, r *doctor.Reporter) {
	if fw := qemu.PreferredFirmware(); fw != "" {
		r.Okf("qboot (%s): the fast BIOS for a direct kernel boot", fw)
		return
	}
	r.Warnf("install qemu-system-data for qboot", "no %s: VMs boot through SeaBIOS, 100-200 ms slower", qemu.FastFirmware)
}

func (h *host) checkAssetsPresent(_ context.Context, r *doctor.Reporter) {
	if _, err := os.Stat(h.guestBin); err != nil {
		r.Failf("make build writes capsem-guest next to capsem", "the guest binary %s: %v", h.guestBin, err)
		return
	}
	a, err := h.installedAssets()
	switch {
	case errors.Is(err, guestfs.ErrNoAssets):
		r.Warnf("capsem image build (or the first capsem run) builds them from their recipes", "none built yet for this guest binary in %s", h.assetsDir())
		return
	case err != nil:
		r.Failf(rebuildAssets, "%v", err)
		return
	}
	var missing []string
	for _, p := range []string{a.Kernel, a.Initramfs} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 || len(a.Modules) == 0 {
		r.Failf(rebuildAssets, "incomplete: missing %v, %d modules", missing, len(a.Modules))
		return
	}
	r.Okf("kernel %s (%s) and minimal root %s (%s, %d modules) in %s", short(a.KernelManifest.Key), filepath.Base(a.Kernel),
		short(a.InitramfsManifest.Key), humanSize(a.Files[guestfs.FileInitramfs].Size), len(a.Modules), filepath.Dir(a.Dir))
}

// rebuildAssets is the fix for damaged boot assets.
const rebuildAssets = "capsem image build --force (or the next capsem run) rebuilds it"

func short(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}

func (h *host) checkAssetHashes(_ context.Context, r *doctor.Reporter) {
	a, err := h.installedAssets()
	if err != nil {
		r.Warnf("capsem image build", "nothing to verify: %v", err)
		return
	}
	t := time.Now()
	if err := a.Verify(); err != nil {
		r.Failf(rebuildAssets, "corrupt: %v", err)
		return
	}
	r.Okf("all %d files of the kernel and the minimal root match their manifests' sha256 (%v)",
		len(a.KernelManifest.Files)+len(a.InitramfsManifest.Files), time.Since(t).Round(time.Millisecond))
}

func (h *host) checkKernel(_ context.Context, r *doctor.Reporter) {
	a, err := h.installedAssets()
	if err != nil {
		r.Warnf("capsem image build", "no kernel yet: %v", err)
		return
	}
	boot := "bzImage"
	if a.PVH {
		boot = "uncompressed vmlinux, PVH entry"
	}
	in := a.KernelManifest.Inputs
	r.Okf("Linux %s from %s %s (%s)", a.KernelVersion, in.Package, in.Version, boot)
}

func (h *host) checkSavedBoots(_ context.Context, r *doctor.Reporter) {
	a, err := h.installedAssets()
	if err != nil {
		r.Warnf("capsem image build", "no assets, so no saved boots: %v", err)
		return
	}
	saved := savedBoots(a.BootStateDir)
	if len(saved) == 0 {
		r.Okf("none yet: the first VM of each configuration saves one")
		return
	}
	r.Okf("%s", strings.Join(saved, "; "))
}

// checkStore reports what the store's refs name: the kernel, the minimal
// root and the root images, each by key and size.
func (h *host) checkStore(_ context.Context, r *doctor.Reporter) {
	refs, err := guestfs.StoreRefs(h.assetsDir())
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	if len(refs) == 0 {
		r.Warnf("capsem image build (or the first capsem run) builds them", "nothing built yet in %s", h.assetsDir())
		return
	}
	var named, older, broken []string
	for _, ref := range refs {
		switch {
		case errors.Is(ref.Err, guestfs.ErrOlderBuilder):
			older = append(older, ref.Name)
		case ref.Entry == nil:
			broken = append(broken, fmt.Sprintf("%s (%v)", ref.Name, ref.Err))
		default:
			named = append(named, fmt.Sprintf("%s %s (%s, %s)", ref.Name, short(ref.Key), ref.Entry.Kind, humanSize(ref.Entry.Size())))
		}
	}
	switch {
	case len(broken) > 0:
		r.Failf("capsem image build --force rebuilds what the refs name", "refs naming nothing usable: %s", strings.Join(broken, "; "))
	case len(older) > 0:
		r.Warnf("capsem image build (or the first use of each) rebuilds them", "%s; built by an older capsem: %s", strings.Join(named, ", "), strings.Join(older, ", "))
	default:
		r.Okf("%s", strings.Join(named, ", "))
	}
}

// savedBoots summarises the saved boots in dir by accelerator and CPU model,
// read off the QEMU argv each one's metadata records (the per-VM process
// writes <key>.json beside each <key>-<hash>.state).
func savedBoots(dir string) []string {
	metas, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	counts := map[string]int{}
	for _, m := range metas {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var meta struct {
			Argv  []string `json:"argv"`
			State string   `json:"state"`
		}
		if json.Unmarshal(b, &meta) != nil || meta.State == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, filepath.Base(meta.State))); err != nil {
			continue
		}
		accel, cpu := "?", "?"
		for i := 0; i+1 < len(meta.Argv); i++ {
			switch meta.Argv[i] {
			case "-accel":
				accel = meta.Argv[i+1]
			case "-cpu":
				cpu = meta.Argv[i+1]
			}
		}
		counts[accel+" -cpu "+cpu]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		out = append(out, fmt.Sprintf("%d saved boot(s) under %s", counts[k], k))
	}
	return out
}

// checkRootImage reports the full root's image: built, and current for
// its recipe and the host's packages (a VM made now would get a new one).
func (h *host) checkRootImage(ctx context.Context, r *doctor.Reporter) {
	recipe, err := guestfs.LoadRecipe(guestfs.DefaultRecipe)
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	st, err := guestfs.RootStatus(ctx, h.assetsDir(), recipe)
	switch {
	case st == nil:
		r.Failf("", "%v", err)
	case st.RefKey == "":
		r.Warnf("capsem image build (or the first VM with base full) builds it, in minutes", "the %s root image is not built yet", st.Recipe)
	case st.Root == nil && errors.Is(st.RootErr, guestfs.ErrOlderBuilder):
		r.Warnf("the next VM with base full builds the new one, in minutes (or capsem image build now)", "the %s root image %s was built by an older capsem", st.Recipe, st.RefKey[:12])
	case st.Root == nil:
		r.Failf("capsem image build --force rebuilds it", "the %s root image %s is missing from the store: %v", st.Recipe, st.RefKey[:12], st.RootErr)
	case err != nil:
		r.Warnf("mmdebstrap, erofs-utils and apt must be installed to tell", "the %s root image %s (%s): cannot tell whether it is current: %v",
			st.Recipe, st.RefKey[:12], humanSize(st.Root.ImageSize()), err)
	case !st.Current:
		r.Warnf("the next VM with base full builds the new one, in minutes (or capsem image build now)", "the %s root image %s is out of date: its recipe or Debian's packages changed (now %s)",
			st.Recipe, st.RefKey[:12], st.Key[:12])
	default:
		r.Okf("%s: %s, current (%s, built %s)", st.Recipe, st.RefKey[:12], humanSize(st.Root.ImageSize()), st.Root.BuiltAt.Local().Format("2006-01-02 15:04"))
	}
}

func humanSize(n int64) string { return fmt.Sprintf("%.0f MB", float64(n)/1e6) }
