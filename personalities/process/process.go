// Package process is the per-VM process (`capsem process`, hidden): it owns
// one VM's QEMU child, the guest channel and control protocol, the MCP
// endpoint on logical port 5002 with its aggregator, the session ledger, and
// a 0600 Unix-socket API for exec, files, info and stop.
package process

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestctl"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/unixsock"
	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/qemu"
	"golang.org/x/sys/unix"
)

// Cmd is `capsem process`.
type Cmd struct {
	SessionDir   string `required:"" type:"path" help:"Session directory (session.db, console log, sockets)."`
	Socket       string `required:"" type:"path" help:"Unix socket for this process's API (created 0600)."`
	Name         string `help:"VM name (hostname in the guest)." default:"capsem"`
	Config       string `optional:"" type:"path" help:"TOML with [mcp] policy and [[mcp.servers]]; replaces $CAPSEM_HOME/user.toml (corp.toml still applies)."`
	NoAutodetect bool   `help:"Do not add the mcpServers of Claude Code and Gemini CLI settings."`
	CPUs         int    `default:"2" help:"Virtual CPUs."`
	MemoryMiB    int    `name:"memory-mib" default:"1024" help:"Guest memory in MiB."`
	GuestBin     string `name:"guest-binary" type:"path" help:"CGO-free capsem build for /init (default: capsem-guest next to this executable)."`
	DiskGiB      int    `name:"disk-gib" default:"8" help:"Size of the per-VM disk (sparse) created in the session directory when missing; 0: none, the guest runs from RAM."`
	NoBootState  bool   `name:"no-boot-state" help:"Boot the VM: neither resume the saved boot of its configuration nor save one (also CAPSEM_BOOT_STATE=off)."`
	BootStateDir string `name:"boot-state-dir" type:"path" hidden:"" help:"Where saved boots live (default: boot-states/ beside the guest assets)."`
	ReadyFD      int    `name:"ready-fd" default:"-1" hidden:"" help:"Inherited file descriptor to write api.ReadyLine on, then close, once the API accepts connections (the parent waits on it instead of polling)."`
}

// Run boots the VM and serves until it stops.
func (c *Cmd) Run(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.Default().With("vm", c.Name)
	notify := func() {}
	if c.ReadyFD >= 0 {
		// Not for QEMU or the gateway's children: the parent must see the
		// pipe close when this process dies. A raw descriptor, not an
		// *os.File, whose finalizer could close it early: on a failure it
		// stays open until the process exits, after the error is written.
		fd := c.ReadyFD
		unix.CloseOnExec(fd)
		notify = func() {
			if _, err := unix.Write(fd, []byte(api.ReadyLine)); err != nil {
				log.Warn("writing the readiness line", "fd", fd, "err", err)
			}
			unix.Close(fd)
		}
	}
	v, err := Boot(ctx, c.options(log))
	if err != nil {
		return err
	}
	v.gw.ReloadOnSignal(ctx)
	return v.ServeAPI(ctx, c.Socket, notify)
}

func (c *Cmd) options(log *slog.Logger) Options {
	return Options{SessionDir: c.SessionDir, APISocket: c.Socket, Name: c.Name, ConfigPath: c.Config, NoAutodetect: c.NoAutodetect,
		CPUs: c.CPUs, MemoryMiB: c.MemoryMiB, GuestBinary: c.GuestBin, DiskGiB: c.DiskGiB, Logger: log,
		NoBootState: c.NoBootState, BootStateDir: c.BootStateDir}
}

// Options configure Boot.
type Options struct {
	SessionDir string
	APISocket  string
	Name       string
	ConfigPath string
	// NoAutodetect leaves AI CLI settings out of the configuration.
	NoAutodetect bool
	CPUs         int
	MemoryMiB    int
	GuestBinary  string
	// NoBootState boots the VM, neither resuming a saved state nor saving
	// one (as CAPSEM_BOOT_STATE=off does).
	NoBootState bool
	// BootStateDir is where saved boots live; "" means boot-states/ in
	// the guest assets' directory, so new assets never meet old states.
	BootStateDir string
	// DiskGiB sizes the per-VM disk (SessionDir/disk.img) when it has to
	// be created; an existing one is reused. 0 means no disk.
	DiskGiB int
	Logger  *slog.Logger
}

