package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/ramfile"
)

// DefaultBinary is the QEMU program, looked up in PATH.
const DefaultBinary = "qemu-system-x86_64"

// FastFirmware is qboot, the minimal BIOS Debian's qemu-system-data ships:
// it only sets up what a direct kernel boot needs (PCI, ACPI tables, the
// PVH entry) and skips SeaBIOS's drive scan and boot menu, about 100-200 ms
// of every boot under TCG here.
const FastFirmware = "/usr/share/qemu/qboot.rom"

// PreferredFirmware returns FastFirmware when it is installed, else ""
// (QEMU's default SeaBIOS).
func PreferredFirmware() string {
	if st, err := os.Stat(FastFirmware); err == nil && st.Mode().IsRegular() {
		return FastFirmware
	}
	return ""
}

// DefaultStopGrace is how long Stop waits after SIGTERM before SIGKILL.
const DefaultStopGrace = 5 * time.Second

// Backend creates QEMU machines. The zero value is ready to use.
type Backend struct {
	// Binary is the QEMU program; "" means DefaultBinary from PATH.
	Binary string
	// Log receives the backend's and QEMU's messages; nil discards.
	Log *slog.Logger
	// OpenKVM reports whether /dev/kvm opens; nil means OpenKVM. When it
	// does, KVM is still proven before use (ChooseAccel).
	OpenKVM func() error
	// Getenv reads envvars.Accel; nil means os.Getenv.
	Getenv func(string) string
	// VerdictPath caches the proof of KVM (Verdict); "" proves it at
	// every Create.
	VerdictPath string
	// ProbeTimeout bounds one KVM probe boot; 0 means probeTimeout.
	ProbeTimeout time.Duration
	// StopGrace overrides DefaultStopGrace.
	StopGrace time.Duration
}

var _ vmm.Backend = (*Backend)(nil)

func (b *Backend) binaryPath() (string, error) {
	bin := b.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("qemu: %s not found (Debian package qemu-system-x86): %w", bin, err)
	}
	return path, nil
}

func (b *Backend) log() *slog.Logger {
	if b.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Log.With("component", "vmm", "backend", "qemu")
}

func (b *Backend) getenv(k string) string {
	if b.Getenv != nil {
		return b.Getenv(k)
	}
	return os.Getenv(k)
}

func (b *Backend) openKVM() error {
	if b.OpenKVM != nil {
		return b.OpenKVM()
	}
	return OpenKVM()
}

// Name is "qemu".
func (b *Backend) Name() string { return "qemu" }

// Create validates spec, picks the accelerator (ChooseAccel: proving KVM
// when no verdict is cached; the choice is logged) and computes QEMU's
// argv. Nothing else runs until Start.
func (b *Backend) Create(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	return b.create(ctx, spec)
}

func (b *Backend) create(ctx context.Context, spec vmm.Spec) (*Machine, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	accel, err := b.ChooseAccel(ctx, spec)
	if err != nil {
		return nil, err
	}
	b.log().Info("accelerator", "vm", spec.Name, "accel", accel.Name, "cpu", accel.CPU, "reason", accel.Reason)
	return b.createWithAccel(spec, accel)
}

// CreateWithAccel is Create under an accelerator already chosen (by
// ChooseAccel, or a machine's AccelChoice), so that machines started one
// after another for one VM (a saved boot and its resume) run the same.
func (b *Backend) CreateWithAccel(spec vmm.Spec, accel Accel) (vmm.Machine, error) {
	return b.createWithAccel(spec, accel)
}

func (b *Backend) createWithAccel(spec vmm.Spec, accel Accel) (*Machine, error) {
	log := b.log().With("vm", spec.Name)
	path, err := b.binaryPath()
	if err != nil {
		return nil, err
	}
	args, err := Args(spec, accel)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	grace := b.StopGrace
	if grace <= 0 {
		grace = DefaultStopGrace
	}
	return &Machine{
		spec:  spec,
		accel: accel,
		bin:   path,
		args:  args,
		grace: grace,
		log:   log,
		done:  make(chan struct{}),
	}, nil
}

