package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
)

// Where the storage is staged. The disk, the root image and the read-only
// view of the initramfs live under /run so that they move into the new
// root with it and stay visible (and get unmounted cleanly at power off);
// the overlay is assembled on /mnt, an empty directory of the initramfs, so
// the switch leaves no stray directory behind in the guest's root.
const (
	storageRun    = "/run/capsem"
	diskMount     = "/run/capsem/disk"
	baseMount     = guestwire.GuestRootImage
	initramfsView = guestwire.GuestInitramfs
	newRoot       = "/mnt"
)

// diskWait bounds the wait for the disk. Under TCG the kernel probes
// virtio devices synchronously while the module loads, so the disk is
// normally there at once; the wait only covers slow or asynchronous probing.
var diskWait = 10 * time.Second

// workspaceOptions mount the workspace: 9p2000.L for Linux semantics, over
// a socket (trans=fd) whose other end PID 1 joins to the host's workspace
// server on the channel (see mountWorkspace); msize 256 KiB, the largest
// message the host's server takes (workspacefs.MaxMessage); cache=mmap
// keeps no data or attribute cache (host edits show at once, guest writes
// reach the host at once) yet allows shared writable mmap, which SQLite's
// WAL and many build tools need.
func workspaceOptions(rfd, wfd int) string {
	return fmt.Sprintf("trans=fd,rfdno=%d,wfdno=%d,version=9p2000.L,msize=%d,cache=mmap", rfd, wfd, guestwire.WorkspaceMsize)
}

// storagePlan is what the host attached, from the kernel command line.
type storagePlan struct {
	upperSerial  string // virtio serial of the upper-layer disk; "" for none
	lowerSerial  string // virtio serial of the read-only root image; "" for the initramfs
	workspaceTag string // 9p tag of the workspace; "" for none
}

func planStorage(cmdline string) storagePlan {
	var p storagePlan
	p.upperSerial, _ = guestwire.CmdlineValue(cmdline, guestwire.CmdlineUpperDisk)
	p.lowerSerial, _ = guestwire.CmdlineValue(cmdline, guestwire.CmdlineLowerDisk)
	p.workspaceTag, _ = guestwire.CmdlineValue(cmdline, guestwire.CmdlineWorkspace)
	return p
}

func (p storagePlan) empty() bool { return p.upperSerial == "" && p.workspaceTag == "" }

// Modules each storage step needs (names the list may lack when the kernel
// has them built in; those are not waited for).
var (
	rootModules      = []string{"virtio_blk", "crc32c_generic", "ext4", "overlay"}
	imageModules     = []string{"erofs"}
	workspaceModules = []string{"9pnet_fd", "9p"}
)

// rootDisks are the devices of the root's disks: the per-VM disk (upper)
// and, when the VM has one, the root image (lower).
type rootDisks struct {
	upper, lower string
	// lowerMounted: the root image is already on baseMount (mountLower).
	lowerMounted bool
}

// storageStage is the storage setup in two steps, so the slow part (the
// ext4 and overlay mounts) runs while the rest of the modules still load:
// prepareStorage assembles the new root on /mnt as soon as its modules are
// in; finish switches to it (no module may be loading then: the switch
// moves /sys and the root under the loader's paths) and mounts the
// workspace. A failure is fatal: carrying on from the initramfs would
// silently drop everything the user writes.
type storageStage struct {
	plan     storagePlan
	attrs    []any
	rootDone bool // the overlay is assembled on newRoot
	took     time.Duration
	// workspace is the mounted workspace's relay: a park holds it and
	// hands it to the restored VM's server (wsRelay).
	workspace *wsRelay
	// workspaceParked: a park holds the workspace's relay, to hand it to
	// the restored VM's server after the wake.
	workspaceParked bool
	// workspaceDetached: a park detached the workspace, to mount again
	// after the wake.
	workspaceDetached bool
}

func prepareStorage(ctx context.Context, p storagePlan, wait func(...string)) (*storageStage, error) {
	s, disks, err := locateStorage(ctx, p, wait)
	if err != nil || disks.upper == "" {
		return s, err
	}
	return s, s.assemble(disks)
}

