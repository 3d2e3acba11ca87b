package vmhost

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/vmm"
)

// diskLabel is the filesystem label of the per-VM disk (e2label/blkid).
const diskLabel = "capsem-upper"

// ensureDisk returns the per-VM disk at path, creating it when missing: a
// sparse file of sizeGiB formatted ext4 on the host. An existing disk is
// reused as it is, whatever its size: that is what booting a named VM again
// means. created tells which happened.
func ensureDisk(ctx context.Context, path string, sizeGiB int) (created bool, err error) {
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			return false, fmt.Errorf("the per-VM disk %s is not a regular file (%s)", path, st.Mode().Type())
		}
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("checking the per-VM disk %s: %w", path, err)
	}
	mkfs, err := findMkfs()
	if err != nil {
		return false, err
	}
	// Formatted under a temporary name and renamed into place, so a crash
	// midway never leaves a half-made disk that the next boot would reuse.
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return false, fmt.Errorf("creating the per-VM disk %s: %w", tmp, err)
	}
	defer os.Remove(tmp) // a no-op once renamed
	// Truncate extends without allocating: the file is all hole.
	err = f.Truncate(int64(sizeGiB) << 30)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("sizing the per-VM disk to %d GiB: %w", sizeGiB, err)
	}
	// Lazy inode table and journal init: mkfs writes only the superblocks,
	// group descriptors and bitmaps, so the image stays a few MiB.
	// root_owner: the guest's root owns the disk's root whoever runs us.
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-L", diskLabel,
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return false, fmt.Errorf("formatting the per-VM disk (mkfs.ext4): %w: %s", err, out)
	}
	if err := os.Rename(tmp, path); err != nil {
		return false, fmt.Errorf("publishing the per-VM disk %s: %w", path, err)
	}
	return true, nil
}

// fileExists: path is a regular file (a link is not followed).
func fileExists(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && st.Mode().IsRegular()
}

// findMkfs finds mkfs.ext4 on PATH or in the sbin directories, which an
// ordinary user's PATH often lacks.
func findMkfs() (string, error) {
	p, err := exec.LookPath("mkfs.ext4")
	if err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if p := filepath.Join(d, "mkfs.ext4"); unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("creating the per-VM disk needs mkfs.ext4 (Debian package e2fsprogs; `make deps` installs it): %w", err)
}

// storageRequest is what a VM's storage is made of: its session
// directory, the size of its disk (0: none, the guest runs from the
// initramfs, in RAM), its root image ("": the initramfs) and a host
// directory as its workspace ("": the session's own).
type storageRequest struct {
	sessionDir   string
	diskGiB      int
	rootImage    string
	workspaceDir string
}

