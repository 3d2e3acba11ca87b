package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/guestwire"
)

// File operations are binary-safe and bounded, and writes never follow a
// symbolic link anywhere in the path: directories are opened one component
// at a time with O_NOFOLLOW from "/", so a link planted in the guest cannot
// redirect a write from the host somewhere else. Reads follow links in the
// directories (Debian's /bin, /lib are links) but not in the last component
// unless asked.

// fsError turns an errno into a wire error whose message names the
// operation and the path.
func fsError(op, path string, err error) *guestwire.Error {
	var we *guestwire.Error
	if errors.As(err, &we) {
		return we
	}
	code := guestwire.CodeIO
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOENT:
			code = guestwire.CodeNotFound
		case unix.EEXIST:
			code = guestwire.CodeExists
		case unix.EACCES, unix.EPERM, unix.EROFS:
			code = guestwire.CodePermission
		case unix.ENOTDIR:
			code = guestwire.CodeNotDir
		case unix.EISDIR:
			code = guestwire.CodeIsDir
		case unix.ELOOP:
			code = guestwire.CodeSymlink
		case unix.EFBIG:
			code = guestwire.CodeTooLarge
		case unix.ENOSPC, unix.EDQUOT:
			code = guestwire.CodeNoSpace
		}
	}
	return guestwire.Errorf(code, "%s %s: %v", op, path, err)
}

// splitPath returns the directory components and the last name of an
// absolute, validated path ("/a/b/c" → [a b], c). "." and empty components
// are dropped.
func splitPath(path string) (dirs []string, name string) {
	for _, c := range strings.Split(path, "/") {
		if c != "" && c != "." {
			dirs = append(dirs, c)
		}
	}
	if len(dirs) == 0 {
		return nil, ""
	}
	return dirs[:len(dirs)-1], dirs[len(dirs)-1]
}

// openDirNoFollow opens the directory made of comps under "/" without
// following a symbolic link in any of them; with create, missing ones are
// made (0755). The caller closes the returned O_PATH descriptor.
func openDirNoFollow(op, path string, comps []string, create bool) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fsError(op, path, err)
	}
	for _, c := range comps {
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err := unix.Mkdirat(fd, c, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, fsError(op, path, err)
			}
			next, err = unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			err = explainComponent(op, path, fd, c, err)
			unix.Close(fd)
			return -1, err
		}
		unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// explainComponent says why component c (in dirfd) could not be opened as a
// directory: O_NOFOLLOW|O_DIRECTORY reports a link as ENOTDIR (or ELOOP).
func explainComponent(op, path string, dirfd int, c string, err error) error {
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				return guestwire.Errorf(guestwire.CodeSymlink, "%s %s: path component %q is a symbolic link, which is not followed", op, path, c)
			}
			return guestwire.Errorf(guestwire.CodeNotDir, "%s %s: path component %q is not a directory", op, path, c)
		}
	}
	return fsError(op, path, err)
}

func infoFromStat(st *unix.Stat_t) *guestwire.FileInfo {
	return &guestwire.FileInfo{Mode: st.Mode, Size: st.Size, ModTimeUnixNs: st.Mtim.Nano()}
}

// writeFile replaces path's content with data (boot files).
func writeFile(path string, data []byte, mode uint32, parents bool, maxSize int64) (*guestwire.FileInfo, error) {
	info, _, err := writeFileFrom(path, bytes.NewReader(data), mode, parents, maxSize)
	return info, err
}

// writeRemadeFile is writeFile for a file the agent makes again at every
// boot (the trust bundles): replaced whole by a rename as writeFile does,
// but through the page cache and not synced. Each sync is a flush of the
// guest's disk through QEMU to the host's, on the boot's critical path,
// and a file lost to a crash is remade at the next boot anyway.
func writeRemadeFile(path string, data []byte, mode uint32, maxSize int64) error {
	_, _, err := writeFileWith(path, bytes.NewReader(data), mode, true, maxSize, false)
	return err
}

// writeFileFrom replaces path's content with what r yields, at most maxSize
// bytes. No link is followed anywhere in the path; the target must be a
// regular file or not exist. The bytes go to a temporary file beside the
// target, which replaces it (rename) only once all of them have arrived
// and are synced: a transfer cut short, or a full disk, leaves the old file
// untouched. An existing file keeps its owner, and its mode unless mode is
// given.
func writeFileFrom(path string, r io.Reader, mode uint32, parents bool, maxSize int64) (*guestwire.FileInfo, int64, error) {
	return writeFileWith(path, r, mode, parents, maxSize, true)
}

