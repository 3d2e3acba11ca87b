package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/modorder"
	"github.com/capsem/capsem/core/mountinfo"
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
	ms, err := mountinfo.Self()
	if err != nil {
		return false
	}
	_, ok := mountinfo.At(ms, target)
	return ok
}

// ModuleWorkersParam on the kernel command line sets how many module
// chains load at once (default: one per CPU; 1: one after the other).
const ModuleWorkersParam = "capsem.module_workers"

// ModuleLoadOrder lists the kernel modules to load (format: core/modorder),
// dependencies first (written by the image builder).
const ModuleLoadOrder = modorder.Path

// moduleReport is what loading the module list did, for the boot log.
type moduleReport struct {
	loaded   int
	failed   []error
	times    []moduleTime
	skipped  []string      // modules for devices this VM does not have
	busReads int           // /sys/bus/<bus> reads to decide that
	busTime  time.Duration // time those reads took
	chains   int           // independent chains in the list
	workers  int           // chains loading at once
	elapsed  time.Duration // start to the last module
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

// sysBus is where the devices present right now say what they are:
// <sysBus>/<bus>/devices/<device>/modalias.
const sysBus = "/sys/bus"

// busDevices reads what devices are on the buses a module's patterns name.
// A device's modalias never changes, so it is read once; later reads of a
// bus list its directory and read only devices that are new (reading a
// modalias costs ~0.3 ms under TCG, a listing less).
type busDevices struct {
	root     string
	aliases  map[string]string   // device directory → modalias
	listed   map[string][]string // bus → its modaliases, until invalidated
	reads    int
	readTime time.Duration
}

func newBusDevices(root string) *busDevices {
	return &busDevices{root: root, aliases: map[string]string{}, listed: map[string][]string{}}
}

// invalidate forgets the bus listings: a module loaded, devices may be new.
func (b *busDevices) invalidate() { clear(b.listed) }

// on returns the modaliases of the devices on bus ("" means every bus).
func (b *busDevices) on(bus string) []string {
	if devs, ok := b.listed[bus]; ok {
		return devs
	}
	t := time.Now()
	buses := []string{bus}
	if bus == "" {
		ents, _ := os.ReadDir(b.root)
		buses = buses[:0]
		for _, e := range ents {
			buses = append(buses, e.Name())
		}
	}
	var out []string
	for _, bu := range buses {
		dir := filepath.Join(b.root, bu, "devices")
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			a, ok := b.aliases[p]
			if !ok {
				data, err := os.ReadFile(filepath.Join(p, "modalias"))
				if err != nil {
					// None (yet: a device being added gets its
					// attributes after its directory): ask again.
					continue
				}
				a = strings.TrimSpace(string(data))
				b.aliases[p] = a
			}
			if a != "" {
				out = append(out, a)
			}
		}
	}
	b.listed[bus] = out
	b.reads++
	b.readTime += time.Since(t)
	return out
}

// moduleLoader loads the module list in the background, so the boot can
// go on with each step as soon as the modules it needs are in (the root
// disk needs ext4 and virtio_blk, not 9p), and tells waiters when they are.
type moduleLoader struct {
	start time.Time

	mu      sync.Mutex
	changed *sync.Cond
	listed  map[string]bool // every module in the list
	settled map[string]bool // loaded, failed, or given up on (no device)
	done    bool
	report  moduleReport
	elapsed time.Duration
}

// startModules starts loading the list with finit_module. The modules of
// one chain load one after the other in list order, and chains, which share
// no module, load side by side. (Loading each dependency level at once,
// several virtio drivers probing together, hung one TCG boot in 54; a
// bus's drivers all share its core module, so they stay in one chain and
// load in sequence.) A module for a device (a driver, or what only drivers
// need) loads only when such a device is present, or when the kernel
// command line gives it parameters. A module already loaded (EEXIST) is
// fine; any other failure is logged and the rest still load, since the
// channel may not need the one that failed. startModulesWith takes the
// device and command-line sources and the loader as parameters, for tests.
func startModules(log *slog.Logger, listPath string) *moduleLoader {
	return startModulesWith(log, listPath, sysBus, "/proc/cmdline", loadModule)
}