// locateStorage waits for the modules and the disks of p and returns
// their devices (none when p has no upper disk); nothing is mounted yet.
func locateStorage(ctx context.Context, p storagePlan, wait func(...string)) (*storageStage, rootDisks, error) {
	t := time.Now()
	s := &storageStage{plan: p}
	defer func() { s.took += time.Since(t) }()
	var disks rootDisks
	if p.upperSerial == "" {
		if p.lowerSerial != "" {
			return nil, disks, fmt.Errorf("agent: the root image %q came without a per-VM disk to hold its upper layer", p.lowerSerial)
		}
		return s, disks, nil
	}
	wait(rootModules...)
	var err error
	if disks.upper, err = waitForDisk(ctx, "/sys/block", p.upperSerial, diskWait); err != nil {
		return nil, disks, err
	}
	s.attrs = append(s.attrs, "disk", disks.upper)
	if p.lowerSerial != "" {
		wait(imageModules...)
		if disks.lower, err = waitForDisk(ctx, "/sys/block", p.lowerSerial, diskWait); err != nil {
			return nil, disks, err
		}
		s.attrs = append(s.attrs, "image", disks.lower)
	}
	s.attrs = append(s.attrs, "find_disk_ms", time.Since(t).Milliseconds())
	return s, disks, nil
}

// assemble mounts the disks and the overlay on newRoot.
func (s *storageStage) assemble(disks rootDisks) error {
	t := time.Now()
	defer func() { s.took += time.Since(t) }()
	mounted, err := assembleRoot(disks)
	if err != nil {
		return err
	}
	s.rootDone = true
	s.attrs = append(s.attrs, "upper", filepath.Join(diskMount, "upper"),
		"ext4_mount_ms", mounted.Milliseconds(), "root_ms", time.Since(t).Milliseconds())
	return nil
}

// finish switches the root (when prepared) and mounts the workspace. Every
// module must have finished loading.
func (s *storageStage) finish(ctx context.Context, log *slog.Logger, wait func(...string)) error {
	t := time.Now()
	defer func() { s.took += time.Since(t) }()
	if s.rootDone {
		if err := switchRoot(); err != nil {
			return err
		}
	}
	if s.plan.workspaceTag != "" {
		w := time.Now()
		wait(workspaceModules...)
		relay, err := mountWorkspace(ctx, log, s.plan.workspaceTag, guestwire.GuestWorkspace)
		if err != nil {
			return err
		}
		s.workspace = relay
		s.attrs = append(s.attrs, "workspace", guestwire.GuestWorkspace, "workspace_ms", time.Since(w).Milliseconds())
	}
	// One log line for the whole stage: each line costs milliseconds on
	// an emulated serial console.
	log.Info("storage ready", s.attrs...)
	return nil
}

// findDisk returns the /dev path of the block device whose virtio serial
// (sysBlock/<name>/serial) is serial, or "" when none has it yet.
func findDisk(sysBlock, serial string) string {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "serial"))
		if err == nil && strings.TrimSpace(string(b)) == serial {
			return "/dev/" + e.Name()
		}
	}
	return ""
}

