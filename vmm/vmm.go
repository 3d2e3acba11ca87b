package vmm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/capsem/capsem/core/guestchan"
)

// Spec is everything a backend needs to make a VM. It is plain data so it can
// be logged, compared and turned into an argv by a pure function.
type Spec struct {
	// Name identifies the VM in logs and process listings.
	Name string
	// Kernel is the kernel image (bzImage or uncompressed ELF with a PVH
	// note), booted directly: no firmware menus, no bootloader.
	Kernel string
	// Initramfs is the initramfs (cpio, optionally compressed).
	Initramfs string
	// Cmdline is the kernel command line. The caller supplies it whole;
	// on QEMU it wants at least "console=ttyS0 panic=-1" (console on the
	// serial log; a panic ends the VM instead of hanging it) and
	// capsem.channel=serial|vsock for the agent.
	Cmdline string
	// CPUs is the vCPU count (≥ 1).
	CPUs int
	// MemoryMiB is guest RAM in MiB (≥ 64).
	MemoryMiB int
	// Disks are block devices in order (/dev/vda, /dev/vdb, …). Each Disk's
	// ID is also its virtio serial, so the guest can find it by ID in
	// /sys/block/vd*/serial whatever the order.
	Disks []Disk
	// Shares are host directories shared into the guest (virtio-9p on
	// QEMU), mounted by tag.
	Shares []Share
	// Ports are byte streams to the guest beside its channel, by name:
	// the guest opens each by that name (on QEMU a virtio-serial port,
	// /dev/virtio-ports/<name>), and the host end is the machine's
	// (PortHolder), connected from the start. A stream of its own keeps a
	// service (the workspace's file server) out of the channel's
	// multiplexer, on both sides.
	Ports []string
	// Network, when set, gives the guest one NIC whose other end is the
	// caller's (NetworkHolder): Ethernet frames on a connection, to be
	// served by a network stack in the caller's process. Nil: no NIC.
	Network *Network
	// ChannelSocket is the Unix socket path that carries the guest channel
	// on backends without vsock. It exists only while the VM starts.
	ChannelSocket string
	// ConsoleLog is the file the guest's serial console is appended to.
	// It is bounded while the VM runs: past ConsoleLogMaxBytes it moves
	// to ConsoleLog.1 and a new one starts (0: logs.ConsoleLogMaxBytes).
	ConsoleLog         string
	ConsoleLogMaxBytes int64
	// Accel is "" (choose: kvm when usable, else tcg; CAPSEM_ACCEL forces
	// one), "kvm" or "tcg".
	Accel string
	// TCGCacheMiB bounds the translation cache of a VM that runs under
	// TCG (QEMU's tb-size). 0 leaves QEMU's default: the cache grows as
	// the guest runs more code, up to 1 GiB. A small cache keeps host
	// memory down and costs speed: once full, all translated code is
	// dropped and translated again (make bench measures both). KVM has
	// no such cache and ignores it.
	TCGCacheMiB int
	// Machine is the machine type; "" means q35 (microvm hangs under TCG;
	// see DESIGN §2).
	Machine string
	// Firmware is the BIOS image to boot the kernel with; "" means the
	// backend's default (SeaBIOS on QEMU).
	Firmware string
	// Monitor gives the backend a control channel to the hypervisor that
	// saving the VM's state needs (QMP on QEMU, on an inherited socket).
	Monitor bool
	// RestoreFrom is a state file saved from a VM of the same spec (all
	// but its per-VM paths): the VM resumes from it instead of booting.
	// Its RAM, where the backend keeps it apart, is at
	// MemoryPath(RestoreFrom).
	RestoreFrom string
}

// MemoryPath is where a saved state whose devices' state is the file at
// state keeps the guest's RAM, for a backend that keeps it apart (QEMU
// does: a sparse file of the RAM, see vmm/ramfile). A state is then both
// files: whoever moves, copies, hashes or removes one does the other.
func MemoryPath(state string) string { return state + ".ram" }

// Disk is a disk image.
type Disk struct {
	// ID names the disk: letters, digits, '-', '_', starting with a letter,
	// at most 20 characters (the virtio-blk serial limit).
	ID       string
	Path     string
	ReadOnly bool
	// Format is how the file holds the disk: DiskRaw ("") or DiskQcow2 (a
	// copy-on-write layer over the base its header names). The caller
	// says which, from what it made: probing a file's first bytes would
	// let a guest that wrote a qcow2 header into its raw disk make the
	// hypervisor open a host file of its choosing as the base.
	Format DiskFormat
}