// Machine is one QEMU process and its guest channel.
type Machine struct {
	spec  vmm.Spec
	accel Accel
	bin   string
	args  []string
	grace time.Duration
	log   *slog.Logger

	// beforeChannel, when set before Start, runs on QEMU's raw channel
	// connection before the multiplexer starts on it (the wake handshake).
	beforeChannel func(ctx context.Context, raw net.Conn) error

	mu       sync.Mutex
	started  bool
	proc     *os.Process
	session  *guestchan.Session
	stopping bool

	monitorConn *net.UnixConn // our end of the QMP socket pair (spec.Monitor)
	// ports are our ends of spec.Ports' socket pairs, until Port hands
	// each out (under mu); those never taken close when QEMU is gone.
	ports map[string]net.Conn
	// network is our end of the NIC's socket pair (spec.Network), until
	// NetworkConn hands it out (under mu); closed when QEMU is gone if
	// never taken.
	network net.Conn
	console *os.File // the read end of the console pipe: copied into the console log
	// memory is the guest's RAM (a memfd QEMU maps shared): a save writes
	// it to the state's RAM file. Closed once QEMU is reaped.
	memory *os.File
	// consoleCopied is closed once the console is in its log, which QEMU's
	// exit waits for (done means the log is complete).
	consoleCopied chan struct{}
	monitorMu     sync.Mutex
	monitor       *qmp // connected on first use

	stderr   tailBuffer
	waitErr  error
	startErr error         // why Start failed after QEMU ran; set before done closes
	done     chan struct{} // closed once QEMU is reaped
}

var (
	_ vmm.AccelBackend  = (*Backend)(nil)
	_ vmm.Machine       = (*Machine)(nil)
	_ vmm.StateSaver    = (*Machine)(nil)
	_ vmm.ChannelHooker = (*Machine)(nil)
	_ vmm.StateKeyer    = (*Machine)(nil)
	_ vmm.PortHolder    = (*Machine)(nil)
	_ vmm.NetworkHolder = (*Machine)(nil)
)

// SetBeforeChannel sets the function Start runs on the raw channel
// connection before the multiplexer starts on it (vmm.ChannelHooker).
func (m *Machine) SetBeforeChannel(fn func(ctx context.Context, raw net.Conn) error) {
	m.beforeChannel = fn
}

// StateKey is QEMU's argv: a saved state resumes only in a QEMU started
// the same way (vmm.StateKeyer). Left out is what the state holds nothing
// of: the TCG cache's size (no translated code is saved) and the files and
// formats of the VM's own writable disks (no block backend state is
// saved, and a restored guest drops what its kernel cached of them), so
// a VM whose disk is a layer over an image resumes the same saved boot as
// one with a disk of its own.
func (m *Machine) StateKey() []string { return m.stateKey(false) }

// OwnStateKey is StateKey without the initramfs (vmm.StateKeyer).
func (m *Machine) OwnStateKey() []string { return m.stateKey(true) }

func (m *Machine) stateKey(own bool) []string {
	spec := m.spec
	spec.TCGCacheMiB = 0
	if own {
		// Unpacked into the guest's RAM at boot, which the state holds;
		// QEMU reads it again only to set up a machine that then loads
		// the state over it.
		spec.Initramfs = "/initramfs-in-the-guest-ram"
	}
	spec.Disks = slices.Clone(spec.Disks)
	for i, d := range spec.Disks {
		if !d.ReadOnly {
			spec.Disks[i].Path, spec.Disks[i].Format = "/vm-disk/"+d.ID, vmm.DiskRaw
		}
	}
	args, err := Args(spec, m.accel)
	if err != nil { // m.args came from the same spec
		return m.Argv()
	}
	return append([]string{m.bin}, args...)
}

// Accel is the accelerator this machine runs with ("kvm" or "tcg").
func (m *Machine) Accel() string { return m.accel.Name }

// AccelChoice is the accelerator with its CPU model and the reason.
func (m *Machine) AccelChoice() Accel { return m.accel }

// Argv is QEMU's full command line (program first).
func (m *Machine) Argv() []string { return append([]string{m.bin}, m.args...) }

