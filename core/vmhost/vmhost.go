// Package vmhost is the per-VM engine on the host: it boots one VM from the
// guest assets (resuming the saved boot of its configuration when there is
// one), owns its machine, the guest channel and control protocol, the MCP
// endpoint on the guest's MCP port with its aggregator and the session
// ledger, and serves the per-VM API (exec, files, logs, info, stop) on a
// 0600 Unix socket. `capsem process` runs one VM with it; the service
// (and capsem doctor's check VM) start such processes through Launch.
//
// The machine is used through vmm's interfaces: a backend that decides the
// accelerator once (vmm.AccelBackend), and, for saved boots, machines that
// can save their state, name the configuration a state depends on and run
// the wake handshake on the raw channel (vmm.StateSaver, vmm.StateKeyer,
// vmm.ChannelHooker). A backend without them boots every VM.
package vmhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/httpserve"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/unixsock"
	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm"
)

// Options configure Boot.
type Options struct {
	// Backend makes the VM's machines.
	Backend vmm.AccelBackend
	// Firmware is the BIOS image for the spec ("" is the backend's default).
	Firmware   string
	SessionDir string
	APISocket  string
	Name       string
	// ID is the VM's id (ProcessConfig.ID): its boot config's VMID.
	ID string
	// VMConfig is the VM's configuration (ProcessConfig.VM: defaults
	// filled in, base matching RootImage).
	api.VMConfig
	// RootImage is the read-only root image (EROFS) under the per-VM
	// disk's layer; "" keeps the minimal root, the initramfs.
	RootImage string
	// TCGCacheMiB bounds the TCG translation cache (vmm.Spec.TCGCacheMiB).
	TCGCacheMiB int
	// ConsoleLogMaxBytes bounds the console log (vmm.Spec.ConsoleLogMaxBytes).
	ConsoleLogMaxBytes int64
	GuestBinary        string
	// NoBootState boots the VM, neither resuming a saved state nor saving
	// one (as CAPSEM_BOOT_STATE=off does).
	NoBootState bool
	// Suspended resumes the VM from the state its suspend saved in its
	// session, or fails saying why.
	Suspended bool
	// BootStateDir is where saved boots live; "" means the guest assets'
	// own (boot-states/<key> of the minimal root, removed with it), so new
	// assets never meet old states.
	BootStateDir string
	// NetLoopbackOnly lets the VM's network dial loopback addresses only
	// (tests: every other dial is refused and logged).
	NetLoopbackOnly bool
	// Stage, when not nil, is told each stage of the start as it begins
	// (guest assets, accelerator, boot or resume), for the caller to
	// show; `capsem process` reports them on its readiness pipe.
	Stage  func(stage string)
	Logger *slog.Logger
}

// VM is a booted guest and everything the process owns for it.
type VM struct {
	opts    Options
	session paths.Session
	log     *slog.Logger
	ledger  *ledger.Ledger
	gw      *mcpgw.Gateway
	// gwReady is gw once started, for the network stack's goroutines.
	gwReady atomic.Pointer[mcpgw.Gateway]
	machine vmm.Machine
	ws      *workspace
	// upper is the per-VM disk (ID "": none) and wsDir the workspace's
	// host directory: what a fork copies.
	upper vmm.Disk
	wsDir string
	// forkMu keeps forks of the VM one at a time.
	forkMu sync.Mutex
	// ownStateKeyArgv is the key of its own states (a suspend, a memory
	// fork's): vmm.StateKeyer.OwnStateKey.
	ownStateKeyArgv []string
	// suspended: Suspend saved the VM and parked its guest; the stop that
	// follows does not ask the guest to power off.
	suspended atomic.Bool
	net       *network // nil: no NIC
	netCA     credentialCA
	// tracedExecs counts the commands with a trace id running now.
	tracedExecs atomic.Int64
	ctl         control
	hello       guestwire.Hello
	accel       vmm.Accel
	timings     map[string]int64
	start       StartMode // how the VM started (resumed: the guest's boot timings are the saved boot's)

	stopOnce sync.Once
	stopping atomic.Bool // Stop began: the machine exiting from now on is expected
	stopped  chan struct{}
	// endLife ends the VM's supervision of its control connection (set
	// once Boot succeeded).
	endLife context.CancelFunc
	// lost is closed, with lostErr set, when the guest can no longer be
	// reached at all (its channel closed, or QEMU exited unasked): the VM
	// is then stopped.
	lostOnce sync.Once
	lost     chan struct{}
	lostErr  error
	// consoleStart is the console log's size when the machine started:
	// what follows is this boot's output (consolePanic).
	consoleStart int64
}