// VM is a booted guest and everything the process owns for it.
type VM struct {
	opts    Options
	log     *slog.Logger
	ledger  *ledger.Ledger
	gw      *mcpgw.Gateway
	machine vmm.Machine
	ctl     *guestctl.Client
	hello   guestwire.Hello
	accel   qemu.Accel
	timings map[string]int64
	start   string // StartBooted, StartBootedSaved or StartRestored
	resumed bool   // from a saved state: the guest's boot timings are the saved boot's

	stopOnce sync.Once
	stopping atomic.Bool // Stop began: QEMU exiting from now on is expected
	stopped  chan struct{}
}

// Boot prepares assets, starts QEMU and waits for the guest agent.
func Boot(ctx context.Context, o Options) (*VM, error) {
	t0 := time.Now()
	var verifyMS atomic.Int64
	timings := map[string]int64{}
	mark := func(stage string, since time.Time) time.Time {
		now := time.Now()
		timings[stage] = now.Sub(since).Milliseconds()
		return now
	}
	if err := os.MkdirAll(o.SessionDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating session directory: %w", err)
	}
	guestBin := o.GuestBinary
	if guestBin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		guestBin = filepath.Join(filepath.Dir(self), "capsem-guest")
	}
	home, err := paths.Home()
	if err != nil {
		return nil, err
	}
	// Ensure checks every cached file against its manifest's sha256 before
	// handing it out (a mismatch rebuilds): it re-reads a file only when its
	// identity (inode, size, mtime, ctime) changed since its last full hash.
	assets, err := guestfs.Ensure(ctx, guestfs.Options{Dir: filepath.Join(home, "assets"), GuestBinary: guestBin, Progress: os.Stderr, Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("guest assets: %w", err)
	}
	t := mark("assets", t0)
	// And every byte the VM boots from is hashed again, beside the boot
	// (off its critical path): the VM is ready only once that passed, so
	// a file corrupted in place (no identity change, say a disk error)
	// never runs a command.
	bootFilesOK := make(chan error, 1)
	go func() {
		t := time.Now()
		err := assets.VerifyBootFiles()
		verifyMS.Store(time.Since(t).Milliseconds())
		bootFilesOK <- err
	}()

	sources, err := mcpgw.SourcesFor(o.ConfigPath, !o.NoAutodetect)
	if err != nil {
		return nil, err
	}
	// A bad configuration fails now, before any VM exists (the gateway
	// that uses it starts after the boot).
	if _, err := config.LoadHierarchy(sources); err != nil {
		return nil, err
	}
	t = mark("config", t)
	// The ledger opens beside the boot: nothing writes to it before the
	// guest's Hello, and creating it (SQLite, WAL, schema) took 8–26 ms on
	// the critical path here. It is joined before the VM counts as ready,
	// and on every failure before that.
	type openedLedger struct {
		led *ledger.Ledger
		err error
		ms  int64
	}
	ledgerOpened := make(chan openedLedger, 1)
	go func() {
		t := time.Now()
		led, err := ledger.Open(ctx, filepath.Join(o.SessionDir, "session.db"), ledger.Options{})
		ledgerOpened <- openedLedger{led, err, time.Since(t).Milliseconds()}
	}()
	v := &VM{opts: o, log: o.Logger, timings: timings, stopped: make(chan struct{})}
	ledgerJoined := false
	joinLedger := func() error {
		ledgerJoined = true
		r := <-ledgerOpened
		if r.err != nil {
			return fmt.Errorf("opening session ledger: %w", r.err)
		}
		v.ledger, timings["ledger"] = r.led, r.ms
		return nil
	}
	ok := false
	defer func() {
		if !ok {
			if !ledgerJoined {
				joinLedger() // so that teardown closes it
			}
			v.teardown(context.WithoutCancel(ctx))
		}
	}()
	chanSock := filepath.Join(o.SessionDir, "channel.sock")

	t = time.Now()
	disks, shares, storageArgs, diskCreated, err := prepareStorage(ctx, o.Logger, o.SessionDir, o.DiskGiB)
	if err != nil {
		return nil, err
	}
	t = mark("disk", t)

	spec := vmm.Spec{
		Name:          o.Name,
		Kernel:        assets.Kernel,
		Initramfs:     assets.Initramfs,
		Cmdline:       "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init capsem.channel=serial" + storageArgs,
		CPUs:          o.CPUs,
		MemoryMiB:     o.MemoryMiB,
		Disks:         disks,
		Shares:        shares,
		ChannelSocket: chanSock,
		ConsoleLog:    filepath.Join(o.SessionDir, "console.log"),
		Firmware:      qemu.PreferredFirmware(),
	}
	verdicts, err := paths.AccelVerdict()
	if err != nil {
		return nil, err
	}
	backend := &qemu.Backend{Log: o.Logger, VerdictPath: verdicts}
	canSave := diskCreated || o.DiskGiB == 0
	files := qemu.BootFiles{Kernel: spec.Kernel, Initramfs: spec.Initramfs, Firmware: spec.Firmware}
	start, err := startFallingBackToTCG(o.Logger,
		func(accel string) (string, error) {
			s := spec
			s.Accel = accel
			return v.startWithSavedBoots(ctx, backend, s, assets.Dir, canSave)
		},
		func() (qemu.Accel, bool) { return v.accel, v.ctl != nil },
		func(why error) error { return backend.DemoteKVM(ctx, files, why) })
	if err != nil {
		return nil, err
	}
	v.start = start
	v.hello = v.ctl.Hello()
	// Parts of kernel_to_hello, as the guest measured them: the kernel's
	// own boot, module loading, the root switch and workspace mount, and
	// reaching the host's control port. A resumed VM ran only the part
	// after the wake itself.
	if !v.resumed {
		timings["guest_kernel_to_init"] = v.hello.Boot.KernelToInitMS
		timings["guest_modules"] = v.hello.Boot.ModulesMS
		timings["guest_channel"] = v.hello.Boot.ChannelMS
	}
	if v.hello.Boot.StorageMS > 0 {
		timings["guest_storage"] = v.hello.Boot.StorageMS // after the wake: this VM's own
	}
	if v.hello.Boot.AfterWakeMS > 0 {
		timings["guest_after_wake"] = v.hello.Boot.AfterWakeMS
	}
	if err := <-bootFilesOK; err != nil {
		return nil, fmt.Errorf("guest assets failed verification during the boot (the next start rebuilds them): %w", err)
	}
	timings["asset_hash"] = verifyMS.Load()
	if err := joinLedger(); err != nil {
		return nil, err
	}
	if err := v.ctl.SendBootConfig(ctx, &guestwire.BootConfig{Hostname: o.Name, ClockUnixNano: time.Now().UnixNano()}); err != nil {
		return nil, fmt.Errorf("sending boot config: %w", err)
	}
	// The gateway (aggregator, builtin, MCP servers) starts only now: on a
	// small host its processes would take CPU from QEMU's vCPUs during the
	// boot, and the guest cannot reach port 5002 before this point anyway.
	t = time.Now()
	v.gw, err = mcpgw.Start(ctx, mcpgw.Options{SessionDir: o.SessionDir, Sources: sources, Ledger: v.ledger,
		Protect: []string{o.APISocket, chanSock}, Logger: o.Logger, Kind: "vm", Name: o.Name})
	if err != nil {
		return nil, err
	}
	mcpLn, err := v.machine.Channel().Listen(guestchan.PortMCP)
	if err != nil {
		return nil, fmt.Errorf("listening for guest MCP: %w", err)
	}
	go v.gw.Serve(ctx, mcpLn)
	mark("ready", t)
	timings["total"] = time.Since(t0).Milliseconds()
	v.log.Info("VM ready", "start", start, "timings_ms", timings, "agent", v.hello.AgentVersion)
	ok = true
	return v, nil
}