func startModulesWith(log *slog.Logger, listPath, busRoot, cmdlinePath string, load func(path, params string) error) *moduleLoader {
	l := &moduleLoader{start: time.Now(), listed: map[string]bool{}, settled: map[string]bool{}}
	l.changed = sync.NewCond(&l.mu)
	data, err := os.ReadFile(listPath)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			l.report.failed = append(l.report.failed, fmt.Errorf("module list %s: %w", listPath, err))
		}
		l.finished()
		return l
	}
	chains, err := modorder.ParseChains(data, filepath.Dir(listPath))
	if err != nil {
		l.report.failed = []error{fmt.Errorf("module list %s: %w", listPath, err)}
		l.finished()
		return l
	}
	for _, c := range chains {
		for _, e := range c {
			l.listed[e.Name()] = true
		}
	}
	var configured map[string]bool
	workers := runtime.NumCPU()
	if b, err := os.ReadFile(cmdlinePath); err == nil {
		configured = modorder.CmdlineModules(string(b))
		// capsem.module_workers=N, for diagnosis.
		if v, ok := guestwire.CmdlineValue(string(b), ModuleWorkersParam); ok {
			if n, err := strconv.Atoi(v); err == nil && n >= 1 {
				workers = n
			} else {
				log.Warn("ignoring a bad kernel parameter", "param", ModuleWorkersParam, "value", v)
			}
		}
	}
	// Chains share no module, so they load side by side, one per CPU,
	// heaviest first (the builder's order): under TCG a boot's module
	// loading is CPU-bound kernel work that a second vCPU halves.
	l.report.chains, l.report.workers = len(chains), min(len(chains), workers)
	queue := make(chan []modorder.Entry, len(chains))
	for _, c := range chains {
		queue <- c
	}
	close(queue)
	var wg sync.WaitGroup
	for range l.report.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range queue {
				cr := loadChain(log, c, busRoot, configured, load, l.settle)
				l.mu.Lock()
				r := &l.report
				r.loaded += cr.loaded
				r.failed = append(r.failed, cr.failed...)
				r.times = append(r.times, cr.times...)
				r.skipped = append(r.skipped, cr.skipped...)
				r.busReads += cr.busReads
				r.busTime += cr.busTime
				l.mu.Unlock()
			}
		}()
	}
	go func() {
		wg.Wait()
		l.finished()
	}()
	return l
}

// settle records that the named modules are as loaded as they will get.
func (l *moduleLoader) settle(names ...string) {
	l.mu.Lock()
	for _, n := range names {
		l.settled[n] = true
	}
	l.mu.Unlock()
	l.changed.Broadcast()
}

func (l *moduleLoader) finished() {
	l.mu.Lock()
	l.done = true
	l.elapsed = time.Since(l.start)
	l.mu.Unlock()
	l.changed.Broadcast()
}

// wait returns once each named module has loaded, failed or been given up
// on. A name the list lacks (built into this kernel, or not wanted) is not
// waited for.
func (l *moduleLoader) wait(names ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.done && slices.ContainsFunc(names, func(n string) bool { return l.listed[n] && !l.settled[n] }) {
		l.changed.Wait()
	}
}

// finish waits for the whole list and returns what it did, with the time
// from start to the last module.
func (l *moduleLoader) finish() moduleReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.done {
		l.changed.Wait()
	}
	r := l.report
	r.elapsed = l.elapsed
	return r
}