// writeFileWith is writeFileFrom; durable false leaves out the direct I/O
// and the sync (writeRemadeFile).
func writeFileWith(path string, r io.Reader, mode uint32, parents bool, maxSize int64, durable bool) (*guestwire.FileInfo, int64, error) {
	const op = "write"
	if err := guestwire.ValidatePath(path); err != nil {
		return nil, 0, err
	}
	if mode&^0o7777 != 0 {
		return nil, 0, guestwire.Errorf(guestwire.CodeInvalid, "write %s: mode %#o has bits other than permissions", path, mode)
	}
	dirs, name := splitPath(path)
	if name == "" {
		return nil, 0, guestwire.Errorf(guestwire.CodeIsDir, "write %s: is a directory", path)
	}
	dfd, err := openDirNoFollow(op, path, dirs, parents)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(dfd)
	old, err := writeTarget(dfd, path, name)
	if err != nil {
		return nil, 0, err
	}
	perm := mode
	switch {
	case perm != 0:
	case old != nil:
		perm = old.Mode & 0o7777
	default:
		perm = 0o644
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := ".capsem-write-" + hex.EncodeToString(rnd[:])
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	direct := 0
	if durable {
		direct = unix.O_DIRECT
	}
	fd, err := unix.Openat(dfd, tmp, flags|direct, 0o600)
	if direct != 0 && errors.Is(err, unix.EINVAL) {
		// No direct I/O on this filesystem (tmpfs, say); the refusal may
		// come once the file exists.
		unix.Unlinkat(dfd, tmp, 0)
		fd, err = unix.Openat(dfd, tmp, flags, 0o600)
	}
	if err != nil {
		return nil, 0, fsError(op, path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	committed := false
	defer func() {
		if !committed {
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	n, err := copyToFile(f, io.LimitReader(r, maxSize+1))
	if err != nil {
		return nil, n, fsError(op, path, err)
	}
	if n > maxSize {
		return nil, n, guestwire.Errorf(guestwire.CodeTooLarge, "write %s: more than %d bytes, the limit", path, maxSize)
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return nil, n, fsError(op, path, err)
	}
	if old != nil {
		if err := unix.Fchown(fd, int(old.Uid), int(old.Gid)); err != nil {
			return nil, n, fsError(op, path, err)
		}
	}
	if durable {
		if err := f.Sync(); err != nil {
			return nil, n, fsError(op, path, err)
		}
	}
	// Look again just before the rename: a directory or link put there
	// meanwhile is refused, not replaced (rename would replace a link
	// itself, never write through it, but the caller asked for a file).
	if _, err := writeTarget(dfd, path, name); err != nil {
		return nil, n, err
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		return nil, n, fsError(op, path, err)
	}
	committed = true
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, n, fsError(op, path, err)
	}
	return infoFromStat(&st), n, nil
}

// writeTarget looks at what a write would replace without opening it (so
// a device or FIFO is refused without the side effects of an open): nil
// when nothing is there, the regular file's stat, or a refusal.
func writeTarget(dfd int, path, name string) (*unix.Stat_t, error) {
	var st unix.Stat_t
	switch err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	case err != nil:
		return nil, fsError("write", path, err)
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return nil, guestwire.Errorf(guestwire.CodeSymlink, "write %s: it is a symbolic link, which writes never follow", path)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return nil, guestwire.Errorf(guestwire.CodeIsDir, "write %s: is a directory", path)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, guestwire.Errorf(guestwire.CodeNotRegular, "write %s: not a regular file", path)
	}
	return &st, nil
}

// The copy buffers of a file transfer: a transfer moves a buffer per
// syscall on the file and per stream write, and under TCG the guest pays
// for each of those far more than for the bytes; on the disk side each is
// a request QEMU answers (the transfer goes direct). A transfer pipelines
// through fileBuffers of them, one on the disk while the other is on the
// stream. At most guestwire.MaxFileTransfers run at once.
const (
	fileBuf     = 1 << 20
	fileBuffers = 2
)

// directIOAlign is what direct I/O's buffer, offset and length must be
// multiples of: the largest logical block size of the disks here.
const directIOAlign = 4096

// A file transfer moves the file's bytes with direct I/O (O_DIRECT) where
// the filesystem allows: between the agent's buffer and the disk, without
// the kernel's copy to or from the page cache, which is most of what a
// transfer costs the guest under TCG (QEMU moves the bytes at the host's
// speed instead), and the transferred file does not crowd the guest's
// memory. What direct I/O cannot do (the tail of a file written, a
// filesystem that turns it down) goes through the page cache as before; a
// written file is synced before it counts either way.

// directReadMin is the size from which a file is read direct: a smaller
// one is cheaper from the page cache, where it may already be.
const directReadMin = 1 << 20

// alignedBuffers returns count page-aligned buffers of n bytes each (one
// anonymous mapping) and their release; where no mapping can be had,
// ordinary ones, with which direct I/O falls back to the page cache.
func alignedBuffers(n, count int) ([][]byte, func()) {
	bufs := make([][]byte, count)
	whole, err := unix.Mmap(-1, 0, n*count, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		for i := range bufs {
			bufs[i] = make([]byte, n)
		}
		return bufs, func() {}
	}
	for i := range bufs {
		bufs[i] = whole[i*n : (i+1)*n : (i+1)*n]
	}
	return bufs, func() { unix.Munmap(whole) }
}

// setDirect turns direct I/O on f on or off.
func setDirect(f *os.File, on bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	err = rc.Control(func(fd uintptr) {
		flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err != nil {
			ferr = err
			return
		}
		if on {
			flags |= unix.O_DIRECT
		} else {
			flags &^= unix.O_DIRECT
		}
		_, ferr = unix.FcntlInt(fd, unix.F_SETFL, flags)
	})
	if err != nil {
		return err
	}
	return ferr
}

// isDirect reports whether f does direct I/O.
func isDirect(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	direct := false
	rc.Control(func(fd uintptr) {
		flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		direct = err == nil && flags&unix.O_DIRECT != 0
	})
	return direct
}

// copyToFile copies r into f, a new file (opened with O_DIRECT where the
// filesystem allows): whole blocks direct, the tail through the page cache.
// The next piece arrives while the last is written (pipeline).
func copyToFile(f *os.File, r io.Reader) (int64, error) {
	bufs, release := alignedBuffers(fileBuf, fileBuffers)
	direct := isDirect(f)
	var total int64
	err := pipeline(bufs, release, func(buf []byte) (int, error) {
		return fill(r, buf)
	}, func(data []byte) error {
		if direct {
			whole := len(data) &^ (directIOAlign - 1)
			m, err := f.Write(data[:whole])
			total += int64(m)
			data = data[m:]
			if err != nil && !errors.Is(err, unix.EINVAL) {
				return err
			}
			if len(data) > 0 {
				// The tail, or a filesystem that took O_DIRECT at open
				// but not for this write.
				if err := setDirect(f, false); err != nil {
					return err
				}
				direct = false
			}
		}
		if len(data) > 0 {
			m, err := f.Write(data)
			total += int64(m)
			if err != nil {
				return err
			}
		}
		return nil
	})
	return total, err
}

// fill reads r until buf is full or r ends (io.EOF) or fails.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// openRead opens a regular file for a read of at most maxSize bytes. A
// link as the last component is refused unless follow is set.
func openRead(path string, follow bool, maxSize int64) (*os.File, *guestwire.FileInfo, error) {
	const op = "read"
	if err := guestwire.ValidatePath(path); err != nil {
		return nil, nil, err
	}
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) && !follow {
			return nil, nil, guestwire.Errorf(guestwire.CodeSymlink, "read %s: it is a symbolic link; ask to follow it to read its target", path)
		}
		return nil, nil, fsError(op, path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, nil, fsError(op, path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		f.Close()
		return nil, nil, guestwire.Errorf(guestwire.CodeIsDir, "read %s: is a directory", path)
	default:
		f.Close()
		return nil, nil, guestwire.Errorf(guestwire.CodeNotRegular, "read %s: not a regular file", path)
	}
	if st.Size > maxSize {
		f.Close()
		return nil, nil, guestwire.Errorf(guestwire.CodeTooLarge, "read %s: the file is %d bytes, the limit is %d", path, st.Size, maxSize)
	}
	return f, infoFromStat(&st), nil
}

// copyRead sends f to w, at most maxSize bytes, a large file with direct
// I/O where the filesystem allows, reading the next piece while the last
// is sent (pipeline). Some files (in /proc, /sys) report size 0 and have
// content, so it reads to EOF, one byte past the limit to tell "exactly
// at" from "over".
func copyRead(w io.Writer, f *os.File, path string, maxSize int64) (int64, error) {
	bufs, release := alignedBuffers(fileBuf, fileBuffers)
	direct := false
	if st, err := f.Stat(); err == nil && st.Size() >= directReadMin {
		direct = setDirect(f, true) == nil
	}
	limit := maxSize + 1
	var read, sent int64 // read: the reader's alone; sent: the writer's
	err := pipeline(bufs, release, func(buf []byte) (int, error) {
		for read < limit {
			m, err := f.Read(buf[:min(int64(len(buf)), limit-read)])
			if direct && m == 0 && errors.Is(err, unix.EINVAL) {
				// A piece cut short by the limit is not a whole number of
				// blocks, or the filesystem took O_DIRECT but not this read.
				if err := setDirect(f, false); err != nil {
					return 0, guestwire.Errorf(guestwire.CodeIO, "read %s: after %d bytes: %v", path, read, err)
				}
				direct = false
				continue
			}
			read += int64(m)
			if err != nil && err != io.EOF {
				return m, guestwire.Errorf(guestwire.CodeIO, "read %s: after %d bytes: %v", path, read, err)
			}
			return m, err
		}
		return 0, io.EOF
	}, func(piece []byte) error {
		if _, err := w.Write(piece); err != nil {
			return guestwire.Errorf(guestwire.CodeIO, "read %s: after %d bytes: %v", path, sent, err)
		}
		sent += int64(len(piece))
		return nil
	})
	if err != nil {
		return sent, err
	}
	if sent > maxSize {
		return sent, guestwire.Errorf(guestwire.CodeTooLarge, "read %s: the file is more than %d bytes, the limit", path, maxSize)
	}
	return sent, nil
}

// statFile describes path without following a link in its last component.
func statFile(path string) (*guestwire.FileInfo, error) {
	if err := guestwire.ValidatePath(path); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, fsError("stat", path, err)
	}
	info := infoFromStat(&st)
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, guestwire.MaxPath)
		if n, err := unix.Readlink(path, buf); err == nil {
			info.LinkTarget = string(buf[:n])
		}
	}
	return info, nil
}