// Boot prepares assets, starts the VM and waits for the guest agent; the
// VM is ready for exec when it returns. On failure nothing of the VM is
// left running.
func Boot(ctx context.Context, o Options) (*VM, error) {
	if o.Backend == nil {
		return nil, errors.New("vmhost: no VM backend")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	t0 := time.Now()
	v := &VM{opts: o, session: paths.Session{Dir: o.SessionDir}, log: o.Logger, timings: map[string]int64{}, stopped: make(chan struct{}), lost: make(chan struct{})}
	if err := os.MkdirAll(o.SessionDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating session directory: %w", err)
	}
	assets, verified, err := v.prepareAssets(ctx)
	if err != nil {
		return nil, err
	}
	t := v.mark("assets", t0)
	sources, err := mcpgw.SourcesFor(o.Config, !o.NoAutodetect)
	if err != nil {
		return nil, err
	}
	// A bad configuration fails now, before any VM exists (the gateway
	// that uses it starts after the boot).
	merged, err := config.LoadHierarchy(sources)
	if err != nil {
		return nil, err
	}
	var trustEnv map[string]string
	var trustCA, extraRoots []byte
	if !o.NoNetwork {
		// The credentials configured at boot give the guest its
		// placeholders and the CA; a reload changes what the host does
		// with them, the guest's side waits for the next boot.
		if trustEnv, trustCA, err = v.netCA.guestTrust(merged.Net.Credentials()); err != nil {
			return nil, err
		}
		if extraRoots = guestRoots(v.log, merged.Net.GuestRoots()); len(extraRoots) > 0 && trustEnv == nil {
			trustEnv = guestwire.TrustEnv()
		}
	}
	t = v.mark("config", t)
	// The ledger opens beside the boot: nothing writes to it before the
	// guest's Hello, so creating it (SQLite, WAL, schema) need not be on
	// the boot's critical path. It is joined before the VM counts as
	// ready, and on every failure before that.
	ledgerOpened := v.openLedger(ctx)
	ledgerJoined := false
	ok := false
	defer func() {
		if !ok {
			if !ledgerJoined {
				v.joinLedger(ledgerOpened) // so that teardown closes it
			}
			v.teardown(context.WithoutCancel(ctx))
		}
	}()
	spec, canSave, err := v.spec(ctx, assets)
	if err != nil {
		return nil, err
	}
	v.mark("disk", t)
	if o.Suspended {
		v.restorePins()
	}
	if err := v.startMachine(ctx, spec, assets.BootStateDir, canSave); err != nil {
		return nil, err
	}
	if v.start == ModeResumeSuspended {
		v.finishResume()
	}
	v.recordGuestTimings()
	if err := verified(); err != nil {
		return nil, fmt.Errorf("guest assets failed verification during the boot (the next start rebuilds them): %w", err)
	}
	ledgerJoined = true
	t = time.Now()
	if err := v.joinLedger(ledgerOpened); err != nil {
		return nil, err
	}
	t = v.mark("ledger_join", t)
	if err := v.ctl.client.SendBootConfig(ctx, &guestwire.BootConfig{Hostname: o.Name, VMID: o.ID, ClockUnixNano: time.Now().UnixNano(), Env: trustEnv, TrustCA: trustCA, ExtraRoots: extraRoots}); err != nil {
		return nil, fmt.Errorf("sending boot config: %w", err)
	}
	t = v.mark("boot_config", t)
	if err := v.startGateway(ctx, sources); err != nil {
		return nil, err
	}
	v.mark("gateway", t)
	if v.net != nil {
		v.net.ports.serve()
	}
	v.timings["total"] = time.Since(t0).Milliseconds()
	v.log.Info("VM ready", "start", v.start.String(), "timings_ms", v.timings, "agent", v.hello.AgentVersion)
	ok = true
	life, endLife := context.WithCancel(context.WithoutCancel(ctx))
	v.endLife, v.ctl.done = endLife, make(chan struct{})
	go v.superviseControl(life, v.loseGuest)
	return v, nil
}

// mark records how long stage took since since and returns now.
func (v *VM) mark(stage string, since time.Time) time.Time {
	now := time.Now()
	v.timings[stage] = now.Sub(since).Milliseconds()
	return now
}

// prepareAssets returns the guest assets, built or checked, and a function
// that reports whether every byte the VM boots from hashed right. That
// hash runs beside the boot (off its critical path), and the VM is ready
// only once it passed: a file corrupted in place (no identity change, say
// a disk error) never runs a command.
func (v *VM) prepareAssets(ctx context.Context) (*guestfs.Assets, func() error, error) {
	guestBin := v.opts.GuestBinary
	if guestBin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, nil, err
		}
		guestBin = filepath.Join(filepath.Dir(self), "capsem-guest")
	}
	dir, err := paths.AssetsDir()
	if err != nil {
		return nil, nil, err
	}
	// Ensure checks every cached file against its manifest's sha256 before
	// handing it out (a mismatch rebuilds): it re-reads a file only when its
	// identity (inode, size, mtime, ctime) changed since its last full hash.
	v.stage("checking the guest assets")
	progress := io.MultiWriter(os.Stderr, &logs.LineWriter{Line: func(l string) { v.stage(api.StageAssets + l) }})
	assets, err := guestfs.Ensure(ctx, guestfs.Options{Dir: dir, GuestBinary: guestBin, Progress: progress, Logger: v.log})
	if err != nil {
		return nil, nil, fmt.Errorf("guest assets: %w", err)
	}
	done := make(chan error, 1)
	var ms atomic.Int64
	go func() {
		t := time.Now()
		err := assets.VerifyBootFiles()
		ms.Store(time.Since(t).Milliseconds())
		done <- err
	}()
	return assets, func() error {
		err := <-done
		v.timings["asset_hash"] = ms.Load()
		return err
	}, nil
}