// DiskFormat is the format of a disk image file.
type DiskFormat string

const (
	DiskRaw   DiskFormat = ""
	DiskQcow2 DiskFormat = "qcow2"
)

// Share is a host directory shared into the guest.
type Share struct {
	// Tag is the mount tag the guest mounts by (at most 31 characters).
	Tag      string
	HostPath string
	ReadOnly bool
	// SecurityModel is QEMU's 9p security model: "" means "none" (files are
	// created as the QEMU user and ownership changes that fail are
	// ignored, so host tools see plain files), or "mapped-xattr" (guest
	// owners and modes kept in host xattrs).
	SecurityModel string
}

// Network is the guest's NIC.
type Network struct {
	// MAC is the guest NIC's hardware address: 6 octets, unicast, as
	// net.ParseMAC reads it ("5a:94:ef:e4:0c:ee").
	MAC string
	// MTU is the link MTU the guest is told; 0 leaves the backend's
	// default. When frames travel without checksum or segmentation
	// offload (as over a stream), the guest sends at most one MTU per
	// frame, and a large MTU is what gives throughput.
	MTU int
}

// Bounds of Network.MTU when set: IPv6's minimum link MTU, and the largest
// frame a 16-bit length describes (65535) less the Ethernet header (14),
// rounded down to whole 32-bit words.
const (
	MinMTU = 1280
	MaxMTU = 65520
)

// CheckNetwork reports what is wrong with a NIC's settings.
func CheckNetwork(n Network) error {
	mac, err := net.ParseMAC(n.MAC)
	if err != nil {
		return fmt.Errorf("network MAC %q: %w", n.MAC, err)
	}
	switch {
	case len(mac) != 6:
		return fmt.Errorf("network MAC %q: want 6 octets (an Ethernet address), not %d", n.MAC, len(mac))
	case mac[0]&1 != 0:
		return fmt.Errorf("network MAC %q: a multicast address; a NIC needs a unicast one (lowest bit of the first octet clear)", n.MAC)
	case slices.Equal(mac, make(net.HardwareAddr, 6)):
		return fmt.Errorf("network MAC %q: all zero", n.MAC)
	}
	if n.MTU != 0 && (n.MTU < MinMTU || n.MTU > MaxMTU) {
		return fmt.Errorf("network MTU %d: want 0 (the backend's default) or %d..%d", n.MTU, MinMTU, MaxMTU)
	}
	return nil
}

// Framing is how Ethernet frames travel on a NIC's host connection.
type Framing int

const (
	// FramingStream4BE: a byte stream, each frame preceded by its length
	// as 4 bytes big-endian.
	FramingStream4BE Framing = iota + 1
	// FramingDatagram: one frame per datagram, nothing added.
	FramingDatagram
)

func (f Framing) String() string {
	switch f {
	case FramingStream4BE:
		return "stream-4be"
	case FramingDatagram:
		return "datagram"
	}
	return fmt.Sprintf("Framing(%d)", int(f))
}

// Bounds of Spec.TCGCacheMiB when set.
const (
	MinTCGCacheMiB = 4
	MaxTCGCacheMiB = 4096
)

// CheckTCGCache reports a Spec.TCGCacheMiB out of bounds.
func CheckTCGCache(mib int) error {
	if mib != 0 && (mib < MinTCGCacheMiB || mib > MaxTCGCacheMiB) {
		return fmt.Errorf("TCG cache %d MiB: want 0 (QEMU's default) or %d..%d", mib, MinTCGCacheMiB, MaxTCGCacheMiB)
	}
	return nil
}

// Accelerators and the default machine type.
const (
	AccelKVM       = "kvm"
	AccelTCG       = "tcg"
	DefaultMachine = "q35"
)

// Backend makes machines.
type Backend interface {
	Name() string
	// Create validates spec and prepares a Machine; nothing runs until
	// Start.
	Create(ctx context.Context, spec Spec) (Machine, error)
}

// Accel is the accelerator a VM runs with, the CPU model that goes with it,
// and why it was chosen.
type Accel struct {
	Name   string `json:"name"` // AccelKVM or AccelTCG
	CPU    string `json:"cpu"`  // the backend's CPU model
	Reason string `json:"reason"`
	// Forced: the spec or the environment asked for it; a failed start is
	// not retried under the other accelerator.
	Forced bool `json:"forced"`
}