// Start listens on the channel socket, starts QEMU, waits for its
// connection (bounded by ctx) and starts the host side of the guest channel
// on it. ctx also bounds the machine's life: when it ends QEMU is stopped.
// A failed Start kills and reaps QEMU and removes the socket.
func (m *Machine) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("qemu: machine already started")
	}
	m.started = true
	stopped := m.stopping
	m.mu.Unlock()
	if stopped {
		err := errors.New("stopped before start")
		m.finishUnstarted(err)
		return fmt.Errorf("qemu: start %s: %w", m.spec.Name, err)
	}
	if err := ctx.Err(); err != nil {
		m.finishUnstarted(err)
		return fmt.Errorf("qemu: start %s: %w", m.spec.Name, err)
	}

	t0 := time.Now()
	consoleMax := m.spec.ConsoleLogMaxBytes
	if consoleMax <= 0 {
		consoleMax = logs.ConsoleLogMaxBytes
	}
	consoleLog, err := logs.OpenRotating(m.spec.ConsoleLog, consoleMax)
	if err != nil {
		m.finishUnstarted(err)
		return fmt.Errorf("qemu: console log: %w", err)
	}
	ln, err := listenChannel(m.spec.ChannelSocket)
	if err != nil {
		m.finishUnstarted(err)
		return err
	}
	defer func() {
		// On success the socket served its purpose (QEMU is connected);
		// on failure it must not be left behind.
		ln.Close()
		os.Remove(m.spec.ChannelSocket)
	}()

	m.consoleCopied = make(chan struct{})
	if err := m.spawn(); err != nil {
		consoleLog.Close()
		m.finishUnstarted(err)
		return err
	}
	// QEMU holds the other end: this ends when QEMU does.
	go m.copyConsole(consoleLog, m.console, m.consoleCopied)
	m.log.Info("qemu started", "pid", m.proc.Pid, "accel", m.accel.Name, "argv", strings.Join(m.Argv(), " "))

	m.mu.Lock()
	stopped = m.stopping
	m.mu.Unlock()
	if stopped {
		return m.failStart(errors.New("stopped while starting"))
	}
	if m.spec.RestoreFrom != "" {
		if err := m.startIncoming(ctx); err != nil {
			return m.failStart(fmt.Errorf("restoring %s: %w", m.spec.RestoreFrom, err))
		}
	}

	conn, err := m.acceptQEMU(ctx, ln)
	if err != nil {
		return m.failStart(err)
	}
	if m.beforeChannel != nil {
		if err := m.beforeChannel(ctx, conn); err != nil {
			conn.Close()
			return m.failStart(err)
		}
	}
	sess, err := guestchan.Server(conn, m.log)
	if err != nil {
		conn.Close()
		return m.failStart(err)
	}
	m.mu.Lock()
	m.session = sess
	m.mu.Unlock()
	m.log.Info("guest channel connected", "elapsed", time.Since(t0))

	stopOnCancel := context.AfterFunc(ctx, func() {
		m.log.Info("context ended: stopping VM", "cause", context.Cause(ctx))
		m.Stop(context.Background())
	})
	go func() {
		<-m.done
		stopOnCancel()
		sess.Close()
	}()
	return nil
}

// failStart kills and reaps a QEMU that did not come up, and returns the
// start error, with QEMU's own complaint when it exited by itself.
func (m *Machine) failStart(err error) error {
	exitedAlready := false
	select {
	case <-m.done:
		exitedAlready = true
	default:
	}
	m.kill()
	<-m.done
	if exitedAlready && m.waitErr != nil {
		err = fmt.Errorf("%w; %w", err, m.exitError())
	}
	err = fmt.Errorf("qemu: start %s: %w", m.spec.Name, err)
	m.startErr = err
	return err
}

// finishUnstarted marks a machine whose QEMU never ran as done, so Wait and
// Done do not block forever.
func (m *Machine) finishUnstarted(err error) {
	m.waitErr = err
	m.startErr = fmt.Errorf("qemu: %s never ran: %w", m.spec.Name, err)
	close(m.done)
}

