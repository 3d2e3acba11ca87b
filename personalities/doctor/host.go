package doctor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/policy"
	"github.com/capsem/capsem/core/privsep"
	"github.com/capsem/capsem/core/vmimage"
)

// minFreeDisk is the free space below which the storage check warns: a
// VM's disk is sparse but grows with what the guest writes.
const minFreeDisk = 2 << 30

func (h *host) checkHomeWritable(_ context.Context, r *doctor.Reporter) {
	hint := "make " + h.home + " writable by this user, or set CAPSEM_HOME to a directory that is"
	if err := os.MkdirAll(h.home, 0o700); err != nil {
		r.Failf(hint, "creating %s: %v", h.home, err)
		return
	}
	f, err := os.CreateTemp(h.home, ".doctor-*")
	if err != nil {
		r.Failf(hint, "%s is not writable: %v", h.home, err)
		return
	}
	name := f.Name()
	_, werr := f.WriteString("capsem doctor")
	cerr := f.Close()
	os.Remove(name)
	if werr != nil || cerr != nil {
		r.Failf(hint, "writing in %s: %v %v", h.home, werr, cerr)
		return
	}
	r.Okf("%s is writable", h.home)
}

func (h *host) checkFreeDisk(_ context.Context, r *doctor.Reporter) {
	var st unix.Statfs_t
	dir := h.home
	for {
		if err := unix.Statfs(dir, &st); err == nil {
			break
		}
		parent := dir[:max(strings.LastIndexByte(dir, '/'), 1)]
		if parent == dir {
			r.Failf("", "cannot read the free space of %s", h.home)
			return
		}
		dir = parent
	}
	free := int64(st.Bavail) * st.Bsize
	if free < minFreeDisk {
		r.Warnf("free some space: each VM's disk grows with what its guest writes", "%.1f GiB free on %s (below 2 GiB)", float64(free)/(1<<30), dir)
		return
	}
	r.Okf("%.1f GiB free on %s", float64(free)/(1<<30), dir)
}

func (h *host) checkMkfs(_ context.Context, r *doctor.Reporter) {
	p, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		r.Failf("install e2fsprogs (apt-get install e2fsprogs)", "mkfs.ext4 not found: per-VM disks cannot be made")
		return
	}
	r.Okf("%s", p)
}

// checkQemuImg finds qemu-img, which layers the disk of a VM made from an
// image over the image's disk.
func (h *host) checkQemuImg(_ context.Context, r *doctor.Reporter) {
	p, err := vmimage.QemuImg()
	if err != nil {
		r.Warnf("install qemu-utils (apt-get install qemu-utils)", "qemu-img not found: VMs cannot be made from images (capsem fork makes them all the same)")
		return
	}
	r.Okf("%s", p)
}

// checkImages reads the images forks made and names those no VM can be
// made from, and why.
func (h *host) checkImages(_ context.Context, r *doctor.Reporter) {
	dir, err := paths.ImagesDir()
	if err != nil {
		r.Failf("set CAPSEM_HOME", "%v", err)
		return
	}
	imgs, errs := vmimage.Store{Dir: dir}.List()
	var bad []string
	for _, img := range imgs {
		if img.Problem != "" {
			bad = append(bad, img.Name+": "+img.Problem)
		}
	}
	for _, err := range errs {
		bad = append(bad, err.Error())
	}
	if len(bad) > 0 {
		r.Warnf("capsem image rm the images that cannot be used", "%d of %d images unusable: %s", len(bad), len(imgs)+len(errs), strings.Join(bad, "; "))
		return
	}
	r.Okf("%d images", len(imgs))
}