// stage tells the caller that a stage of the start begins.
func (v *VM) stage(s string) {
	if v.opts.Stage != nil {
		v.opts.Stage(s)
	}
}

type openedLedger struct {
	led *ledger.Ledger
	err error
	ms  int64
}

func (v *VM) openLedger(ctx context.Context) <-chan openedLedger {
	opened := make(chan openedLedger, 1)
	go func() {
		t := time.Now()
		led, err := ledger.Open(ctx, v.session.DB(), ledger.Options{})
		opened <- openedLedger{led, err, time.Since(t).Milliseconds()}
	}()
	return opened
}

func (v *VM) joinLedger(opened <-chan openedLedger) error {
	r := <-opened
	if r.err != nil {
		return fmt.Errorf("opening session ledger: %w", r.err)
	}
	v.ledger, v.timings["ledger"] = r.led, r.ms
	return nil
}

// spec is the VM's machine spec, with its storage prepared; canSave says
// whether a boot of it may be saved for others (its disk is new, so the
// saved kernel has cached nothing of a user's disk).
func (v *VM) spec(ctx context.Context, assets *guestfs.Assets) (vmm.Spec, bool, error) {
	o := v.opts
	disks, wsDir, storageArgs, diskCreated, err := prepareStorage(ctx, v.log, storageRequest{sessionDir: o.SessionDir, diskGiB: o.Disk(), rootImage: o.RootImage, workspaceDir: o.Workspace})
	if err != nil {
		return vmm.Spec{}, false, err
	}
	v.wsDir = wsDir
	for _, d := range disks {
		if d.ID == guestwire.UpperDiskID {
			v.upper = d
		}
	}
	if v.ws, err = openWorkspace(ctx, v, wsDir); err != nil {
		return vmm.Spec{}, false, err
	}
	var nic *vmm.Network
	if o.NoNetwork && len(o.Ports) > 0 {
		return vmm.Spec{}, false, fmt.Errorf("published port %s: the VM has no network (--no-network)", o.Ports[0])
	}
	if !o.NoNetwork {
		if v.net, err = openNetwork(v); err != nil {
			return vmm.Spec{}, false, err
		}
		for _, m := range o.Ports {
			if _, err := v.net.ports.add(m); err != nil {
				return vmm.Spec{}, false, err
			}
		}
		nic = &vmm.Network{MAC: guestwire.NetGuestMAC, MTU: o.NetMTU}
		storageArgs += networkCmdline
	}
	spec := vmm.Spec{
		Name:               o.Name,
		Kernel:             assets.Kernel,
		Initramfs:          assets.Initramfs,
		Cmdline:            "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init capsem.channel=serial" + storageArgs,
		CPUs:               o.CPUs,
		MemoryMiB:          o.RAMMB,
		TCGCacheMiB:        o.TCGCacheMiB,
		ConsoleLogMaxBytes: o.ConsoleLogMaxBytes,
		Disks:              disks,
		Ports:              []string{guestwire.WorkspacePort},
		Network:            nic,
		ChannelSocket:      v.session.ChannelSocket(),
		ConsoleLog:         v.session.ConsoleLog(),
		Firmware:           o.Firmware,
	}
	return spec, diskCreated || o.Disk() == 0, nil
}