// spawn starts QEMU from a goroutine locked to its OS thread for QEMU's whole
// life: Pdeathsig fires when the *thread* that forked exits, and the Go
// runtime may retire idle threads, which would kill a healthy VM. The same
// goroutine reaps QEMU and closes done.
func (m *Machine) spawn() error {
	cmd := exec.Command(m.bin, m.args...)
	cmd.Stdin = nil
	w := newLogWriter(m.log, &m.stderr)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Pdeathsig: syscall.SIGKILL, // QEMU dies with its owner
		Setpgid:   true,            // terminal signals to our group do not reach it
	}
	// A stuck output pipe must not stop the reaping.
	cmd.WaitDelay = 2 * time.Second
	inherited, consoleEnd, err := m.extraFiles()
	if err != nil {
		return err
	}
	// QEMU has its copies once started (or never will): ours go, but
	// for the guest's RAM, which a save reads.
	defer func() {
		for _, f := range inherited {
			if f != m.memory {
				f.Close()
			}
		}
	}()
	cmd.ExtraFiles = inherited
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		m.mu.Lock()
		m.proc = cmd.Process
		m.mu.Unlock()
		started <- nil
		err := cmd.Wait()
		w.flush()
		// QEMU's end is closed: the copy ends once it has read the rest.
		<-m.consoleCopied
		if m.monitorConn != nil {
			m.monitorConn.Close()
		}
		m.mu.Lock()
		m.closePorts()
		m.closeNetwork()
		m.memory.Close()
		m.waitErr = err
		// Logged before done closes: whoever waits on done (a Stop, a
		// test that then ends) must not race the machine's last words.
		m.log.Info("qemu exited", "pid", cmd.Process.Pid, "status", cmd.ProcessState.String(), "stopped", m.stopping)
		// Closed under the lock so Stop's "already gone?" check and the
		// stopping flag Wait reads agree.
		close(m.done)
		m.mu.Unlock()
	}()
	if err := <-started; err != nil {
		if m.monitorConn != nil {
			m.monitorConn.Close()
		}
		m.mu.Lock()
		m.closePorts()
		m.closeNetwork()
		m.memory.Close()
		m.mu.Unlock()
		m.console.Close()
		return fmt.Errorf("qemu: starting %s: %w", m.bin, err)
	}
	// exec made QEMU's end of the console pipe blocking. The flag is the
	// pipe end's, shared with QEMU: non-blocking, a console this process
	// is slow to take waits in QEMU's UART (which retries once the pipe
	// has room) instead of stopping QEMU's main loop.
	if err := unix.SetNonblock(int(consoleEnd.Fd()), true); err != nil {
		m.log.Warn("the console pipe stays blocking", "err", err)
	}
	return nil
}

// consolePipeBytes is the size asked for the console pipe.
const consolePipeBytes = 1 << 20

// consoleGather is how long copyConsole lets a trickle of console output
// gather before it reads again: QEMU writes the console a byte at a time,
// and reading as it comes cost this process most of a core at full speed.
const consoleGather = 20 * time.Millisecond

// copyConsole appends the console to its log until QEMU closes its end,
// then closes both and done.
func (m *Machine) copyConsole(log *logs.RotatingWriter, console *os.File, done chan<- struct{}) {
	defer close(done)
	defer log.Close()
	defer console.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := console.Read(buf)
		if n > 0 {
			if _, werr := log.Write(buf[:n]); werr != nil {
				m.log.Error("the console log failed: the rest of the console is dropped", "err", werr)
				io.Copy(io.Discard, console) // the guest's console must not stall
				return
			}
		}
		if err != nil {
			return
		}
		if n < len(buf)/4 {
			time.Sleep(consoleGather)
		}
	}
}

// extraFiles opens what QEMU inherits, walking inheritedFDs (the list Args
// numbers them from): the console pipe (ours goes to m.console), the
// monitor's end of a new socket pair (ours to m.monitorConn), the state
// file to restore from, QEMU's end of each port's socket pair (ours to
// m.ports) and of the NIC's (ours to m.network). consoleEnd is QEMU's end
// of the console pipe, one of files. On failure nothing opened stays open.
func (m *Machine) extraFiles() ([]*os.File, *os.File, error) {
	var files []*os.File
	var consoleEnd *os.File
	fail := func(err error) ([]*os.File, *os.File, error) {
		for _, f := range files {
			f.Close()
		}
		if m.monitorConn != nil {
			m.monitorConn.Close()
			m.monitorConn = nil
		}
		if m.console != nil {
			m.console.Close()
			m.console = nil
		}
		m.closePorts()
		m.closeNetwork()
		m.memory = nil // closed with files
		return nil, nil, err
	}
	m.ports = map[string]net.Conn{}
	for _, fd := range inheritedFDs(m.spec) {
		var (
			f   *os.File
			err error
		)
		switch fd.kind {
		case inheritConsole:
			f, err = m.consolePipe()
			consoleEnd = f
		case inheritMonitor:
			var c net.Conn
			if c, f, err = socketPair("qmp"); err == nil {
				m.monitorConn = c.(*net.UnixConn)
			}
		case inheritIncoming:
			if f, err = os.Open(m.spec.RestoreFrom); err != nil {
				err = fmt.Errorf("qemu: opening the state to restore: %w", err)
			}
		case inheritPort:
			var c net.Conn
			if c, f, err = socketPair("port-" + fd.name); err == nil {
				m.ports[fd.name] = c
			}
		case inheritNetwork:
			var c net.Conn
			if c, f, err = socketPair("network"); err == nil {
				m.network = c
			}
		case inheritMemory:
			f, err = m.newMemory()
		default:
			err = fmt.Errorf("qemu: no way to open an inherited descriptor of kind %d", fd.kind)
		}
		if err != nil {
			return fail(err)
		}
		files = append(files, f)
	}
	return files, consoleEnd, nil
}

