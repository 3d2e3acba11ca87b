package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/version"
)

// Bounds of the boot's waits. Under TCG a guest is slow, so they are
// generous; they exist so a broken channel ends in a power off the host can
// see, not a VM that hangs forever.
const (
	// ChannelTimeout bounds opening the channel and reaching the host's
	// control port.
	ChannelTimeout = 60 * time.Second
)

// guestSymlinks are the names the capsem binary answers to inside the guest.
var guestSymlinks = []string{"/usr/bin/capsem-mcp-server", "/usr/bin/capsem-doctor"}

// Run is PID 1. It never returns as PID 1: whatever happens ends in a power
// off, since init exiting would panic the kernel and leave the host waiting.
func (c *Cmd) Run(ctx context.Context) error {
	log := logs.From(ctx).With("component", "agent")
	pid1 := os.Getpid() == 1
	if !pid1 && !c.AllowNotPID1 {
		return fmt.Errorf("agent: this is the guest's init and must run as PID 1 (it is PID %d); set %s=1 to run it anyway for a test",
			os.Getpid(), envvars.AgentAllowNotPID1.Name())
	}
	if !pid1 {
		err := c.boot(ctx, log, false)
		if errors.Is(err, ErrShutdown) {
			return nil
		}
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopSignals := handleInitSignals(log, cancel)
	defer stopSignals()
	err := c.boot(ctx, log, true)
	switch {
	case errors.Is(err, ErrShutdown):
		log.Info("powering off: the host asked")
	case errors.Is(context.Cause(ctx), errGuestPowerOff):
		log.Info("powering off: asked from inside the guest")
	default:
		log.Error("the guest agent failed; powering off", "err", err)
	}
	powerOff(log)
	return nil
}

// errGuestPowerOff is the cause when a guest process asked init to stop.
var errGuestPowerOff = errors.New("agent: power off requested inside the guest")

// handleInitSignals keeps PID 1 alive against signals: the Go runtime would
// exit on an unhandled SIGTERM, SIGHUP or SIGINT, and init exiting panics the
// kernel. busybox halt/poweroff/reboot send SIGUSR1/SIGUSR2/SIGTERM to init,
// so those power off cleanly (a sandbox has nothing to reboot into); the rest
// are logged and dropped. Notify, not Ignore: ignored signals would stay
// ignored in every exec'd command.
func handleInitSignals(log *slog.Logger, stop context.CancelCauseFunc) func() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGHUP, unix.SIGINT, unix.SIGTERM, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				switch s {
				case unix.SIGTERM, unix.SIGUSR1, unix.SIGUSR2:
					log.Info("init received a power-off signal", "signal", s.String())
					stop(errGuestPowerOff)
				default:
					log.Info("init ignores a signal", "signal", s.String())
				}
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

func (c *Cmd) boot(ctx context.Context, log *slog.Logger, pid1 bool) error {
	start := time.Now()
	if err := mountEarly(log); err != nil {
		return err
	}
	if pid1 {
		useConsole()
		// The boot's one console line before the disk is up (each line
		// costs milliseconds on the emulated serial port): a boot that
		// never becomes ready then shows whether init ran at all.
		log.Info("init started", "mounts_ms", time.Since(start).Milliseconds())
	}
	var hello guestwire.Hello
	hello.AgentVersion = version.Version
	hello.KernelRelease = kernelRelease()
	hello.Boot.MountsMS = time.Since(start).Milliseconds()
	if up, err := kernelUptime(); err == nil {
		hello.Boot.KernelToInitMS = (up - time.Since(start)).Milliseconds()
	}
	if !pid1 {
		// Orphans of our execs come to us, as they would to init.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			log.Warn("becoming a child subreaper", "err", err)
		}
	}
	reaper := NewReaper(log, true)
	defer reaper.Close()

	// Modules load in the background; each step below waits only for the
	// modules it needs, so the channel opens and the root disk mounts
	// while the rest still load.
	mods := startModules(log, ModuleLoadOrder)
	modsFinished := false
	defer func() {
		if !modsFinished {
			mods.finish() // an early error: no loader outlives boot
		}
	}()

	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return fmt.Errorf("agent: reading the kernel command line: %w", err)
	}
	kind, err := guestchan.FromCmdline(string(cmdline))
	if err != nil {
		return err
	}
	openCtx, cancel := context.WithTimeout(ctx, ChannelTimeout)
	defer cancel()
	plan := planStorage(string(cmdline))
	// The NIC comes up beside the rest of the boot, from when its driver
	// is in. Both boot paths join it as late as they can: before the
	// root switch moves /proc under it, and before the wake handshake (so
	// a saved boot has it up).
	var network *networkStage
	if planNetwork(string(cmdline)) {
		if pid1 {
			network = startNetwork(ctx, mods.wait)
			defer network.join() // an early error: nothing outlives boot
		} else {
			log.Warn("not PID 1: leaving the network as it is")
		}
	}
	var (
		ch       guestchan.Channel
		storage  *storageStage
		chanTook time.Duration
		woke     time.Time
	)
	if wakeAsked(string(cmdline)) && pid1 && kind == guestchan.KindSerial {
		// The host may save the VM at the save point, and start
		// others from that state: see guestwire.Wake.
		ch, storage, chanTook, woke, err = bootToWake(openCtx, log, plan, mods, network)
		modsFinished = true
		if err != nil {
			return err
		}
	} else {
		ch, storage, chanTook, err = bootDirect(ctx, openCtx, log, kind, plan, pid1, mods, network)
		modsFinished = true
		if err != nil {
			return err
		}
	}
	defer func() { ch.Close() }() // the channel of the moment (a park replaces it)
	hello.Boot.ModulesMS = mods.finish().elapsed.Milliseconds()
	if storage != nil {
		if err := storage.finish(openCtx, log, mods.wait); err != nil {
			return err
		}
		hello.Boot.StorageMS = storage.took.Milliseconds()
	}
	// In the root the guest runs in, now switched.
	network.finish(log)
	ensureSymlinks(log)
	if pid1 {
		hardenGuest(log)
	}
	t := time.Now()
	conn, err := dialRetry(openCtx, ch, guestchan.PortControl)
	if err != nil {
		return fmt.Errorf("agent: reaching the host's control port over the %s channel: %w", kind, err)
	}
	hello.Boot.ChannelMS = (chanTook + time.Since(t)).Milliseconds()
	if !woke.IsZero() {
		hello.Boot.AfterWakeMS = time.Since(woke).Milliseconds()
	}
	log.Info("connected to the host", "channel", kind, "kernel_to_init_ms", hello.Boot.KernelToInitMS,
		"mounts_ms", hello.Boot.MountsMS, "modules_ms", hello.Boot.ModulesMS, "storage_ms", hello.Boot.StorageMS,
		"channel_ms", hello.Boot.ChannelMS, "after_wake_ms", hello.Boot.AfterWakeMS)

	// The channel's session changes at a park (suspend): everything that
	// dials the host goes through the current one.
	var current atomic.Pointer[guestchan.Channel]
	current.Store(&ch)
	dial := func(ctx context.Context, port uint32) (net.Conn, error) { return (*current.Load()).Dial(ctx, port) }
	srv := &Server{Log: log, Dial: dial, Reaper: reaper, Hello: hello, SetClock: setClock, SetHostname: setHostname,
		BaseEnv: imageEnv(log, guestwire.GuestImageEnv)}
	if pid1 {
		ensureMachineID(log, machineIDPath)
		srv.ClaimIdentity = func(vmID string) error { return claimIdentity(log, vmIDPath, machineIDPath, vmID) }
	}
	if pid1 {
		srv.FactsPath = guestwire.GuestBootFacts
	}
	bridgeCtx, stopBridge := context.WithCancel(ctx)
	defer stopBridge()
	serveTerminals := func(ch guestchan.Channel) {
		if termLn, err := ch.Listen(guestchan.PortTerminal); err != nil {
			log.Error("terminal sessions unavailable", "err", err)
		} else {
			go srv.ServeTerminals(bridgeCtx, termLn)
		}
	}
	serveTerminals(ch)
	armPark := func() {
		if port := parkablePortOf(ch); port != nil {
			srv.BeforePark = func(wakeMarker []byte) {
				port.arm(wakeMarker)
				parkWorkspace(log, storage)
			}
		} else {
			srv.BeforePark = nil
		}
	}
	armPark()
	go func() {
		if err := ServeMCPBridge(bridgeCtx, log, guestwire.GuestMCPSocket, dial); err != nil {
			log.Error("MCP bridge", "err", err)
		}
	}()
	for {
		err := srv.Serve(ctx, conn)
		if errors.Is(err, ErrShutdown) || ctx.Err() != nil {
			return err
		}
		if errors.Is(err, ErrPark) {
			port := parkablePortOf(ch)
			if port == nil {
				return fmt.Errorf("agent: asked to park on a %s channel, which cannot be", kind)
			}
			ch.Close() // ends the session, and with it its terminals and streams
			next, _, err := park(ctx, log, port, storage)
			if err != nil {
				return err
			}
			ch = next
			current.Store(&ch)
			armPark()
			serveTerminals(ch)
			conn, err = dialRetry(ctx, ch, guestchan.PortControl)
			if err != nil {
				return fmt.Errorf("agent: reaching the host's control port after a park: %w", err)
			}
			log.Info("connected to the host after a park")
			continue
		}
		select {
		case <-ch.Done():
			return fmt.Errorf("agent: the channel to the host closed: %w", err)
		default:
		}
		// The channel lives but the control stream broke (the host gave
		// up on a heartbeat this guest was too busy to answer, say): say
		// Hello again on a new one (the boot environment is kept). The
		// host listens again for as long as the VM runs, so this waits
		// for as long as the channel lives, however starved this guest.
		log.Warn("control connection lost; reconnecting", "err", err)
		conn, err = dialRetry(ctx, ch, guestchan.PortControl)
		if err != nil {
			return fmt.Errorf("agent: reconnecting to the control port: %w", err)
		}
		log.Info("reconnected to the host")
	}
}