// loadChain loads one chain in its order. A conditional module whose
// device is not there yet is deferred, not dropped: devices appear as bus
// drivers load (virtio_pci creates the virtio devices), and the list
// orders dependencies, not buses. Whenever a conditional module (a driver,
// or what drivers need) has loaded, the deferred ones are checked again, in
// list order, before the next entry, so a deferred dependency still loads
// before the module that needs it. Unconditional modules (filesystems,
// libraries) create no bus devices, so they trigger no rescan. A bus
// driver and the drivers of its devices share the bus's core module, so
// they are in one chain.
func loadChain(log *slog.Logger, entries []modorder.Entry, busRoot string, configured map[string]bool, load func(path, params string) error, settle func(...string)) (r moduleReport) {
	defer func() {
		// Whatever is left (no device for it) is settled with the chain.
		for _, e := range entries {
			settle(e.Name())
		}
	}()
	// Each bus is read when a pattern names it, and again only after a
	// conditional module loaded.
	buses := newBusDevices(busRoot)
	defer func() { r.busReads, r.busTime = buses.reads, buses.readTime }()
	devicesChanged := true
	wanted := func(e modorder.Entry) bool {
		if !e.Conditional() || configured[e.Name()] {
			return true
		}
		if devicesChanged {
			buses.invalidate()
			devicesChanged = false
		}
		return e.MatchesOn(buses.on)
	}
	loadOne := func(e modorder.Entry) {
		t := time.Now()
		err := load(e.Path, strings.Join(e.Params, " "))
		r.times = append(r.times, moduleTime{e.Name(), time.Since(t)})
		settle(e.Name())
		if err != nil {
			log.Warn("loading a kernel module", "module", e.Path, "err", err)
			r.failed = append(r.failed, err)
			return
		}
		r.loaded++
		if e.Conditional() {
			devicesChanged = true
		}
	}
	var deferred []modorder.Entry
	retryDeferred := func() {
		for len(deferred) > 0 && devicesChanged {
			var still []modorder.Entry
			for _, d := range deferred {
				if wanted(d) {
					loadOne(d)
				} else {
					still = append(still, d)
				}
			}
			deferred = still
		}
	}
	for _, e := range entries {
		retryDeferred()
		if wanted(e) {
			loadOne(e)
		} else {
			deferred = append(deferred, e)
		}
	}
	retryDeferred()
	for _, d := range deferred {
		r.skipped = append(r.skipped, d.Name())
	}
	return r
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
	ms, err := mountinfo.Self()
	if err != nil {
		return
	}
	var targets []string
	for _, m := range ms {
		switch m.FSType {
		case "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs", "rootfs":
			continue
		}
		if m.Target != "/" {
			targets = append(targets, m.Target)
		}
	}
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

// waitForNoProcesses waits, at most limit, until procRoot lists no process
// but self that is still running a program: kernel threads and zombies
// (reaped by PID 1's reaper) have an empty cmdline.
func waitForNoProcesses(procRoot string, self int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		if !otherProcesses(procRoot, self) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func otherProcesses(procRoot string, self int) bool {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return true // cannot tell: take the whole grace
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || pid == 1 {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline")); err == nil && len(b) > 0 {
			return true
		}
	}
	return false
}

// powerOff stops every other process, syncs, unmounts and powers the VM
// off. Only PID 1 may call it. It never returns; if the reboot call fails
// there is nothing left to do but wait.
func powerOff(log *slog.Logger) {
	// kill(-1) from PID 1 reaches every process but itself: a short grace
	// for clean exits (over as soon as none is left, which at a normal
	// stop is at once), then no more writers on the disks.
	unix.Kill(-1, unix.SIGTERM)
	waitForNoProcesses("/proc", os.Getpid(), 200*time.Millisecond)
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	unmountWritable(log)
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Error("power off failed", "err", err)
	}
	select {}
}

// imageEnv is DefaultEnv under the root image's own environment file
// (guestwire.GuestImageEnv; none in the minimal root). A file that does not
// parse is logged and ignored: commands still run, with the defaults.
func imageEnv(log *slog.Logger, path string) map[string]string {
	env := DefaultEnv()
	data, err := readBounded(path, guestwire.MaxImageEnv)
	if errors.Is(err, fs.ErrNotExist) {
		return env
	}
	if err == nil {
		var own map[string]string
		if own, err = guestwire.ParseImageEnv(data); err == nil {
			maps.Copy(env, own)
			return env
		}
	}
	log.Warn("ignoring the root image's environment", "path", path, "err", err)
	return env
}

// machineIDPath is systemd's machine id, which D-Bus, journald and some
// tools read: the image ships it empty, so each VM gets its own.
const machineIDPath = "/etc/machine-id"

// vmIDPath records, on the VM's persistent root, the host's id of the VM
// the root belongs to.
const vmIDPath = "/var/lib/capsem/vm-id"

// claimIdentity makes the root the VM vmID's: when the root was another
// VM's (a clone, made from a fork's image; vmIDPath names that VM), what
// a clone must not share is made anew. Today that is the machine id;
// the host name, clock, entropy and network come from the host at each
// boot. A root that records no VM (the first boot of a VM, or a root from
// before these records) keeps what it has.
func claimIdentity(log *slog.Logger, vmIDFile, machineIDFile, vmID string) error {
	old, err := os.ReadFile(vmIDFile)
	switch {
	case err == nil && string(bytes.TrimSpace(old)) == vmID:
		return nil
	case err == nil:
		log.Info("this root was another VM's: making its identity anew", "was", string(bytes.TrimSpace(old)), "vm", vmID)
		if err := os.Remove(machineIDFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing the cloned machine id: %w", err)
		}
		ensureMachineID(log, machineIDFile)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("reading %s: %w", vmIDFile, err)
	}
	_, err = writeFile(vmIDFile, []byte(vmID+"\n"), 0o644, true, 128)
	return err
}

// ensureMachineID gives the VM a random machine id when its root has none
// (a persistent VM keeps the one its disk holds).
func ensureMachineID(log *slog.Logger, path string) {
	if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) == 32 {
		return
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		log.Warn("making a machine id", "err", err)
		return
	}
	if _, err := writeFile(path, []byte(hex.EncodeToString(id[:])+"\n"), 0o444, true, 64); err != nil {
		log.Warn("writing the machine id", "path", path, "err", err)
	}
}