// consolePipe makes the console pipe: the read end goes to m.console, the
// write end (returned) to QEMU. A blocking pipe, outside Go's poller, which
// would wake this process for each byte QEMU writes; copyConsole reads it
// in gathered chunks instead.
func (m *Machine) consolePipe() (*os.File, error) {
	var cfds [2]int
	if err := unix.Pipe2(cfds[:], unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("qemu: console pipe: %w", err)
	}
	m.console = os.NewFile(uintptr(cfds[0]), "console")
	// Room for seconds of a console at full speed, should this process be
	// slow to read (best effort: the system may cap it).
	unix.FcntlInt(uintptr(cfds[1]), unix.F_SETPIPE_SZ, consolePipeBytes)
	return os.NewFile(uintptr(cfds[1]), "console-qemu"), nil
}

// newMemory makes the guest's RAM, m.memory: a memfd of the spec's size,
// all zero, or holding the RAM of the state the spec restores.
func (m *Machine) newMemory() (*os.File, error) {
	fd, err := unix.MemfdCreate("capsem-guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("qemu: the guest's RAM: %w", err)
	}
	f := os.NewFile(uintptr(fd), "guest-ram")
	size := int64(m.spec.MemoryMiB) << 20
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("qemu: sizing the guest's RAM: %w", err)
	}
	if m.spec.RestoreFrom != "" {
		err := loadMemory(f, vmm.MemoryPath(m.spec.RestoreFrom), size)
		if err != nil {
			f.Close()
			return nil, err
		}
	}
	m.memory = f
	return f, nil
}

func loadMemory(dst *os.File, path string, size int64) error {
	src, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("qemu: the state's RAM: %w", err)
	}
	defer src.Close()
	if _, err := ramfile.Load(dst, src, size); err != nil {
		return fmt.Errorf("qemu: the state's RAM %s: %w", path, err)
	}
	return nil
}

// ignoreShared is the migration capability that leaves the guest's RAM
// (shared with this process, see Args) out of a saved state: set on both
// ends of every save and restore, since it also changes the stream.
var ignoreShared = map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}

// startIncoming has QEMU, started with "-incoming defer", load the devices'
// state from the inherited state file (its RAM is in m.memory already).
func (m *Machine) startIncoming(ctx context.Context) error {
	uri, err := incomingURI(m.spec)
	if err != nil {
		return err
	}
	q, err := m.monitorClient(ctx)
	if err != nil {
		return err
	}
	if _, err := q.Execute(ctx, "migrate-set-capabilities", ignoreShared, nil); err != nil {
		return err
	}
	_, err = q.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}, nil)
	return err
}

// socketPair makes a connected stream socket pair: ours as a net.Conn
// (through Go's poller), QEMU's as the file it inherits.
func socketPair(what string) (ours net.Conn, qemus *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("qemu: socket pair for %s: %w", what, err)
	}
	f := os.NewFile(uintptr(fds[0]), what)
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("qemu: socket for %s: %w", what, err)
	}
	return c, os.NewFile(uintptr(fds[1]), what+"-qemu"), nil
}