// startFallingBackToTCG runs start with the accelerator left to the
// backend's decision. When that start failed under KVM that was not forced
// and before the guest spoke (used says what the last start ran under and
// whether the guest spoke), KVM passed its proof yet cannot run this VM: a
// VM never fails to start for the accelerator's sake, so demote records
// that (later VMs go straight to TCG) and start runs once more under TCG.
func startFallingBackToTCG(log *slog.Logger, start func(accel string) (string, error),
	used func() (qemu.Accel, bool), demote func(error) error) (string, error) {
	how, err := start("")
	accel, spoke := used()
	if err == nil || spoke || accel.Name != vmm.AccelKVM || accel.Forced {
		return how, err
	}
	log.Warn("the VM did not start under KVM; retrying once under TCG", "err", err)
	if derr := demote(err); derr != nil {
		log.Warn("recording the KVM failure", "err", derr)
		return start(vmm.AccelTCG)
	}
	// The decision now reads the demoted verdict, and says why.
	return start("")
}

// startWithSavedBoots starts the guest of spec, resuming the saved boot of
// its configuration (QEMU's argv, so the accelerator and CPU model too)
// when there is one; as the first of its configuration (only when canSave:
// its disk is new, so the saved kernel has cached nothing of a user's
// disk), by booting a VM to save that state, then resuming; or by booting.
// It returns how the VM started (Start*).
func (v *VM) startWithSavedBoots(ctx context.Context, backend *qemu.Backend, spec vmm.Spec, assetsDir string, canSave bool) (string, error) {
	o := v.opts
	accel, err := backend.ChooseAccel(ctx, spec.Accel, qemu.BootFiles{Kernel: spec.Kernel, Initramfs: spec.Initramfs, Firmware: spec.Firmware})
	if err != nil {
		return "", fmt.Errorf("creating the VM: %w", err)
	}
	// Decided once: every machine below runs with this accelerator and
	// CPU model, which the argv keying the saved boot names.
	v.accel = accel
	v.log.Info("accelerator", "accel", accel.Name, "cpu", accel.CPU, "reason", accel.Reason)
	// Saved boots are keyed by the argv of a VM that does the handshake.
	pm, err := backend.CreateWithAccel(withWake(spec), accel)
	if err != nil {
		return "", fmt.Errorf("creating the VM: %w", err)
	}
	start, savedBoot, meta := StartBooted, (*bootState)(nil), (*bootStateMeta)(nil)
	if o.NoBootState || os.Getenv(BootStateEnv) == "off" {
		v.log.Info("saved VM states are off", "env", BootStateEnv)
	} else if savedBoot, err = newBootState(cmp.Or(o.BootStateDir, filepath.Join(assetsDir, "boot-states")), pm.Argv(), o.SessionDir); err != nil {
		v.log.Warn("VM states cannot be saved or restored", "err", err)
	} else if m, ok := savedBoot.lookup(); ok {
		start, meta = StartRestored, m
	} else if canSave {
		start = StartBootedSaved
	}
	justSaved := false
	for {
		t := time.Now()
		err = v.startGuest(ctx, backend, spec, start, savedBoot, meta)
		if errors.Is(err, errSaved) {
			// The VM that booted served only to be saved (it was stopped
			// at its save point, before anything of this VM): this VM
			// resumes from the state like every later one, and so has
			// only the guest RAM it uses (the save read all of it).
			v.timings["boot_and_save"] = time.Since(t).Milliseconds()
			justSaved = true
			if m, ok := savedBoot.lookup(); ok {
				start, meta = StartRestored, m
			} else { // replaced and removed by a concurrent first start
				v.log.Warn("the boot saved a moment ago is gone; booting")
				start = StartBooted
			}
			continue
		}
		if err == nil || start != StartRestored || v.ctl != nil {
			break
		}
		// The state was refused (its hash did not match: the guest was
		// never woken, so it touched nothing of this VM) or the guest
		// never spoke (QEMU could not load it). Drop it and boot; save
		// again unless this very start just saved it.
		v.log.Warn("resuming the saved boot failed; removing it and booting", "err", err, "state", savedBoot.statePath(meta))
		savedBoot.remove(meta)
		start, meta = StartBooted, nil
		if canSave && !justSaved {
			start = StartBootedSaved
		}
	}
	if err != nil {
		return "", err
	}
	v.resumed = start == StartRestored
	if justSaved && start == StartRestored {
		return StartBootedSaved, nil
	}
	return start, nil
}