// mkdir creates a directory without following a link anywhere in its path.
// With parents, missing parents are made and an existing directory is fine.
func mkdir(path string, mode uint32, parents bool) (*guestwire.FileInfo, error) {
	const op = "mkdir"
	if err := guestwire.ValidatePath(path); err != nil {
		return nil, err
	}
	if mode&^0o7777 != 0 {
		return nil, guestwire.Errorf(guestwire.CodeInvalid, "mkdir %s: mode %#o has bits other than permissions", path, mode)
	}
	perm := mode
	if perm == 0 {
		perm = 0o755
	}
	dirs, name := splitPath(path)
	if name == "" {
		if parents {
			return statFile("/")
		}
		return nil, guestwire.Errorf(guestwire.CodeExists, "mkdir /: exists")
	}
	dfd, err := openDirNoFollow(op, path, dirs, parents)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	created := true
	if err := unix.Mkdirat(dfd, name, perm); err != nil {
		if !errors.Is(err, unix.EEXIST) {
			return nil, fsError(op, path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, fsError(op, path, err)
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return nil, guestwire.Errorf(guestwire.CodeSymlink, "mkdir %s: it is a symbolic link, which is not followed", path)
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return nil, guestwire.Errorf(guestwire.CodeExists, "mkdir %s: exists and is not a directory", path)
		case !parents:
			return nil, guestwire.Errorf(guestwire.CodeExists, "mkdir %s: already exists", path)
		}
		created = false
	}
	// Open what is there now without following a link, and set the mode on
	// that descriptor, so a swap after mkdirat cannot redirect the chmod.
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, explainComponent(op, path, dfd, name, err)
	}
	defer unix.Close(fd)
	if created || mode != 0 {
		if err := unix.Fchmod(fd, perm); err != nil {
			return nil, fsError(op, path, err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsError(op, path, err)
	}
	return infoFromStat(&st), nil
}