// NetworkConn implements vmm.NetworkHolder: our end of the NIC's socket
// pair, once; the caller owns it. QEMU's stream netdev puts each frame on
// it after its length, 4 bytes big-endian, and reads them so.
func (m *Machine) NetworkConn() (net.Conn, vmm.Framing, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.network
	m.network = nil
	return c, vmm.FramingStream4BE, c != nil
}

// closeNetwork closes the NIC's end if no one took it; m.mu held (or not
// yet shared).
func (m *Machine) closeNetwork() {
	if m.network != nil {
		m.network.Close()
		m.network = nil
	}
}

// Port implements vmm.PortHolder: our end of the port's socket pair, once;
// the caller owns it.
func (m *Machine) Port(name string) (net.Conn, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.ports[name]
	delete(m.ports, name)
	return c, ok
}

// closePorts closes the ports no one took; m.mu held (or not yet shared).
func (m *Machine) closePorts() {
	for name, c := range m.ports {
		c.Close()
		delete(m.ports, name)
	}
}

// monitorClient returns the QMP client, connecting it on first use.
func (m *Machine) monitorClient(ctx context.Context) (*qmp, error) {
	m.monitorMu.Lock()
	defer m.monitorMu.Unlock()
	if m.monitor != nil {
		return m.monitor, nil
	}
	if m.monitorConn == nil {
		return nil, errors.New("qemu: this machine has no monitor (vmm.Spec.Monitor)")
	}
	q, err := newQMP(ctx, m.monitorConn)
	if err != nil {
		return nil, err
	}
	m.monitor = q
	return q, nil
}

// Pause stops the VM's vCPUs (QMP stop), which also drains and flushes
// its disks: every write the guest issued is in the files on return. The
// spec must have Monitor set.
func (m *Machine) Pause(ctx context.Context) error {
	q, err := m.monitorClient(ctx)
	if err != nil {
		return err
	}
	_, err = q.Execute(ctx, "stop", nil, nil)
	return err
}

// Continue lets a paused VM run on (QMP cont), bounded even when ctx has
// ended: a VM must not stay paused because its caller went away.
func (m *Machine) Continue(ctx context.Context) error {
	q, err := m.monitorClient(ctx)
	if err != nil {
		return err
	}
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	_, err = q.Execute(cctx, "cont", nil, nil)
	return err
}

// ErrNotResumed is wrapped by SaveState's error when the VM could not be
// resumed after the save: it stays paused, and is of no use any more.
var ErrNotResumed = vmm.ErrNotResumed

// statePollInterval is how often SaveState asks whether the save is done.
const statePollInterval = 10 * time.Millisecond

// SaveState saves the running VM's whole state (RAM and devices) to path,
// through a migration into the file, and lets the VM run on. A VM of
// the same spec (its per-VM paths aside) resumes from the file with
// vmm.Spec.RestoreFrom. The file appears at path complete or not at all.
// The spec must have Monitor set. Devices that cannot be saved in their
// state (a mounted 9p share) make QEMU refuse, and the VM runs on.
func (m *Machine) SaveState(ctx context.Context, path string) error {
	return m.saveState(ctx, path, true)
}

// SuspendTo saves the VM's whole state to path as SaveState does, and
// leaves it paused: the caller stops it, and a VM of the same spec
// resumes it from the file (vmm.Suspender).
func (m *Machine) SuspendTo(ctx context.Context, path string) error {
	return m.saveState(ctx, path, false)
}