// prepareStorage creates or reuses the session's disk and workspace
// directory and returns what to add to the VM spec and the kernel command
// line, and the workspace's directory. The workspace reaches the guest
// through the per-VM process's own server (serveWorkspace), not through
// the machine.
func prepareStorage(ctx context.Context, log *slog.Logger, req storageRequest) (disks []vmm.Disk, workspace, cmdline string, created bool, err error) {
	sessionDir, diskGiB, rootImage := req.sessionDir, req.diskGiB, req.rootImage
	if diskGiB < 0 || diskGiB > api.MaxDiskGB {
		return nil, "", "", false, fmt.Errorf("disk size %d GiB: want 0 (no per-VM disk) to %d", diskGiB, api.MaxDiskGB)
	}
	if rootImage != "" {
		if diskGiB == 0 {
			return nil, "", "", false, fmt.Errorf("root image %s: it needs a per-VM disk for what the guest writes (disk size 0)", rootImage)
		}
		if err := CheckRootImage(rootImage); err != nil {
			return nil, "", "", false, err
		}
		// Every VM of this image opens it read-only: the host never
		// rewrites an image in place (a new one has a new name).
		disks = append(disks, vmm.Disk{ID: guestwire.BaseDiskID, Path: rootImage, ReadOnly: true})
		cmdline += " " + guestwire.CmdlineLowerDisk + "=" + guestwire.BaseDiskID
	}
	if layer := (paths.Session{Dir: sessionDir}).DiskLayer(); diskGiB > 0 && fileExists(layer) {
		// A VM made from an image: its disk is a layer over the image's,
		// made by the service; its format is known by its name.
		disks = append(disks, vmm.Disk{ID: guestwire.UpperDiskID, Path: layer, Format: vmm.DiskQcow2})
		cmdline += " " + guestwire.CmdlineUpperDisk + "=" + guestwire.UpperDiskID
		log.Info("per-VM disk", "path", layer, "format", vmm.DiskQcow2)
	} else if diskGiB > 0 {
		path := paths.Session{Dir: sessionDir}.Disk()
		t := time.Now()
		created, err = ensureDisk(ctx, path, diskGiB)
		if err != nil {
			return nil, "", "", false, err
		}
		u, err := vmimage.Usage(path)
		if err != nil {
			return nil, "", "", false, err
		}
		log.Info("per-VM disk", "path", path, "created", created, "size_bytes", u.Size,
			"allocated_bytes", u.Allocated, "ms", time.Since(t).Milliseconds())
		disks = append(disks, vmm.Disk{ID: guestwire.UpperDiskID, Path: path})
		cmdline += " " + guestwire.CmdlineUpperDisk + "=" + guestwire.UpperDiskID
	}
	ws := paths.Session{Dir: sessionDir}.Workspace()
	if req.workspaceDir != "" {
		if err := CheckWorkspaceDir(req.workspaceDir); err != nil {
			return nil, "", "", false, err
		}
		ws = req.workspaceDir
	} else if err := os.Mkdir(ws, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, "", "", false, fmt.Errorf("creating the workspace %s: %w", ws, err)
	}
	cmdline += " " + guestwire.CmdlineWorkspace + "=" + guestwire.WorkspaceTag
	return disks, ws, cmdline, created, nil
}

// erofsMagic is EROFS's superblock magic, little-endian at byte 1024.
const erofsMagic = 0xE0F5E1E2

// CheckRootImage reports why path cannot be a VM's root image: missing,
// not a regular file, or not EROFS.
func CheckRootImage(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("root image: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("root image: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("root image %s: not a regular file", path)
	}
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 1024); err != nil || binary.LittleEndian.Uint32(magic[:]) != erofsMagic {
		return fmt.Errorf("root image %s: not an EROFS image (capsem image build makes one)", path)
	}
	return nil
}

// CheckWorkspaceDir reports why dir cannot be shared with a VM as its
// workspace: not an absolute path to a directory, or one that would give
// the guest far more than a project: the root, the user's home, or
// capsem's own home (the network CA's key, every session) or a directory
// holding it.
func CheckWorkspaceDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("workspace %q: want an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("workspace %s: not a directory", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	for _, sys := range []string{"/proc", "/sys", "/dev"} {
		if real == sys || strings.HasPrefix(real, sys+"/") {
			return fmt.Errorf("workspace %s: a kernel interface, not a project directory", dir)
		}
	}
	if real == "/" {
		return fmt.Errorf("workspace %s: the host's root directory would give the VM the whole host", dir)
	}
	if home, err := os.UserHomeDir(); err == nil && sameDir(real, home) {
		return fmt.Errorf("workspace %s: your home directory would give the VM your keys and credentials; share a project directory", dir)
	}
	if capsemHome, err := paths.Home(); err == nil {
		if ch, err := filepath.EvalSymlinks(capsemHome); err == nil {
			capsemHome = ch
		}
		if real == capsemHome || strings.HasPrefix(capsemHome+"/", real+"/") || strings.HasPrefix(real, capsemHome+"/") {
			return fmt.Errorf("workspace %s: it holds or is inside capsem's home %s (the network CA's key, every session)", dir, capsemHome)
		}
	}
	return nil
}

// sameDir: a and b are the same directory (b resolved through links).
func sameDir(a, b string) bool {
	if rb, err := filepath.EvalSymlinks(b); err == nil {
		b = rb
	}
	return a == filepath.Clean(b)
}
