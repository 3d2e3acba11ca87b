package vmimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/vmm"
)

var errNotEmpty = syscall.ENOTEMPTY

// DiskUsage is a disk file's size as the guest sees it and what it takes
// on the host.
type DiskUsage struct {
	Size, Allocated int64
}

// Usage stats a disk file (st_blocks counts 512-byte units whatever the
// filesystem's block size).
func Usage(path string) (DiskUsage, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return DiskUsage{}, fmt.Errorf("stat of %s: %w", path, err)
	}
	return DiskUsage{Size: st.Size, Allocated: st.Blocks * 512}, nil
}

// DirAllocated is what the regular files directly in dir take on the host
// (a saved state's files: its RAM file is sparse, its size says little).
func DirAllocated(dir string) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		u, err := Usage(filepath.Join(dir, e.Name()))
		if err != nil {
			return 0, err
		}
		total += u.Allocated
	}
	return total, nil
}

// CopyDisk copies the disk src into dst as one raw, sparse file: a raw
// src by reflink where the filesystem shares blocks, else by its data
// extents only (holes stay holes); a qcow2 src (a layer over an image)
// flattened with its base by qemu-img. dst must not exist; it is synced.
func CopyDisk(ctx context.Context, src vmm.Disk, dst string) (DiskUsage, error) {
	var err error
	switch src.Format {
	case vmm.DiskRaw:
		err = copySparse(src.Path, dst)
	case vmm.DiskQcow2:
		err = flatten(ctx, src.Path, dst)
	default:
		err = fmt.Errorf("disk format %q", src.Format)
	}
	if err != nil {
		os.Remove(dst)
		return DiskUsage{}, fmt.Errorf("copying the disk %s: %w", src.Path, err)
	}
	return Usage(dst)
}

// copySparse copies src to the new file dst: a reflink (FICLONE) when the
// filesystem can, else each data extent (SEEK_DATA/SEEK_HOLE) with
// copy_file_range, so a sparse disk stays as sparse.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = copyExtents(in, out, st.Size())
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func copyExtents(in, out *os.File, size int64) error {
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	inFD, outFD := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(inFD, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("finding data: %w", err)
		}
		hole, err := unix.Seek(inFD, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("finding a hole: %w", err)
		}
		for pos := data; pos < hole; {
			roff, woff := pos, pos
			n, err := unix.CopyFileRange(inFD, &roff, outFD, &woff, int(min(hole-pos, 1<<30)), 0)
			if err != nil {
				return fmt.Errorf("copying at %d: %w", pos, err)
			}
			if n == 0 {
				return fmt.Errorf("copying at %d: %w", pos, io.ErrUnexpectedEOF)
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// flatten writes the qcow2 chain at src as one raw sparse file. It reads
// with -U (no lock): the disk belongs to a paused VM, which keeps its
// lock on it.
func flatten(ctx context.Context, src, dst string) error {
	qemuImg, err := QemuImg()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, qemuImg, "convert", "-U", "-f", string(vmm.DiskQcow2), "-O", "raw", "-S", "4k", src, dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img convert: %w: %s", err, out)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// QemuImg finds qemu-img (Debian package qemu-utils).
func QemuImg() (string, error) {
	p, err := exec.LookPath("qemu-img")
	if err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/bin", "/usr/local/bin"} {
		if p := filepath.Join(d, "qemu-img"); unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("VMs made from images need qemu-img (Debian package qemu-utils; `make deps` installs it): %w", err)
}

// MakeLayer creates dst, a qcow2 copy-on-write layer over the raw disk
// base (which must then never change): a VM's own disk, made in no time
// whatever base holds. The base is named by its absolute path and its
// format, so QEMU never probes it.
func MakeLayer(ctx context.Context, base, dst string) error {
	if !filepath.IsAbs(base) {
		return fmt.Errorf("layer base %q: want an absolute path", base)
	}
	qemuImg, err := QemuImg()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", string(vmm.DiskQcow2), "-F", "raw", "-b", base, dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(dst)
		return fmt.Errorf("making a disk layer over %s: qemu-img create: %w: %s", base, err, out)
	}
	return os.Chmod(dst, 0o600)
}

// CopyTree copies the directory tree src into dst (which must not exist):
// directories, regular files (their data, mode and modification time) and
// symbolic links as links; other kinds (sockets, devices, fifos) are
// skipped. It returns the bytes of the files copied.
func CopyTree(ctx context.Context, src, dst string) (int64, error) {
	var total int64
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()|0o700); err != nil {
				return err
			}
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case info.Mode().IsRegular():
			n, err := copyFile(p, target, info)
			total += n
			return err
		}
		return nil
	})
	if err != nil {
		return total, fmt.Errorf("copying the workspace %s: %w", src, err)
	}
	return total, nil
}

func copyFile(src, dst string, info fs.FileInfo) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, info.Mode().Perm())
	if err != nil {
		return 0, err
	}
	err = copyExtents(in, out, info.Size())
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chtimes(dst, info.ModTime(), info.ModTime())
	}
	return info.Size(), err
}

// LinkTree places the files of the directory src (no subdirectories) in
// the new directory dst: hard links where both are on one filesystem (the
// files are never changed in place), copies otherwise.
func LinkTree(ctx context.Context, src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s: %s is not a regular file", src, e.Name())
		}
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if os.Link(from, to) == nil {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		if _, err := copyFile(from, to, info); err != nil {
			return err
		}
	}
	return ctx.Err()
}