func (m *Machine) saveState(ctx context.Context, path string, runOn bool) error {
	q, err := m.monitorClient(ctx)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("qemu: creating the state file: %w", err)
	}
	tmp := f.Name()
	published := false
	defer func() {
		f.Close()
		if !published {
			os.Remove(tmp)
		}
	}()
	// No throttle: the file is local (QEMU's default caps a migration at
	// a network-friendly rate).
	if _, err := q.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40}, nil); err != nil {
		return err
	}
	if _, err := q.Execute(ctx, "migrate-set-capabilities", ignoreShared, nil); err != nil {
		return err
	}
	const fdName = "capsem-state"
	if _, err := q.Execute(ctx, "getfd", map[string]any{"fdname": fdName}, f); err != nil {
		return err
	}
	// Paused, not live: a live migration under TCG saved an inconsistent
	// state now and then here (2 saves in 13 of a guest counting on its
	// console; every VM resumed from them crashed), as writes the vCPUs
	// made during the last pass went unnoticed. Paused, 10 of 10 were
	// sound. The VM is paused for the save's length (a few seconds).
	if _, err := q.Execute(ctx, "stop", nil, nil); err != nil {
		return err
	}
	var status string
	_, err = q.Execute(ctx, "migrate", map[string]any{"uri": "fd:" + fdName}, nil)
	if err != nil {
		cctx, cancel := cleanupContext(ctx)
		q.Execute(cctx, "closefd", map[string]any{"fdname": fdName}, nil)
		cancel()
	} else {
		status, err = m.waitMigration(ctx, q)
	}
	// The RAM, while the VM is still paused: it is the devices' state's.
	ramTmp := ""
	if err == nil && status == "completed" {
		ramTmp, err = m.saveMemory(path)
	}
	defer func() {
		if ramTmp != "" && !published {
			os.Remove(ramTmp)
		}
	}()
	// The VM carries on whatever happened (there is no destination to
	// take over), unless it is to stay paused for its stop. Its own
	// bound: the save may have used up ctx's.
	if runOn || err != nil || status != "completed" {
		cctx, cancel := cleanupContext(ctx)
		defer cancel()
		if _, cerr := q.Execute(cctx, "cont", nil, nil); cerr != nil {
			return fmt.Errorf("%w: %w (save: %v)", ErrNotResumed, cerr, err)
		}
	}
	if err != nil {
		return err
	}
	if status != "completed" {
		return fmt.Errorf("qemu: saving the VM state ended %q", status)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("qemu: syncing the state file: %w", err)
	}
	// The RAM file first: the devices' file at path is what says a state
	// is there.
	if err := os.Rename(ramTmp, vmm.MemoryPath(path)); err != nil {
		return fmt.Errorf("qemu: publishing the state's RAM: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(vmm.MemoryPath(path))
		return fmt.Errorf("qemu: publishing the state file: %w", err)
	}
	published = true
	return nil
}

// saveMemory writes the guest's RAM to a new temporary file beside the
// state's RAM file of path, synced, and returns its name.
func (m *Machine) saveMemory(path string) (string, error) {
	dst := vmm.MemoryPath(path)
	f, err := os.CreateTemp(filepath.Dir(dst), filepath.Base(dst)+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("qemu: creating the state's RAM file: %w", err)
	}
	_, err = ramfile.Save(f, m.memory, int64(m.spec.MemoryMiB)<<20)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("qemu: saving the guest's RAM: %w", err)
	}
	return f.Name(), nil
}

// cleanupContext bounds the commands that undo or finish a save, which run
// even when ctx has ended.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
}

func cancelMigration(ctx context.Context, q *qmp) {
	cctx, cancel := cleanupContext(ctx)
	defer cancel()
	q.Execute(cctx, "migrate_cancel", nil, nil)
}

// waitMigration polls query-migrate until the migration ends and returns
// its final status; on ctx's end it cancels the migration.
func (m *Machine) waitMigration(ctx context.Context, q *qmp) (string, error) {
	t := time.NewTicker(statePollInterval)
	defer t.Stop()
	for {
		raw, err := q.Execute(ctx, "query-migrate", nil, nil)
		if err != nil {
			cancelMigration(ctx, q)
			return "", err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return "", fmt.Errorf("qemu: query-migrate answered %q: %w", raw, err)
		}
		switch st.Status {
		case "completed", "cancelled":
			return st.Status, nil
		case "failed":
			return "", fmt.Errorf("qemu: saving the VM state failed: %s", st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			cancelMigration(ctx, q)
			return "", fmt.Errorf("qemu: saving the VM state: %w", context.Cause(ctx))
		case <-m.done:
			return "", errors.New("qemu: QEMU exited while saving the VM state")
		case <-t.C:
		}
	}
}

// acceptQEMU waits for QEMU's connection to the channel socket, refusing
// any other peer, until ctx ends or QEMU exits.
func (m *Machine) acceptQEMU(ctx context.Context, ln *net.UnixListener) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	pid := m.PID()
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				ch <- result{err: err}
				return
			}
			peer, perr := peerPID(c)
			if perr == nil && peer == pid {
				ch <- result{c: c}
				return
			}
			m.log.Warn("refusing a channel socket connection that is not our QEMU", "peer_pid", peer, "qemu_pid", pid, "err", perr)
			c.Close()
		}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("accepting QEMU's channel connection: %w", r.err)
		}
		return r.c, nil
	case <-m.done:
		ln.Close()
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		return nil, errors.New("QEMU exited before connecting to the channel socket")
	case <-ctx.Done():
		ln.Close()
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		return nil, fmt.Errorf("waiting for QEMU to connect the channel socket: %w", context.Cause(ctx))
	}
}