// checkSparse makes a 1 GiB file by truncation and checks it takes no
// space: every VM's disk is such a file.
func (h *host) checkSparse(_ context.Context, r *doctor.Reporter) {
	f, err := os.CreateTemp(h.home, ".doctor-sparse-*")
	if err != nil {
		r.Failf("make "+h.home+" writable", "%v", err)
		return
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil {
		r.Failf("", "truncating a file to 1 GiB: %v", err)
		return
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		r.Failf("", "%v", err)
		return
	}
	if used := st.Blocks * 512; used > 1<<20 {
		r.Warnf("put CAPSEM_HOME on a filesystem with sparse files (ext4, xfs, btrfs, tmpfs)", "a 1 GiB sparse file takes %d bytes: every VM's disk takes its full size", used)
		return
	}
	r.Okf("a 1 GiB sparse file takes %d bytes", st.Blocks*512)
}

func checkLandlock(_ context.Context, r *doctor.Reporter) {
	s := privsep.KernelSupport()
	switch {
	case s.LandlockErr != nil:
		r.Failf("boot a kernel with Landlock enabled (CONFIG_SECURITY_LANDLOCK, lsm=...,landlock)",
			"Landlock unavailable (%v): the aggregator and builtin cannot be kept out of the session files", s.LandlockErr)
	case !s.ScopesSignals:
		r.Warnf("a 6.12+ kernel scopes signals and abstract sockets too", "Landlock ABI %d: files restricted; signals and abstract Unix sockets not scoped", s.LandlockABI)
	default:
		r.Okf("Landlock ABI %d: files restricted, signals and abstract Unix sockets scoped", s.LandlockABI)
	}
}

func checkSeccomp(_ context.Context, r *doctor.Reporter) {
	if s := privsep.KernelSupport(); !s.SeccompFilter {
		r.Failf("boot a kernel with seccomp filters (CONFIG_SECCOMP_FILTER)", "seccomp filters unavailable: %v", s.SeccompErr)
		return
	}
	r.Okf("seccomp filters with the errno action")
}

func checkNoNewPrivs(_ context.Context, r *doctor.Reporter) {
	if s := privsep.KernelSupport(); !s.NoNewPrivs {
		r.Failf("a Linux 3.5+ kernel has it", "no_new_privs unavailable: %v", s.NoNewPrivsErr)
		return
	}
	r.Okf("no_new_privs: children cannot gain privileges through exec")
}

func checkPdeathsig(_ context.Context, r *doctor.Reporter) {
	if s := privsep.KernelSupport(); !s.Pdeathsig {
		r.Failf("", "parent-death signal unavailable: %v", s.PdeathsigErr)
		return
	}
	r.Okf("parent-death signal: children die with their parent")
}

func (h *host) checkPolicy(_ context.Context, r *doctor.Reporter) {
	src, err := h.sources()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	m, err := config.LoadHierarchy(src)
	if err != nil {
		r.Failf("fix the file: unknown keys and bad values are refused, and the file, key and reason are named", "%v", err)
		return
	}
	var files []string
	for _, l := range m.Layers {
		if l.Rank != policy.RankAuto { // auto-detected settings: the next check's
			files = append(files, l.Path)
		}
	}
	if len(files) == 0 {
		files = []string{"no corp.toml or user.toml (defaults)"}
	}
	r.Okf("%s: %d servers, default %s", strings.Join(files, ", "), len(m.File.MCP.Servers), orDefault(m.File.MCP.Default, "allow"))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func (h *host) checkAutodetected(_ context.Context, r *doctor.Reporter) {
	if h.cmd.NoAutodetect {
		r.Okf("auto-detection is off (--no-autodetect)")
		return
	}
	home, err := os.UserHomeDir()
	if err != nil {
		r.Warnf("set HOME", "no home directory to read AI CLI settings from: %v", err)
		return
	}
	found, notes := config.AutoDetect(home)
	var parts []string
	for _, d := range found {
		var names []string
		for _, s := range d.Servers {
			names = append(names, s.Name)
		}
		parts = append(parts, fmt.Sprintf("%s: %s", d.Path, strings.Join(names, ", ")))
	}
	detail := "no mcpServers in ~/.claude.json, ~/.claude/settings.json or ~/.gemini/settings.json"
	if len(parts) > 0 {
		detail = strings.Join(parts, "; ")
	}
	if len(notes) > 0 {
		r.Warnf("fix or remove those entries in the AI CLI's settings", "%s; skipped: %s", detail, strings.Join(notes, "; "))
		return
	}
	r.Okf("%s", detail)
}

func (h *host) checkRegistration(_ context.Context, r *doctor.Reporter) {
	home, err := os.UserHomeDir()
	if err != nil {
		r.Warnf("set HOME", "no home directory: %v", err)
		return
	}
	if regs := config.Registrations(home); len(regs) > 0 {
		r.Okf("capsem is registered: %s", strings.Join(regs, "; "))
		return
	}
	r.Okf("capsem is not registered as an MCP server in Claude Code or Gemini CLI settings (not needed to run VMs)")
}