// startGuest creates and starts the machine for spec as start says, does
// the host side of the wake handshake, and waits for the guest's Hello.
// Restoring, it hashes the saved state while QEMU loads it, and wakes the
// guest only once the hash matched. On failure v.machine is stopped, and
// v.ctl is set only if the guest had spoken.
func (v *VM) startGuest(ctx context.Context, backend *qemu.Backend, spec vmm.Spec, start string,
	savedBoot *bootState, meta *bootStateMeta) error {
	t := time.Now()
	var checked chan stateCheck
	switch start {
	case StartRestored:
		spec.RestoreFrom = savedBoot.statePath(meta)
		checked = make(chan stateCheck, 1)
		go func() {
			t := time.Now()
			err := savedBoot.verify(meta)
			checked <- stateCheck{err: err, ms: time.Since(t).Milliseconds()}
		}()
	case StartBootedSaved:
		spec.Monitor = true
	}
	// A VM that neither saves nor resumes boots without the handshake,
	// and mounts its disk while its last modules load.
	if start != StartBooted {
		spec = withWake(spec)
	}
	qm, err := backend.CreateWithAccel(spec, v.accel)
	if err != nil {
		return fmt.Errorf("creating the VM: %w", err)
	}
	var m vmm.Machine = qm
	v.machine = m
	if start == StartBooted {
		qm.BeforeChannel = nil
	} else {
		qm.BeforeChannel = v.wakeHook(qm, start, savedBoot, checked)
	}
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("starting QEMU: %w", err)
	}
	v.timings["qemu_start"] = time.Since(t).Milliseconds()
	t = time.Now()
	hctx, cancel := context.WithTimeoutCause(ctx, helloTimeout, fmt.Errorf("the guest did not say hello within %v", helloTimeout))
	v.ctl, err = guestctl.Accept(hctx, m.Channel(), guestctl.Options{Log: v.log, HeartbeatInterval: 5 * time.Second})
	cancel()
	if err != nil {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		m.Stop(stopCtx)
		cancel()
		return fmt.Errorf("waiting for the guest agent: %w (console: %s)", err, spec.ConsoleLog)
	}
	v.timings["kernel_to_hello"] = time.Since(t).Milliseconds()
	return nil
}