// recordGuestTimings adds the parts of kernel_to_hello the guest measured:
// the kernel's own boot, module loading, the root switch and workspace
// mount, and reaching the host's control port. A resumed VM ran only the
// part after the wake itself.
func (v *VM) recordGuestTimings() {
	v.hello = v.ctl.client.Hello()
	b := v.hello.Boot
	if v.start != ModeResume {
		v.timings["guest_kernel_to_init"] = b.KernelToInitMS
		v.timings["guest_modules"] = b.ModulesMS
		v.timings["guest_channel"] = b.ChannelMS
	}
	if b.StorageMS > 0 {
		v.timings["guest_storage"] = b.StorageMS // after the wake: this VM's own
	}
	if b.AfterWakeMS > 0 {
		v.timings["guest_after_wake"] = b.AfterWakeMS
	}
}

// startGateway starts the MCP gateway (aggregator, builtin, MCP servers)
// and serves the guest's MCP port. It starts only now: on a small host its
// processes would take CPU from the vCPUs during the boot, and the guest
// cannot reach the port before this point anyway.
func (v *VM) startGateway(ctx context.Context, sources config.Sources) error {
	t := time.Now()
	var err error
	v.gw, err = mcpgw.Start(ctx, mcpgw.Options{SessionDir: v.opts.SessionDir, Sources: sources, Ledger: v.ledger,
		Protect: []string{v.opts.APISocket, v.session.ChannelSocket()}, Logger: v.log, Kind: "vm", Name: v.opts.Name})
	if err != nil {
		return err
	}
	v.gwReady.Store(v.gw)
	mcpLn, err := v.machine.Channel().Listen(guestchan.PortMCP)
	if err != nil {
		return fmt.Errorf("listening for guest MCP: %w", err)
	}
	go v.gw.Serve(ctx, mcpLn)
	v.mark("ready", t)
	return nil
}

// gateway is the MCP gateway once started (nil before), safe from any
// goroutine.
func (v *VM) gateway() *mcpgw.Gateway { return v.gwReady.Load() }

// ReloadOnSignal reloads the gateway's configuration on every SIGHUP.
func (v *VM) ReloadOnSignal(ctx context.Context) { v.gw.ReloadOnSignal(ctx) }

// Stop shuts the guest down cleanly (bounded), then makes sure the machine
// is gone and everything the process owns is closed. Safe to call more
// than once.
func (v *VM) Stop(ctx context.Context) {
	v.stopOnce.Do(func() {
		v.stopping.Store(true)
		if v.endLife != nil {
			v.endLife()
			<-v.ctl.done
		}
		v.teardown(ctx)
		close(v.stopped)
	})
}

// loseGuest stops the VM for good reason: the guest cannot be reached.
func (v *VM) loseGuest(err error) {
	v.lostOnce.Do(func() {
		v.lostErr = err
		close(v.lost)
	})
}

func (v *VM) teardown(ctx context.Context) {
	// Once Stop has ended the supervision (or before Boot started it),
	// the connection changes no more.
	ctl := v.control()
	if ctl != nil && v.machine != nil && v.unresponsive() == "" && !v.suspended.Load() {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := ctl.Shutdown(sctx); err != nil {
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
			v.log.Warn("stopping the VM", "err", err)
		}
		cancel()
	}
	if ctl != nil {
		ctl.Close()
	}
	if v.gw != nil {
		v.gw.Close()
	}
	if v.ws != nil {
		v.ws.close()
	}
	if v.net != nil {
		v.net.close()
	}
	if v.ledger != nil {
		v.ledger.Close()
	}
}

// ServeAPI serves the per-VM API on a 0600 Unix socket until the VM stops,
// the machine exits, or ctx is done; then it stops the VM. listening runs
// once the socket accepts connections.
func (v *VM) ServeAPI(ctx context.Context, sock string, listening func()) error {
	ln, err := unixsock.Listen(sock)
	if err != nil {
		v.Stop(context.WithoutCancel(ctx))
		return err
	}
	srv := httpserve.New(v.routes(), httpserve.Options{Log: v.log})
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
			exitErr = errors.New("the VM exited unexpectedly")
			v.log.Error("the VM exited", "err", v.machine.Wait())
			// Before the stop: calls cut off meanwhile tell the guest's
			// going away from a stop asked for (cutOff).
			v.loseGuest(exitErr)
		}
	case <-v.lost:
		exitErr = v.lostErr
		v.log.Error("stopping the VM: its guest cannot be reached", "err", v.lostErr)
	}
	v.Stop(context.WithoutCancel(ctx))
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return exitErr
}
