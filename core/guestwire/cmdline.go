package guestwire

import "strings"

// Kernel command line parameters by which the per-VM process tells the agent
// what storage it attached. They are on the command line, not in BootConfig,
// because the agent needs them before the channel exists: the root switches to
// the per-VM disk before anything else runs.
const (
	// CmdlineUpperDisk names (by virtio serial) the disk that holds the
	// overlay's upper layer; absent means the root stays the initramfs.
	CmdlineUpperDisk = "capsem.upper"
	// CmdlineLowerDisk names (by virtio serial) a read-only root image
	// (EROFS) that becomes the overlay's lower layer in place of the
	// initramfs; it needs an upper disk.
	CmdlineLowerDisk = "capsem.lower"
	// CmdlineWorkspace names the host workspace, mounted at GuestWorkspace
	// (9p2000.L from the host's server on the WorkspacePort); absent means
	// no workspace.
	CmdlineWorkspace = "capsem.workspace"
	// CmdlineWake=1 asks the agent for the wake handshake (see Wake).
	CmdlineWake = "capsem.wake"
)

// Storage defaults shared by the host and the guest.
const (
	// UpperDiskID is the per-VM disk's ID, also its virtio serial.
	UpperDiskID = "capsem-upper"
	// BaseDiskID is the read-only root image's ID, also its virtio serial.
	BaseDiskID = "capsem-base"
	// GuestInitramfs is where the agent keeps a read-only view of the
	// initramfs in the switched root: the capsem binary the host built
	// (GuestCapsemBinary) stays reachable there under any root image,
	// which links its capsem commands to it.
	GuestInitramfs    = "/run/capsem/initramfs"
	GuestCapsemBinary = GuestInitramfs + "/init"
	// GuestRootImage is where the agent mounts the root image (the
	// overlay's lower layer), read-only.
	GuestRootImage = "/run/capsem/base"
	// GuestImageEnv is where a root image keeps the environment every
	// command in the VM starts with (ParseImageEnv).
	GuestImageEnv = "/etc/capsem/environment"
	// WorkspaceTag is the workspace mount's source (what /proc/mounts shows).
	WorkspaceTag = "workspace"
	// WorkspacePort is the name of the byte stream (a virtio-serial port
	// on QEMU) that carries the workspace's 9p, apart from the channel.
	WorkspacePort = "org.capsem.workspace"
	// WorkspaceMsize is the largest 9p message on the workspace
	// connection, in bytes (header included): the guest mounts with it
	// and the host's server refuses anything larger.
	WorkspaceMsize = 256 << 10
	// GuestWorkspace is where the guest mounts the workspace.
	GuestWorkspace = "/root/workspace"
)

// CmdlineValue returns the value of key=value on a kernel command line. The
// last occurrence wins, as with the kernel's own parameters; ok is false when
// the key is absent.
func CmdlineValue(cmdline, key string) (value string, ok bool) {
	for _, f := range strings.Fields(cmdline) {
		if v, found := strings.CutPrefix(f, key+"="); found {
			value, ok = v, true
		}
	}
	return value, ok
}

// GuestBootFacts is where the agent records what the host's boot config
// set (BootFacts), for capsem-doctor to check against the running guest.
const GuestBootFacts = "/run/capsem/boot.json"

// BootFacts is what the host's boot config set, as the agent applied it.
// It is JSON in a file, read by the guest doctor; no host reads it.
type BootFacts struct {
	Hostname string `json:"hostname"`
	// HostClockUnixNano is the host's clock as the boot config gave it;
	// BootTimeNano is the guest's CLOCK_BOOTTIME when it was applied, so
	// that the host's clock now is HostClockUnixNano plus the boot time
	// elapsed since.
	HostClockUnixNano int64    `json:"host_clock_unix_nano"`
	BootTimeNano      int64    `json:"boottime_ns"`
	EnvKeys           []string `json:"env_keys"`
}