// guestDevicesMasked give raw access to the guest kernel's memory and I/O
// ports: removed from /dev, and /proc/kcore (a proc file, which cannot be
// removed) covered with /dev/null, as container runtimes mask it.
var (
	guestDevicesRemoved = []string{"/dev/mem", "/dev/kmem", "/dev/port"}
	guestProcMasked     = []string{"/proc/kcore"}
)

// hardenGuest takes from the guest what no command in it needs: the raw
// memory and port devices, and the right to rewrite the capsem binary (the
// agent, the MCP relay and the doctor), which is bound read-only over
// itself so a write fails with EROFS instead of replacing it in the VM's
// upper layer. capsem-doctor's sandbox group checks each of these.
func hardenGuest(log *slog.Logger) {
	for _, d := range guestDevicesRemoved {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("removing a raw memory device", "path", d, "err", err)
		}
	}
	for _, p := range guestProcMasked {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
			log.Warn("masking a proc file", "path", p, "err", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		log.Warn("locating the agent binary", "err", err)
		return
	}
	if err := bindReadOnly(self); err != nil {
		log.Warn("making the agent binary read-only", "path", self, "err", err)
	}
}

// bindReadOnly binds path over itself and makes that mount read-only.
func bindReadOnly(path string) error {
	if err := unix.Mount(path, path, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return unix.Mount("", path, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
}

// wakeAsked reports whether the command line asks for the wake handshake.
func wakeAsked(cmdline string) bool {
	v, _ := guestwire.CmdlineValue(cmdline, guestwire.CmdlineWake)
	return v == "1"
}

// bootDirect opens the channel and prepares the storage side by side, for
// a boot without the wake handshake: the channel opens as soon as its
// driver is in, and the root disk mounts while the other modules still
// load. The control port is dialed only when the boot is done, since the
// host gives the Hello a deadline from that moment.
func bootDirect(ctx, openCtx context.Context, log *slog.Logger, kind guestchan.Kind, plan storagePlan, pid1 bool,
	mods *moduleLoader, network *networkStage) (guestchan.Channel, *storageStage, time.Duration, error) {
	type channelResult struct {
		ch   guestchan.Channel
		err  error
		took time.Duration
	}
	opened := make(chan channelResult, 1)
	openCtx, cancel := context.WithCancel(openCtx)
	defer cancel()
	go func() {
		t := time.Now()
		mods.wait(channelModules(kind)...)
		ch, err := openChannel(openCtx, kind, log)
		if err != nil {
			err = fmt.Errorf("agent: opening the %s channel to the host: %w", kind, err)
		}
		opened <- channelResult{ch: ch, err: err, took: time.Since(t)}
	}()
	fail := func(err error) (guestchan.Channel, *storageStage, time.Duration, error) {
		cancel()
		if r := <-opened; r.ch != nil {
			r.ch.Close()
		}
		mods.finish()
		return nil, nil, 0, err
	}
	// Storage comes before anything else writes a file: after it, / is
	// the overlay on the per-VM disk.
	var storage *storageStage
	switch {
	case plan.empty():
	case !pid1:
		log.Warn("not PID 1: leaving the root and the workspace as they are", "plan", plan)
	default:
		var err error
		if storage, err = prepareStorage(ctx, plan, mods.wait); err != nil {
			return fail(err)
		}
	}
	logModules(log, mods.finish())
	// The switch moves /sys and /dev under the opener's feet, and /proc
	// under the NIC's setup: it waits for both.
	res := <-opened
	network.wait(log)
	if res.err != nil {
		return nil, nil, 0, res.err
	}
	return res.ch, storage, res.took, nil
}

// bootToWake is the boot with the wake handshake: every module loaded and
// every device found, then the handshake on the raw port, and only after
// it anything that depends on which VM this is: the per-VM disk mounted,
// the multiplexer started. A VM restored from a state saved at the
// save point resumes inside the handshake. woke is when it ended.
func bootToWake(ctx context.Context, log *slog.Logger, plan storagePlan, mods *moduleLoader, network *networkStage) (
	ch guestchan.Channel, storage *storageStage, took time.Duration, woke time.Time, err error) {
	type portResult struct {
		f    *os.File
		err  error
		took time.Duration
	}
	opened := make(chan portResult, 1)
	openCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.Now()
		mods.wait(channelModules(guestchan.KindSerial)...)
		f, err := guestchan.OpenVirtioPort(openCtx, guestchan.VirtioPortName)
		if err != nil {
			err = fmt.Errorf("agent: opening the serial channel to the host: %w", err)
		}
		opened <- portResult{f: f, err: err, took: time.Since(t)}
	}()
	storage, disks, lerr := locateStorage(ctx, plan, mods.wait)
	if lerr == nil && disks.lower != "" {
		// The root image is the same file in every VM this state resumes
		// in (the state's key names it; an image is never rewritten), so
		// it is mounted before the save point, with what each boot reads
		// of it in the page cache the state saves.
		if lerr = mountLower(disks.lower); lerr == nil {
			disks.lowerMounted = true
			warmLower()
		}
	}
	logModules(log, mods.finish())
	if lerr != nil {
		cancel()
	}
	res := <-opened
	// The NIC is up in the state saved at the handshake.
	network.wait(log)
	if lerr == nil {
		lerr = res.err
	}
	if lerr != nil {
		if res.f != nil {
			res.f.Close()
		}
		return nil, nil, 0, time.Time{}, lerr
	}
	closePort := true
	defer func() {
		if closePort {
			res.f.Close()
		}
	}()
	w, err := wakeHandshake(ctx, res.f, systemWake)
	if err != nil {
		return nil, nil, 0, time.Time{}, err
	}
	woke = time.Now()
	// A VM resumed from a saved state logs nothing before this line: it
	// shows on its console how far a start that hangs got.
	log.Info("woken", "clock_set", w.ClockUnixNano > 0, "seed_bytes", len(w.Seed))
	// From here on the storage time is this VM's own (the part before the
	// save point may have run in another VM).
	storage.took = 0
	if disks.upper != "" {
		// The per-VM disk is another file than the saved VM's; the root
		// image, mounted before the save, is the same.
		if err := flushBlockDevice(disks.upper); err != nil {
			return nil, nil, 0, time.Time{}, err
		}
		if err := storage.assemble(disks); err != nil {
			return nil, nil, 0, time.Time{}, err
		}
	}
	s, err := guestchan.Client(newParkablePort(res.f), log)
	if err != nil {
		return nil, nil, 0, time.Time{}, err
	}
	closePort = false
	return s, storage, res.took, woke, nil
}

// openChannel opens the channel of kind; a serial one's session runs on a
// parkablePort, so that a suspend can end it and keep the port.
func openChannel(ctx context.Context, kind guestchan.Kind, log *slog.Logger) (guestchan.Channel, error) {
	if kind != guestchan.KindSerial && kind != "" {
		return guestchan.OpenGuest(ctx, kind, log)
	}
	f, err := guestchan.OpenVirtioPort(ctx, guestchan.VirtioPortName)
	if err != nil {
		return nil, err
	}
	s, err := guestchan.Client(newParkablePort(f), log)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// logModules logs how the module loading went, in one line.
func logModules(log *slog.Logger, report moduleReport) {
	log.Info("kernel modules loaded", "loaded", report.loaded, "failed", len(report.failed), "ms", report.elapsed.Milliseconds(),
		"slowest", slowest(report.times, 6), "skipped_no_device", strings.Join(report.skipped, ","),
		"bus_reads", report.busReads, "bus_read_ms", report.busTime.Milliseconds(), "chains", report.chains, "parallel", report.workers)
}

// channelModules are the drivers a channel kind needs before it opens.
func channelModules(kind guestchan.Kind) []string {
	switch kind {
	case guestchan.KindVsock:
		return []string{"vmw_vsock_virtio_transport"}
	default:
		return []string{"virtio_console"}
	}
}

// dialRetry dials port until it answers, with backoff (10 ms doubling to
// 500 ms), bounded by ctx: the host may not listen yet when the guest is fast.
func dialRetry(ctx context.Context, ch guestchan.Channel, port uint32) (net.Conn, error) {
	delay := 10 * time.Millisecond
	for {
		c, err := ch.Dial(ctx, port)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("port %d: %w (last error: %w)", port, ctx.Err(), err)
		case <-ch.Done():
			return nil, fmt.Errorf("port %d: the channel closed (last error: %w)", port, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// ensureSymlinks makes capsem-mcp-server and capsem-doctor reach this binary
// when the image did not already provide them.
func ensureSymlinks(log *slog.Logger) {
	self, err := os.Executable()
	if err != nil {
		return
	}
	for _, l := range guestSymlinks {
		if _, err := os.Lstat(l); err == nil {
			continue
		}
		os.MkdirAll(filepath.Dir(l), 0o755)
		if err := os.Symlink(self, l); err != nil {
			log.Debug("creating a guest symlink", "link", l, "err", err)
		}
	}
}