// AccelBackend is a Backend that decides a VM's accelerator once, so that
// the machines started one after another for one VM (a boot that is saved,
// then its resume) run alike, and that learns when a decision failed.
type AccelBackend interface {
	Backend
	// ChooseAccel decides the accelerator for spec (spec.Accel, when set,
	// forces one).
	ChooseAccel(ctx context.Context, spec Spec) (Accel, error)
	// CreateWithAccel is Create under a decided accelerator.
	CreateWithAccel(spec Spec, accel Accel) (Machine, error)
	// DemoteAccel records that a VM of spec did not start under the
	// accelerator it was given (why says how), so later VMs avoid it.
	DemoteAccel(ctx context.Context, spec Spec, why error) error
}

// ErrNotResumed is wrapped by a StateSaver's error when the VM could not
// be resumed after the save: it stays paused, and is of no use any more.
var ErrNotResumed = errors.New("the VM could not be resumed after saving it")

// The optional capabilities of a Machine, which a caller asks for with a
// type assertion (a backend without one simply lacks the feature).
type (
	// StateSaver saves the running VM's whole state to a file that a
	// Spec's RestoreFrom resumes (and its RAM to MemoryPath of it, where
	// the backend keeps RAM apart), and lets the VM run on.
	StateSaver interface {
		SaveState(ctx context.Context, path string) error
	}
	// ChannelHooker runs fn, set before Start, on the guest channel's raw
	// connection before the multiplexer starts on it.
	ChannelHooker interface {
		SetBeforeChannel(fn func(ctx context.Context, raw net.Conn) error)
	}
	// PortHolder gives the host end of each of Spec.Ports once Start
	// returned; the caller owns it.
	PortHolder interface {
		Port(name string) (net.Conn, bool)
	}
	// NetworkHolder gives the host end of Spec.Network's NIC once Start
	// returned, with how frames travel on it; the caller owns it. ok is
	// false when the spec has no network or the end was already taken.
	NetworkHolder interface {
		NetworkConn() (conn net.Conn, framing Framing, ok bool)
	}
	// StateKeyer names the configuration a saved state depends on (for
	// QEMU, its whole command line): a state resumes only in a machine of
	// the same key. OwnStateKey is the key of a state of this VM's own (a
	// suspend, a memory fork): StateKey's less what the guest's RAM
	// already holds and never reads again (the initramfs, unpacked at
	// boot), so such a state resumes after a capsem upgrade made another
	// initramfs (the agent in it must still speak the host's protocol,
	// which its hello says).
	StateKeyer interface {
		StateKey() []string
		OwnStateKey() []string
	}
	// Suspender saves the VM's whole state (as StateSaver) and
	// leaves it paused, for its caller to stop: a VM of the same spec
	// resumes from the file (Spec.RestoreFrom) where this one was.
	Suspender interface {
		SuspendTo(ctx context.Context, path string) error
	}
	// Pauser stops the guest's vCPUs and its devices' I/O (Pause: every
	// write the guest issued is in its disk files when it returns) and
	// lets it run on (Continue). A copy of a paused VM's disks is a
	// consistent one.
	Pauser interface {
		Pause(ctx context.Context) error
		Continue(ctx context.Context) error
	}
)

// Machine is one VM.
type Machine interface {
	// Start boots the VM and connects the guest channel. ctx bounds the
	// start and the machine's life: when it ends the VM is stopped. A
	// failed Start leaves no process and no socket behind.
	Start(ctx context.Context) error
	// Channel is the host side of the guest channel; nil before Start.
	Channel() guestchan.Channel
	// Stop terminates the VM (SIGTERM, then SIGKILL after a grace period
	// bounded by ctx) and waits for it. Asking the guest to shut down
	// cleanly first is the caller's job. Idempotent.
	Stop(ctx context.Context) error
	// Wait blocks until the VM has exited and returns why: nil for a clean
	// exit (guest power-off) or a Stop.
	Wait() error
	// Done is closed when the VM has exited and been reaped.
	Done() <-chan struct{}
	// PID is the hypervisor process id, 0 before Start.
	PID() int
}

// ErrInvalidSpec wraps every Spec validation error.
var ErrInvalidSpec = errors.New("invalid VM spec")

var (
	nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	portRe = regexp.MustCompile(`^[a-z][a-z0-9._-]{0,63}$`)
	idRe   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,19}$`)
	tagRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,30}$`)
)