// wakeHook is the host side of the wake handshake for a VM that starts as
// start says: save it at its save point (StartBootedSaved), or, resuming,
// wait for its state's hash (checked) before the wake.
func (v *VM) wakeHook(qm *qemu.Machine, start string, savedBoot *bootState, checked <-chan stateCheck) func(context.Context, net.Conn) error {
	return func(ctx context.Context, raw net.Conn) error {
		var atPoint func(context.Context) error
		if start == StartBootedSaved {
			atPoint = func(ctx context.Context) error {
				t := time.Now()
				defer func() { v.timings["save_state"] = time.Since(t).Milliseconds() }()
				path, err := savedBoot.newStatePath()
				if err == nil {
					err = qm.SaveState(ctx, path)
				}
				if err == nil {
					compactState(v.log, path)
				}
				if err == nil {
					var m *bootStateMeta
					if m, err = savedBoot.publish(path); err == nil {
						v.log.Info("saved the VM at its save point", "state", savedBoot.statePath(m), "bytes", m.Size)
						return errSaved
					}
				}
				if errors.Is(err, qemu.ErrNotResumed) {
					return err // a paused VM would never answer
				}
				// The VM itself is fine: it boots on unsaved.
				v.log.Warn("saving the VM state failed; booting on", "err", err)
				return nil
			}
		}
		if checked != nil {
			select {
			case r := <-checked:
				v.timings["state_hash"] = r.ms
				if r.err != nil {
					return fmt.Errorf("the saved boot failed verification: %w", r.err)
				}
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		return wakeGuest(ctx, raw, start != StartRestored, atPoint)
	}
}

// errSaved ends the start of a VM that booted to be saved, once its state
// is published: the VM is then started again from that state.
var errSaved = errors.New("the VM was saved at its save point")

// withWake returns spec with the kernel parameter that asks the agent for
// the wake handshake.
func withWake(spec vmm.Spec) vmm.Spec {
	spec.Cmdline += " " + guestwire.CmdlineWake + "=1"
	return spec
}

// stateCheck is the verdict on a saved state's bytes, and how long the
// hash took.
type stateCheck struct {
	err error
	ms  int64
}

// helloTimeout bounds the wait for the guest agent's hello once QEMU runs,
// so that a guest that hangs (a KVM that passed its proof but cannot run
// the whole VM) fails its start instead of waiting forever; the agent
// gives up on the channel after its own 60 s.
const helloTimeout = 90 * time.Second

// wakePointTimeout bounds the wait for the guest's save point (the
// agent gives up on its side after its own channel timeout).
const wakePointTimeout = 60 * time.Second

// wakeGuest is the host side of the wake handshake on the raw channel: when
// the guest booted, read its save_point and run atPoint (nil: nothing)
// while it waits; then send the wake, with fresh entropy and the time. A
// resumed guest said save_point before it was saved: it only gets the
// wake.
func wakeGuest(ctx context.Context, raw net.Conn, expectPoint bool, atPoint func(context.Context) error) error {
	if expectPoint {
		pctx, cancel := context.WithTimeout(ctx, wakePointTimeout)
		defer cancel()
		dl, _ := pctx.Deadline()
		raw.SetReadDeadline(dl)
		var m guestwire.Message
		err := guestwire.NewReader(raw).Read(&m)
		raw.SetReadDeadline(time.Time{})
		if err != nil {
			return fmt.Errorf("waiting for the guest's save point: %w", err)
		}
		if m.Type != guestwire.TypeSavePoint {
			return fmt.Errorf("the guest sent %q where its save point belongs", m.Type)
		}
		if atPoint != nil {
			if err := atPoint(pctx); err != nil {
				return err
			}
		}
	}
	seed := make([]byte, guestwire.MinWakeSeed)
	rand.Read(seed)
	w := &guestwire.Message{Type: guestwire.TypeWake, Wake: &guestwire.Wake{ClockUnixNano: time.Now().UnixNano(), Seed: seed}}
	if err := guestwire.NewWriter(raw).Write(w); err != nil {
		return fmt.Errorf("waking the guest: %w", err)
	}
	return nil
}

// Stop shuts the guest down cleanly (bounded), then makes sure QEMU is gone
// and everything the process owns is closed. Safe to call more than once.
func (v *VM) Stop(ctx context.Context) {
	v.stopOnce.Do(func() {
		v.stopping.Store(true)
		v.teardown(ctx)
		close(v.stopped)
	})
}

func (v *VM) teardown(ctx context.Context) {
	if v.ctl != nil && v.machine != nil {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := v.ctl.Shutdown(sctx); err != nil {
			v.log.Warn("guest shutdown request failed", "err", err)
		}
		select {
		case <-v.machine.Done():
		case <-sctx.Done():
		}
		cancel()
	}
	if v.machine != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := v.machine.Stop(sctx); err != nil {
			v.log.Warn("stopping QEMU", "err", err)
		}
		cancel()
	}
	if v.ctl != nil {
		v.ctl.Close()
	}
	if v.gw != nil {
		v.gw.Close()
	}
	if v.ledger != nil {
		v.ledger.Close()
	}
}

// ServeAPI serves the process API on a 0600 Unix socket until the VM stops,
// QEMU exits, or ctx is done; then it stops the VM. listening runs once the
// socket accepts connections.
func (v *VM) ServeAPI(ctx context.Context, sock string, listening func()) error {
	ln, err := unixsock.Listen(sock)
	if err != nil {
		v.Stop(context.WithoutCancel(ctx))
		return err
	}
	srv := &http.Server{Handler: v.routes(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	listening()
	var exitErr error
	select {
	case <-ctx.Done():
	case <-v.stopped:
	case <-v.machine.Done():
		// A requested stop powers the guest off before it closes
		// v.stopped: that exit is the stop, not a failure.
		if !v.stopping.Load() {
			exitErr = errors.New("QEMU exited unexpectedly")
			v.log.Error("QEMU exited", "err", v.machine.Wait())
		}
	}
	v.Stop(context.WithoutCancel(ctx))
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	os.Remove(sock)
	return exitErr
}
