package agent

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mountSpec is one filesystem PID 1 mounts before anything else runs.
type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode // of the mount point when created
	required               bool        // boot fails without it
}

// earlyMounts are mounted in order: /proc first (the rest checks
// /proc/self/mountinfo), /dev before /dev/pts.
var earlyMounts = []mountSpec{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555, true},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555, true},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755, true},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755, false},
	{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777, false},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777, false},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755, false},
}

// mountEarly mounts earlyMounts, skipping any already mounted (the agent may
// run again after a crash, or not as PID 1 in a test VM).
func mountEarly(log *slog.Logger) error {
	for _, m := range earlyMounts {
		if err := os.MkdirAll(m.target, m.mode); err != nil && m.required {
			return fmt.Errorf("agent: creating mount point %s: %w", m.target, err)
		}
		if isMountPoint(m.target) {
			continue
		}
		err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if err != nil {
			if m.required {
				return fmt.Errorf("agent: mounting %s on %s: %w", m.fstype, m.target, err)
			}
			log.Warn("mount failed", "target", m.target, "fstype", m.fstype, "err", err)
		}
	}
	// /dev/ptmx must point at the devpts instance for PTYs to work.
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	return nil
}

// isMountPoint reports whether target is mounted on, from
// /proc/self/mountinfo (false when /proc is not mounted yet).
func isMountPoint(target string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == target {
			return true
		}
	}
	return false
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ModuleLoadOrder lists the kernel modules to load, one path per line,
// dependencies first (written by the image builder).
const ModuleLoadOrder = "/lib/modules/load-order"

// loadModules loads every module in the list file with finit_module, one
// after the other in list order (loading independent modules at the same
// time hung one boot in 54 under TCG). A module already loaded (EEXIST) is
// fine; any other failure is logged and the rest still load, since the
// channel may not need the one that failed. It returns how many loaded and
// the failures.
func loadModules(log *slog.Logger, listPath string) (loaded int, failed []error) {
	loaded, failed, _ = loadModulesTimed(log, listPath)
	return loaded, failed
}

// moduleTime is how long one module took to load and initialise.
type moduleTime struct {
	name string
	d    time.Duration
}

// slowest names the n slowest modules, for the boot log: module init is
// where a TCG boot spends its time.
func slowest(times []moduleTime, n int) string {
	slices.SortFunc(times, func(a, b moduleTime) int { return int(b.d - a.d) })
	var parts []string
	for _, t := range times[:min(n, len(times))] {
		parts = append(parts, fmt.Sprintf("%s %dms", t.name, t.d.Milliseconds()))
	}
	return strings.Join(parts, ", ")
}

func loadModulesTimed(log *slog.Logger, listPath string) (loaded int, failed []error, times []moduleTime) {
	data, err := os.ReadFile(listPath)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			failed = append(failed, fmt.Errorf("module list %s: %w", listPath, err))
		}
		return 0, failed, nil
	}
	base := filepath.Dir(listPath)
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// "path [param=value ...]"
		path, params, _ := strings.Cut(line, " ")
		if !filepath.IsAbs(path) {
			path = filepath.Join(base, path)
		}
		t := time.Now()
		err := loadModule(path, strings.TrimSpace(params))
		times = append(times, moduleTime{strings.TrimSuffix(filepath.Base(path), ".ko"), time.Since(t)})
		if err != nil {
			log.Warn("loading a kernel module", "module", path, "err", err)
			failed = append(failed, err)
			continue
		}
		loaded++
	}
	return loaded, failed, times
}

func loadModule(path, params string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("module %s: %w", path, err)
	}
	defer unix.Close(fd)
	flags := 0
	if slices.ContainsFunc([]string{".xz", ".zst", ".gz"}, func(ext string) bool { return strings.HasSuffix(path, ext) }) {
		// The kernel decompresses it (CONFIG_MODULE_DECOMPRESS).
		flags |= unix.MODULE_INIT_COMPRESSED_FILE
	}
	if err := unix.FinitModule(fd, params, flags); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("module %s: finit_module: %w", path, err)
	}
	return nil
}

// kernelUptime returns the time since the kernel booted, from /proc/uptime.
func kernelUptime() (time.Duration, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), " ")
	secs, err := strconv.ParseFloat(first, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing /proc/uptime %q: %w", b, err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// setClock sets the wall clock.
func setClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

// setHostname sets the kernel's host name.
func setHostname(name string) error { return unix.Sethostname([]byte(name)) }

// useConsole points stdin, stdout and stderr at /dev/console when the
// kernel could not (an initramfs without /dev/console): PID 1's logs must
// reach the serial log.
func useConsole() {
	var st unix.Stat_t
	if unix.Fstat(2, &st) == nil {
		return
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	for _, target := range []int{0, 1, 2} {
		unix.Dup3(fd, target, 0)
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// unmountWritable lazily unmounts everything but the pseudo filesystems,
// deepest first, after a sync, so writable disks are clean at power off.
func unmountWritable(log *slog.Logger) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var targets []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		switch fields[sep+1] {
		case "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs", "rootfs":
			continue
		}
		if t := unescapeMountPath(fields[4]); t != "/" {
			targets = append(targets, t)
		}
	}
	f.Close()
	// Deepest first: /a/b before /a.
	slices.SortFunc(targets, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, t := range targets {
		// Read-only first: a lazy unmount of the per-VM disk leaves it
		// mounted underneath the root overlay, and only a read-only
		// remount writes its journal out and marks it clean.
		if err := unix.Mount("", t, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			log.Debug("remount read-only", "target", t, "err", err)
		}
		if err := unix.Unmount(t, unix.MNT_DETACH); err != nil {
			log.Debug("unmount", "target", t, "err", err)
		}
	}
	// The root itself cannot be unmounted; make it read-only so its journal
	// is clean (an overlay root syncs its upper layer).
	unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
}

// powerOff stops every other process, syncs, unmounts and powers the VM
// off. Only PID 1 may call it. It never returns; if the reboot call fails
// there is nothing left to do but wait.
func powerOff(log *slog.Logger) {
	// kill(-1) from PID 1 reaches every process but itself: a short grace
	// for clean exits, then no more writers on the disks.
	unix.Kill(-1, unix.SIGTERM)
	time.Sleep(200 * time.Millisecond)
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	unmountWritable(log)
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Error("power off failed", "err", err)
	}
	select {}
}