// maxSocketPath is the longest path a Unix socket address holds (108 bytes
// with the NUL).
const maxSocketPath = 107

// Validate checks the spec for what every backend needs. Paths must be
// absolute so a spec means the same thing whatever the working directory.
func (s Spec) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, a...))
	}
	if !nameRe.MatchString(s.Name) {
		return bad("name %q: want 1-64 of [A-Za-z0-9._-], starting with a letter or digit", s.Name)
	}
	for _, f := range []struct{ what, path string }{
		{"kernel", s.Kernel}, {"initramfs", s.Initramfs},
		{"channel socket", s.ChannelSocket}, {"console log", s.ConsoleLog},
	} {
		if f.path == "" {
			return bad("%s path is empty", f.what)
		}
		if err := checkPath(f.path); err != nil {
			return bad("%s path %q: %v", f.what, f.path, err)
		}
	}
	if len(s.ChannelSocket) > maxSocketPath {
		return bad("channel socket path is %d bytes; a Unix socket path holds at most %d", len(s.ChannelSocket), maxSocketPath)
	}
	if s.CPUs < 1 || s.CPUs > 64 {
		return bad("cpus %d: want 1..64", s.CPUs)
	}
	if s.MemoryMiB < 64 || s.MemoryMiB > 1<<20 {
		return bad("memory %d MiB: want 64..1048576", s.MemoryMiB)
	}
	switch s.Accel {
	case "", AccelKVM, AccelTCG:
	default:
		return bad("accel %q: want \"\", %q or %q", s.Accel, AccelKVM, AccelTCG)
	}
	if err := CheckTCGCache(s.TCGCacheMiB); err != nil {
		return bad("%v", err)
	}
	switch s.Machine {
	case "", "q35", "pc":
	default:
		return bad("machine %q: want q35 or pc", s.Machine)
	}
	if s.RestoreFrom != "" {
		if err := checkPath(s.RestoreFrom); err != nil {
			return bad("restore-from path %q: %v", s.RestoreFrom, err)
		}
	}
	if s.Firmware != "" {
		if err := checkPath(s.Firmware); err != nil {
			return bad("firmware path %q: %v", s.Firmware, err)
		}
	}
	if strings.ContainsAny(s.Cmdline, "\x00\n") {
		return bad("kernel command line contains a NUL or newline")
	}
	seen := map[string]bool{}
	for i, d := range s.Disks {
		if !idRe.MatchString(d.ID) {
			return bad("disk %d id %q: want a letter then up to 19 of [A-Za-z0-9_-]", i, d.ID)
		}
		if seen[d.ID] {
			return bad("disk id %q used twice", d.ID)
		}
		seen[d.ID] = true
		if err := checkPath(d.Path); err != nil {
			return bad("disk %q path %q: %v", d.ID, d.Path, err)
		}
		if d.Format != DiskRaw && d.Format != DiskQcow2 {
			return bad("disk %q format %q: want raw (\"\") or %q", d.ID, d.Format, DiskQcow2)
		}
	}
	ports := map[string]bool{guestchan.VirtioPortName: true}
	for i, p := range s.Ports {
		if !portRe.MatchString(p) {
			return bad("port %d name %q: want 1-64 of [a-z0-9._-], starting with a letter", i, p)
		}
		if ports[p] {
			return bad("port name %q used twice (or is the channel's)", p)
		}
		ports[p] = true
	}
	if s.Network != nil {
		if err := CheckNetwork(*s.Network); err != nil {
			return bad("%v", err)
		}
	}
	tags := map[string]bool{}
	for i, sh := range s.Shares {
		if !tagRe.MatchString(sh.Tag) {
			return bad("share %d tag %q: want 1-31 of [A-Za-z0-9._-]", i, sh.Tag)
		}
		if tags[sh.Tag] {
			return bad("share tag %q used twice", sh.Tag)
		}
		tags[sh.Tag] = true
		if err := checkPath(sh.HostPath); err != nil {
			return bad("share %q path %q: %v", sh.Tag, sh.HostPath, err)
		}
		switch sh.SecurityModel {
		case "", "none", "mapped-xattr":
		default:
			return bad("share %q security model %q: want none or mapped-xattr", sh.Tag, sh.SecurityModel)
		}
	}
	return nil
}

func checkPath(p string) error {
	if !filepath.IsAbs(p) {
		return errors.New("not absolute")
	}
	if strings.ContainsAny(p, "\x00\n") {
		return errors.New("contains a NUL or newline")
	}
	return nil
}