func peerPID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		cred *unix.Ucred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return int(cred.Pid), nil
}

// listenChannel listens on path with mode 0600, replacing a stale socket
// left by a crashed run but never any other kind of file.
func listenChannel(path string) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("qemu: channel socket path %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("qemu: removing stale channel socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("qemu: listening on channel socket: %w", err)
	}
	// Start removes the file itself, after QEMU connected or on failure.
	ln.SetUnlinkOnClose(false)
	// The umask-derived mode lasts only until this chmod, and the accept
	// checks the peer's PID anyway.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		os.Remove(path)
		return nil, fmt.Errorf("qemu: chmod channel socket: %w", err)
	}
	return ln, nil
}

// Channel is the host side of the guest channel; nil before Start succeeds.
func (m *Machine) Channel() guestchan.Channel {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.session == nil {
		return nil
	}
	return m.session
}

// Session is Channel as its concrete type (for Ping and NumStreams).
func (m *Machine) Session() *guestchan.Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.session
}

// PID is QEMU's process id, 0 before Start.
func (m *Machine) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return 0
	}
	return m.proc.Pid
}

// Done is closed once QEMU has exited and been reaped (or Start failed).
func (m *Machine) Done() <-chan struct{} { return m.done }

// Wait waits for QEMU to exit. It returns nil for a clean exit (the guest
// powered off) or an exit caused by Stop, and otherwise an error with the
// exit status and the tail of QEMU's stderr.
func (m *Machine) Wait() error {
	<-m.done
	m.mu.Lock()
	stopping := m.stopping
	m.mu.Unlock()
	switch {
	case m.startErr != nil:
		return m.startErr
	case m.waitErr == nil || stopping:
		return nil
	default:
		return m.exitError()
	}
}

func (m *Machine) exitError() error {
	tail := strings.TrimSpace(m.stderr.String())
	if tail == "" {
		return fmt.Errorf("qemu exited: %w", m.waitErr)
	}
	return fmt.Errorf("qemu exited: %w: %s", m.waitErr, tail)
}

// Stop terminates QEMU: SIGTERM, then SIGKILL after the grace period or
// when ctx ends, and waits until it is reaped. It is idempotent and safe
// before Start and after exit.
func (m *Machine) Stop(ctx context.Context) error {
	m.mu.Lock()
	select {
	case <-m.done:
		// Already gone: keep Wait's account of why.
		m.mu.Unlock()
		return nil
	default:
	}
	m.stopping = true
	proc := m.proc
	m.mu.Unlock()
	if proc == nil {
		// Never started, or Start is still spawning: it checks stopping
		// before it waits for QEMU.
		return nil
	}
	// os.Process signals through a pidfd: once reaped, a reused PID is
	// never hit.
	proc.Signal(syscall.SIGTERM)
	t := time.NewTimer(m.grace)
	defer t.Stop()
	select {
	case <-m.done:
		return nil
	case <-t.C:
		m.log.Warn("qemu ignored SIGTERM: killing", "grace", m.grace)
	case <-ctx.Done():
	}
	proc.Kill()
	<-m.done
	return nil
}

// kill is the failed-start path: no grace, the VM never served anyone.
func (m *Machine) kill() {
	m.mu.Lock()
	m.stopping = true
	proc := m.proc
	m.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// tailBuffer keeps the last tailMax bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailMax = 8 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailMax:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// logWriter logs QEMU's output line by line and keeps its tail for errors.
type logWriter struct {
	tail  *tailBuffer
	lines logs.LineWriter
}

func newLogWriter(log *slog.Logger, tail *tailBuffer) *logWriter {
	return &logWriter{tail: tail, lines: logs.LineWriter{Line: func(l string) { log.Warn("qemu output", "line", l) }}}
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.tail.Write(p)
	return w.lines.Write(p)
}

func (w *logWriter) flush() { w.lines.Flush() }