// waitForDisk polls for the disk and its device node (devtmpfs makes it).
func waitForDisk(ctx context.Context, sysBlock, serial string, limit time.Duration) (string, error) {
	deadline := time.Now().Add(limit)
	for {
		if dev := findDisk(sysBlock, serial); dev != "" {
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("agent: no disk with virtio serial %q appeared in %s within %v (is virtio_blk loaded?)", serial, sysBlock, limit)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("agent: waiting for disk %q: %w", serial, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// overlayOptions are the overlay's mount data: the read-only initramfs view
// below, the disk's upper/ and work/ on top.
func overlayOptions(lower, disk string) string {
	return "lowerdir=" + lower + ",upperdir=" + filepath.Join(disk, "upper") + ",workdir=" + filepath.Join(disk, "work")
}

// The root switch is switch_root's technique, since pivot_root cannot
// leave rootfs: assemble the new root (an overlay of the root image, or of
// the initramfs without one, under the disk's upper layer) on a directory,
// move the pseudo filesystems into it, move it onto / and chroot. The
// initramfs stays in memory, and in view read-only at initramfsView: the
// capsem binary there is what the guest's capsem commands run.

// assembleRoot mounts the disks and the overlay on newRoot; nothing
// outside /run/capsem and newRoot changes yet.
func assembleRoot(disks rootDisks) (ext4Mount time.Duration, err error) {
	for _, d := range []string{diskMount, initramfsView} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, fmt.Errorf("agent: creating %s: %w", d, err)
		}
	}
	// discard: deleting files in the guest punches holes in the host's
	// image (QEMU runs the disk with discard=unmap), so it stays sparse.
	// noinit_itable: mkfs left the inode tables to be zeroed lazily, but
	// it made the image as a sparse file, whose never-written blocks read
	// as zeros, so the kernel's background zeroing (a thread writing every
	// table, taking guest CPU and host I/O after each boot) has nothing to
	// do. no_prefetch_block_bitmaps: the same thread would otherwise start
	// to read every block bitmap ahead of need, during the boot; the
	// allocator reads them as it goes.
	mt := time.Now()
	if err := unix.Mount(disks.upper, diskMount, "ext4", 0, "discard,noinit_itable,no_prefetch_block_bitmaps"); err != nil {
		return 0, fmt.Errorf("agent: mounting the per-VM disk %s (ext4) on %s: %w", disks.upper, diskMount, err)
	}
	ext4Mount = time.Since(mt)
	// upper/ is the merged root's own directory: its mode is the root's.
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Join(diskMount, "upper"), 0o755}, {filepath.Join(diskMount, "work"), 0o700}} {
		if err := os.Mkdir(d.path, d.mode); err != nil && !errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("agent: creating %s on the per-VM disk: %w", d.path, err)
		}
	}
	// The initramfs must not change under whoever reads it: a read-only
	// bind of its root (not recursive, so no mounts show through).
	if err := unix.Mount("/", initramfsView, "", unix.MS_BIND, ""); err != nil {
		return 0, fmt.Errorf("agent: binding the initramfs root on %s: %w", initramfsView, err)
	}
	if err := unix.Mount("", initramfsView, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return 0, fmt.Errorf("agent: making %s read-only: %w", initramfsView, err)
	}
	lower := initramfsView
	if disks.lower != "" {
		if !disks.lowerMounted {
			if err := mountLower(disks.lower); err != nil {
				return 0, err
			}
		}
		lower = baseMount
	}
	if err := unix.Mount("overlay", newRoot, "overlay", 0, overlayOptions(lower, diskMount)); err != nil {
		return 0, fmt.Errorf("agent: mounting the root overlay on %s: %w", newRoot, err)
	}
	return ext4Mount, nil
}

// mountLower mounts the root image dev read-only on baseMount.
func mountLower(dev string) error {
	if err := os.MkdirAll(baseMount, 0o755); err != nil {
		return fmt.Errorf("agent: creating %s: %w", baseMount, err)
	}
	// nodev: the image's device nodes are the distribution's, and
	// devtmpfs provides the live ones.
	if err := unix.Mount(dev, baseMount, "erofs", unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("agent: mounting the root image %s (erofs) on %s: %w", dev, baseMount, err)
	}
	return nil
}

// bootReads are the root image's files every boot reads (the boot
// config's trust step): read before a save point, they come from the
// saved page cache rather than the compressed image.
var bootReads = []string{guestwire.GuestSystemBundle}

// warmLower reads bootReads from the root image mounted on baseMount; a
// file the image lacks is skipped.
func warmLower() {
	for _, p := range bootReads {
		if f, err := os.Open(filepath.Join(baseMount, p)); err == nil {
			io.Copy(io.Discard, io.LimitReader(f, maxSystemBundle))
			f.Close()
		}
	}
}

// switchRoot makes the overlay assembled on newRoot the root.
func switchRoot() error {
	// Move every early mount into the new root; /proc last, since
	// isMountPoint reads /proc/self/mountinfo.
	var moves []string
	for _, m := range earlyMounts {
		// Top-level ones only: /dev/pts and /dev/shm move with /dev.
		if strings.Count(m.target, "/") == 1 && m.target != "/proc" && isMountPoint(m.target) {
			moves = append(moves, m.target)
		}
	}
	moves = append(moves, "/proc")
	for _, m := range moves {
		target := filepath.Join(newRoot, m)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("agent: creating %s in the new root: %w", target, err)
		}
		if err := unix.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("agent: moving %s into the new root: %w", m, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("agent: entering the new root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("agent: moving the new root onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("agent: chroot into the new root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("agent: entering / of the new root: %w", err)
	}
	return nil
}

// mountWorkspace mounts the host's workspace on dir: 9p from the host's
// workspace server, which keeps the workspace within its size bound, on a
// virtio port of its own (guestwire.WorkspacePort). The kernel's 9p client
// reads and writes descriptors (trans=fd), but not a virtio port's (the
// port driver has no read_iter/write_iter on 6.1 kernels): so it gets two
// pipes, and PID 1 relays whole messages between them and the port
// (wsRelay). nosuid and nodev: files the host put there must not gain
// privileges in the guest.
func mountWorkspace(ctx context.Context, log *slog.Logger, tag, dir string) (*wsRelay, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("agent: creating the workspace mount point %s: %w", dir, err)
	}
	port, err := guestchan.OpenVirtioPort(ctx, guestwire.WorkspacePort)
	if err != nil {
		return nil, fmt.Errorf("agent: the workspace's port: %w", err)
	}
	// Two pipes, one each way: the kernel reads replies from one and
	// writes requests to the other.
	var replies, requests [2]int
	if err := unix.Pipe2(replies[:], unix.O_CLOEXEC); err != nil {
		port.Close()
		return nil, fmt.Errorf("agent: pipe for the workspace: %w", err)
	}
	if err := unix.Pipe2(requests[:], unix.O_CLOEXEC); err != nil {
		unix.Close(replies[0])
		unix.Close(replies[1])
		port.Close()
		return nil, fmt.Errorf("agent: pipe for the workspace: %w", err)
	}
	for _, fd := range []int{replies[1], requests[1]} {
		// Room for whole messages (best effort: the system may cap it).
		unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, 2*guestwire.WorkspaceMsize)
	}
	toKernel, fromKernel := os.NewFile(uintptr(replies[1]), "workspace-replies"), os.NewFile(uintptr(requests[0]), "workspace-requests")
	// The pipes are read and written blocking, on threads of their own
	// (Fd makes them blocking; the Files stay referenced by the close
	// function, so they are not closed under the loops); the port is read
	// and written through the runtime's poller, as the channel's port is:
	// a blocking read of a virtio port was seen to miss data that arrived
	// until more followed.
	relay := newWSRelay(log, fdReader(fromKernel.Fd()), fdWriter(toKernel.Fd()), func() {
		toKernel.Close()
		fromKernel.Close()
	}, port, guestwire.WorkspaceMsize)
	// The kernel takes its own references to the descriptors while mounting.
	err = unix.Mount(tag, dir, "9p", unix.MS_NOSUID|unix.MS_NODEV, workspaceOptions(replies[0], requests[1]))
	unix.Close(replies[0])
	unix.Close(requests[1])
	if err != nil {
		// The relay sees the kernel's ends gone and closes the rest.
		return nil, fmt.Errorf("agent: mounting the workspace on %s: %w", dir, err)
	}
	return relay, nil
}

// fdReader reads a blocking descriptor.
type fdReader int

func (fd fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// fdWriter writes a blocking descriptor.
type fdWriter int

func (fd fdWriter) Write(p []byte) (int, error) {
	for {
		n, err := unix.Write(int(fd), p)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}
