package workspacefs

import (
	"encoding/binary"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

const v9fsMagic = 0x01021997

// fdClosed marks a file's openFD after Close (-1 means not opened yet).
const fdClosed = -2

// file is one fid's node. It holds an O_PATH|O_NOFOLLOW descriptor on its
// inode, obtained by walking from the root one name at a time, so it never
// refers to anything outside the workspace and no path is resolved again.
type file struct {
	fs    *FS
	quota *fidQuota // the connection's, which every File walked from it shares
	fd    int       // O_PATH|O_NOFOLLOW, or the open descriptor of a file we created
	typ   uint32    // S_IFMT bits; an inode's type never changes
	dev   uint64
	in    *inode

	// refs counts the Close calls due: the library closes a File once per
	// fid that shares it.
	refs   atomic.Int32
	openFD atomic.Int64 // -1 until Open, fdClosed after Close
	shared bool         // fd is also openFD (Create)

	dirMu     sync.Mutex
	dirNext   uint64 // cookie of the entry after the last one returned
	dirSynced bool   // the descriptor's position is at dirNext
}

var _ p9.File = (*file)(nil)

// newFile wraps fd (a File already counted by q.take); on error fd is
// closed and the count released.
func (fs *FS) newFile(q *fidQuota, fd int) (*file, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		q.release()
		return nil, errno(err)
	}
	return fs.fileFromStat(q, fd, &st, false), nil
}

func (fs *FS) fileFromStat(q *fidQuota, fd int, st *unix.Stat_t, shared bool) *file {
	f := &file{fs: fs, quota: q, fd: fd, typ: st.Mode & unix.S_IFMT, dev: uint64(st.Dev), shared: shared}
	f.in = fs.holdInode(st, fd)
	f.refs.Store(1)
	if shared {
		f.openFD.Store(int64(fd))
	} else {
		f.openFD.Store(-1)
	}
	return f
}

func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// validName refuses names that are not one plain component (the library
// checks this too).
func validName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 {
		return linux.EINVAL
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return linux.EINVAL
		}
	}
	return nil
}

// qidType is the QID type of a file whose mode's type bits (st_mode &
// S_IFMT) are typ; a directory entry's d_type is typ >> 12 (IFTODT in
// <dirent.h>).
func qidType(typ uint32) p9.QIDType {
	switch typ {
	case unix.S_IFDIR:
		return p9.TypeDir
	case unix.S_IFLNK:
		return p9.TypeSymlink
	}
	return p9.TypeRegular
}

func (fs *FS) qid(st *unix.Stat_t) p9.QID {
	return p9.QID{Type: qidType(st.Mode & unix.S_IFMT), Path: fs.qidPath(uint64(st.Dev), st.Ino)}
}

// mapID shows the server's own user and group as the guest's root.
func mapID(id, self uint32) uint32 {
	if id == self {
		return 0
	}
	return id
}

var attrValid = p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, RDev: true,
	ATime: true, MTime: true, CTime: true, INo: true, Size: true, Blocks: true}

func (fs *FS) attr(st *unix.Stat_t) (p9.QID, p9.AttrMask, p9.Attr) {
	return fs.qid(st), attrValid, p9.Attr{
		Mode:             p9.FileMode(st.Mode),
		UID:              p9.UID(mapID(st.Uid, fs.euid)),
		GID:              p9.GID(mapID(st.Gid, fs.egid)),
		NLink:            p9.NLink(st.Nlink),
		RDev:             p9.Dev(st.Rdev),
		Size:             uint64(st.Size),
		BlockSize:        uint64(st.Blksize),
		Blocks:           uint64(st.Blocks),
		ATimeSeconds:     uint64(st.Atim.Sec),
		ATimeNanoSeconds: uint64(st.Atim.Nsec),
		MTimeSeconds:     uint64(st.Mtim.Sec),
		MTimeNanoSeconds: uint64(st.Mtim.Nsec),
		CTimeSeconds:     uint64(st.Ctim.Sec),
		CTimeNanoSeconds: uint64(st.Ctim.Nsec),
	}
}

// walk returns a new file for names (zero names: a clone) and its stat.
func (f *file) walk(names []string) (*file, *unix.Stat_t, error) {
	if len(names) > 1 {
		return nil, nil, linux.EINVAL // the library walks one name at a time
	}
	if !f.quota.take() {
		return nil, nil, linux.EMFILE
	}
	var fd int
	var err error
	if len(names) == 0 {
		fd, err = unix.FcntlInt(uintptr(f.fd), unix.F_DUPFD_CLOEXEC, 0)
	} else {
		if err = validName(names[0]); err == nil {
			if f.typ != unix.S_IFDIR {
				err = linux.ENOTDIR
			} else {
				fd, err = unix.Openat(f.fd, names[0], unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
	}
	if err != nil {
		f.quota.release()
		return nil, nil, errno(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		f.quota.release()
		return nil, nil, errno(err)
	}
	return f.fs.fileFromStat(f.quota, fd, &st, false), &st, nil
}

// Walk implements p9.File.Walk.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	nf, st, err := f.walk(names)
	if err != nil {
		return nil, nil, err
	}
	if len(names) == 0 {
		return nil, nf, nil
	}
	return []p9.QID{f.fs.qid(st)}, nf, nil
}

// WalkGetAttr implements p9.File.WalkGetAttr: the stat the walk takes
// anyway answers the getattr.
func (f *file) WalkGetAttr(names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	nf, st, err := f.walk(names)
	if err != nil {
		return nil, nil, p9.AttrMask{}, p9.Attr{}, err
	}
	qid, valid, attr := f.fs.attr(st)
	if len(names) == 0 {
		return nil, nf, valid, attr, nil
	}
	return []p9.QID{qid}, nf, valid, attr, nil
}

// GetAttr implements p9.File.GetAttr.
func (f *file) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, errno(err)
	}
	qid, valid, attr := f.fs.attr(&st)
	return qid, valid, attr, nil
}

// permBits keeps the permission bits and the sticky bit, never setuid or
// setgid.
func permBits(m p9.FileMode) uint32 { return uint32(m) & 01777 }

// SetAttr implements p9.File.SetAttr. Owners are never changed (UID and
// GID are ignored, as QEMU's security_model=none does); ctime is the
// host's.
func (f *file) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	// Path operations go through /proc/self/fd/N, which reaches exactly
	// the inode f.fd holds; a symlink's own mode and times are left alone
	// (the path would be followed).
	if valid.Permissions && f.typ != unix.S_IFLNK {
		if err := unix.Chmod(procPath(f.fd), permBits(attr.Permissions)); err != nil {
			return errno(err)
		}
	}
	if valid.Size {
		if err := f.truncate(int64(attr.Size)); err != nil {
			return err
		}
	}
	if (valid.ATime || valid.MTime) && f.typ != unix.S_IFLNK {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if valid.ATime {
			ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
			if valid.ATimeNotSystemTime {
				ts[0] = unix.Timespec{Sec: int64(attr.ATimeSeconds), Nsec: int64(attr.ATimeNanoSeconds)}
			}
		}
		if valid.MTime {
			ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
			if valid.MTimeNotSystemTime {
				ts[1] = unix.Timespec{Sec: int64(attr.MTimeSeconds), Nsec: int64(attr.MTimeNanoSeconds)}
			}
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(f.fd), ts, 0); err != nil {
			return errno(err)
		}
	}
	return nil
}

// truncate sets a regular file's size, charging or crediting the measured
// change of its allocated blocks (growing is sparse on the filesystems a
// workspace lives on, so it charges about nothing).
func (f *file) truncate(size int64) error {
	switch {
	case f.typ == unix.S_IFDIR:
		return linux.EISDIR
	case f.typ != unix.S_IFREG:
		return linux.EINVAL
	case size < 0:
		return linux.EINVAL
	}
	f.in.ioMu.Lock()
	defer f.in.ioMu.Unlock()
	var before, after unix.Stat_t
	if err := unix.Fstat(f.fd, &before); err != nil {
		return errno(err)
	}
	err := unix.Truncate(procPath(f.fd), size)
	if unix.Fstat(f.fd, &after) == nil {
		f.fs.acct.settle(0, 0, statBytes(&after)-statBytes(&before), 0)
	}
	if err != nil {
		return errno(err)
	}
	return nil
}

// Open implements p9.File.Open. It opens regular files and directories
// only: a FIFO, socket or device in the tree is never opened, so nothing
// the guest makes can block a server goroutine or reach a host device.
//
// It reopens the inode through /proc/self/fd/N rather than openat on the
// parent and name: the magic link jumps to exactly the inode f.fd holds
// without resolving any path, so nothing can be swapped in between, and
// that inode's type (checked below) cannot change.
func (f *file) Open(flags p9.OpenFlags) (p9.QID, uint32, error) {
	switch f.typ {
	case unix.S_IFREG, unix.S_IFDIR:
	case unix.S_IFIFO, unix.S_IFSOCK:
		return p9.QID{}, 0, linux.ENXIO
	default:
		return p9.QID{}, 0, linux.EPERM
	}
	mode := int(flags & p9.OpenFlagsModeMask)
	if mode == 3 {
		return p9.QID{}, 0, linux.EINVAL
	}
	oflags := mode | unix.O_CLOEXEC | unix.O_NOCTTY
	if f.typ == unix.S_IFDIR {
		if mode != unix.O_RDONLY {
			return p9.QID{}, 0, linux.EISDIR
		}
		oflags |= unix.O_DIRECTORY
	}
	fd, err := unix.Open(procPath(f.fd), oflags, 0)
	if err != nil {
		return p9.QID{}, 0, errno(err)
	}
	if !f.openFD.CompareAndSwap(-1, int64(fd)) {
		unix.Close(fd)
		return p9.QID{}, 0, linux.EINVAL
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return p9.QID{}, 0, errno(err)
	}
	return f.fs.qid(&st), 0, nil
}

func (f *file) opened() (int, error) {
	fd := f.openFD.Load()
	if fd < 0 {
		return -1, linux.EBADF
	}
	return int(fd), nil
}

// ReadAt implements p9.File.ReadAt.
func (f *file) ReadAt(p []byte, offset int64) (int, error) {
	fd, err := f.opened()
	if err != nil {
		return 0, err
	}
	if offset < 0 {
		return 0, linux.EINVAL
	}
	for {
		n, err := unix.Pread(fd, p, offset)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, errno(err)
		}
		return n, nil
	}
}

// WriteAt implements p9.File.WriteAt, within the bound: see the package
// documentation for the rule.
func (f *file) WriteAt(p []byte, offset int64) (int, error) {
	fd, err := f.opened()
	if err != nil {
		return 0, err
	}
	if offset < 0 {
		return 0, linux.EINVAL
	}
	f.in.ioMu.Lock()
	defer f.in.ioMu.Unlock()
	var before, after unix.Stat_t
	if err := unix.Fstat(fd, &before); err != nil {
		return 0, errno(err)
	}
	n := int64(len(p))
	var granted int64
	// An overwrite inside a file with no holes allocates nothing, so it
	// needs no room (a full workspace still lets a database update in
	// place); anything else reserves the data's blocks plus one for a
	// write that straddles a block boundary.
	inPlace := offset+n <= before.Size && statBytes(&before) >= roundUp(before.Size)
	if !inPlace && n > 0 {
		want := roundUp(n) + blockSize
		granted = f.fs.acct.reserveBytes(want, f.fs.hostAvail())
		if granted < want {
			fit := roundDown(granted - blockSize)
			if fit <= 0 {
				f.fs.acct.settle(granted, 0, 0, 0)
				f.fs.refused()
				return 0, linux.ENOSPC
			}
			p = p[:min(n, fit)]
		}
	}
	var w int
	for {
		w, err = unix.Pwrite(fd, p, offset)
		if err != unix.EINTR {
			break
		}
	}
	var delta int64
	if unix.Fstat(fd, &after) == nil {
		delta = statBytes(&after) - statBytes(&before)
	} else {
		delta = granted // cannot measure: keep what was reserved
	}
	f.fs.acct.settle(granted, 0, delta, 0)
	if err != nil {
		return 0, errno(err)
	}
	return w, nil
}

// FSync implements p9.File.FSync.
func (f *file) FSync() error {
	fd, err := f.opened()
	if err != nil {
		return err
	}
	return errnoOrNil(unix.Fsync(fd))
}

func errnoOrNil(err error) error {
	if err == nil {
		return nil
	}
	return errno(err)
}

// StatFS implements p9.File.StatFS: the bound is the filesystem's size and
// the room left (bound and host reserve both) its free space.
func (f *file) StatFS() (p9.FSStat, error) {
	fs := f.fs
	avail := fs.hostAvail()
	fs.acct.mu.Lock()
	room := fs.acct.roomLocked(avail)
	inodes := fs.acct.inodes + fs.acct.reservedInodes
	lim := fs.acct.lim
	fs.acct.mu.Unlock()
	// A write keeps one block of the room for what its allocation may
	// take beyond its length, so that block is never available to data.
	free := uint64(max(room-blockSize, 0) / blockSize)
	return p9.FSStat{
		Type:            v9fsMagic,
		BlockSize:       blockSize,
		Blocks:          uint64(lim.Bytes / blockSize),
		BlocksFree:      free,
		BlocksAvailable: free,
		Files:           uint64(lim.Inodes),
		FilesFree:       uint64(max(lim.Inodes-inodes, 0)),
		FSID:            fs.rootDev,
		NameLength:      255,
	}, nil
}

// Lock implements p9.File.Lock: locks are the guest kernel's business
// (QEMU answers success too).
func (f *file) Lock(pid int, locktype p9.LockType, flags p9.LockFlags, start, length uint64, client string) (p9.LockStatus, error) {
	return p9.LockStatusOK, nil
}

// The host's extended attributes are not the guest's business. The
// transport answers Txattrwalk and Txattrcreate before they reach the
// library (see framedConn); these are what the library would call.

// SetXattr implements p9.File.SetXattr.
func (f *file) SetXattr(string, []byte, p9.XattrFlags) error { return linux.EOPNOTSUPP }

// GetXattr implements p9.File.GetXattr.
func (f *file) GetXattr(string) ([]byte, error) { return nil, linux.ENODATA }

// ListXattrs implements p9.File.ListXattrs. The library would make a fid
// that shares this File on success, so it is counted like one.
func (f *file) ListXattrs() ([]string, error) {
	if !f.quota.take() {
		return nil, linux.EMFILE
	}
	f.refs.Add(1)
	return nil, nil
}

// RemoveXattr implements p9.File.RemoveXattr.
func (f *file) RemoveXattr(string) error { return linux.EOPNOTSUPP }

// Close implements p9.File.Close.
func (f *file) Close() error {
	r := f.refs.Add(-1)
	if r < 0 {
		return nil
	}
	f.quota.release()
	if r > 0 {
		return nil
	}
	f.fs.releaseInode(f.in, f.fd)
	if o := f.openFD.Swap(fdClosed); o >= 0 && !f.shared {
		unix.Close(int(o))
	}
	unix.Close(f.fd)
	return nil
}

// creating runs make under the parent's ioMu with one inode and one block
// reserved, and charges the new node's blocks and the parent's growth.
// make returns the new node's stat.
func (f *file) creating(name string, make func() (*unix.Stat_t, error)) (*unix.Stat_t, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if f.typ != unix.S_IFDIR {
		return nil, linux.ENOTDIR
	}
	fs := f.fs
	if !fs.acct.reserveInode(fs.hostAvail()) {
		fs.refused()
		return nil, linux.ENOSPC
	}
	f.in.ioMu.Lock()
	defer f.in.ioMu.Unlock()
	var before, after unix.Stat_t
	beforeErr := unix.Fstat(f.fd, &before)
	st, err := make()
	if err != nil {
		fs.acct.settle(blockSize, 1, 0, 0)
		return nil, err
	}
	delta := statBytes(st)
	if beforeErr == nil && unix.Fstat(f.fd, &after) == nil {
		delta += statBytes(&after) - statBytes(&before)
	}
	fs.acct.settle(blockSize, 1, delta, 1)
	return st, nil
}

// Create implements p9.File.Create. The new file is created with O_EXCL
// and O_NOFOLLOW, so it is a new regular file; when the name exists and
// the guest did not ask for O_EXCL, the existing entry is walked to and
// opened like any other.
func (f *file) Create(name string, flags p9.OpenFlags, permissions p9.FileMode, _ p9.UID, _ p9.GID) (p9.File, p9.QID, uint32, error) {
	mode := int(flags & p9.OpenFlagsModeMask)
	if mode == 3 {
		return nil, p9.QID{}, 0, linux.EINVAL
	}
	if !f.quota.take() {
		return nil, p9.QID{}, 0, linux.EMFILE
	}
	var fd int
	st, err := f.creating(name, func() (*unix.Stat_t, error) {
		var err error
		fd, err = unix.Openat(f.fd, name, mode|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0600)
		if err != nil {
			return nil, errno(err)
		}
		var st unix.Stat_t
		// Set the mode exactly: the guest applied its umask, ours must not.
		if err := unix.Fchmod(fd, permBits(permissions)&0777); err == nil {
			err = unix.Fstat(fd, &st)
		}
		if err != nil {
			unix.Close(fd)
			unix.Unlinkat(f.fd, name, 0)
			return nil, errno(err)
		}
		return &st, nil
	})
	if err != nil {
		f.quota.release()
		if err == linux.EEXIST && flags&unix.O_EXCL == 0 {
			return f.openExisting(name, flags)
		}
		return nil, p9.QID{}, 0, err
	}
	return f.fs.fileFromStat(f.quota, fd, st, true), f.fs.qid(st), 0, nil
}

func (f *file) openExisting(name string, flags p9.OpenFlags) (p9.File, p9.QID, uint32, error) {
	nf, _, err := f.walk([]string{name})
	if err != nil {
		return nil, p9.QID{}, 0, err
	}
	qid, unit, err := nf.Open(flags)
	if err != nil {
		nf.Close()
		return nil, p9.QID{}, 0, err
	}
	return nf, qid, unit, nil
}

// statNode opens name with O_PATH|O_NOFOLLOW, sets its mode exactly when
// it is not a symlink (chmod through /proc/self/fd/N reaches that inode
// only) and returns its stat.
func statNode(dirfd int, name string, perm uint32, chmod bool) (*unix.Stat_t, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errno(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errno(err)
	}
	if chmod && st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(procPath(fd), perm); err != nil {
			return nil, errno(err)
		}
		st.Mode = st.Mode&unix.S_IFMT | perm
	}
	return &st, nil
}

// Mkdir implements p9.File.Mkdir.
func (f *file) Mkdir(name string, permissions p9.FileMode, _ p9.UID, _ p9.GID) (p9.QID, error) {
	st, err := f.creating(name, func() (*unix.Stat_t, error) {
		if err := unix.Mkdirat(f.fd, name, 0700); err != nil {
			return nil, errno(err)
		}
		st, err := statNode(f.fd, name, permBits(permissions), true)
		if err != nil {
			unix.Unlinkat(f.fd, name, unix.AT_REMOVEDIR)
		}
		return st, err
	})
	if err != nil {
		return p9.QID{}, err
	}
	return f.fs.qid(st), nil
}

// Symlink implements p9.File.Symlink. The target is stored as given; the
// server never follows it.
func (f *file) Symlink(target, name string, _ p9.UID, _ p9.GID) (p9.QID, error) {
	st, err := f.creating(name, func() (*unix.Stat_t, error) {
		if err := unix.Symlinkat(target, f.fd, name); err != nil {
			return nil, errno(err)
		}
		return statNode(f.fd, name, 0, false)
	})
	if err != nil {
		return p9.QID{}, err
	}
	return f.fs.qid(st), nil
}

// Mknod implements p9.File.Mknod: FIFOs, sockets and regular files only;
// device nodes are refused.
func (f *file) Mknod(name string, mode p9.FileMode, _, _ uint32, _ p9.UID, _ p9.GID) (p9.QID, error) {
	typ := uint32(mode) & unix.S_IFMT
	switch typ {
	case unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFREG:
	case 0:
		typ = unix.S_IFREG
	default:
		return p9.QID{}, linux.EPERM
	}
	perm := permBits(mode) & 0777
	st, err := f.creating(name, func() (*unix.Stat_t, error) {
		if err := unix.Mknodat(f.fd, name, typ|0600, 0); err != nil {
			return nil, errno(err)
		}
		st, err := statNode(f.fd, name, perm, true)
		if err != nil {
			unix.Unlinkat(f.fd, name, 0)
		}
		return st, err
	})
	if err != nil {
		return p9.QID{}, err
	}
	return f.fs.qid(st), nil
}

// Link implements p9.File.Link. The target is a File of this FS, reached
// by walking from the root, so a link to a file outside the workspace
// cannot be named; only regular files may be linked.
func (f *file) Link(target p9.File, name string) error {
	t, ok := target.(*file)
	if !ok || t.fs != f.fs {
		return linux.EXDEV
	}
	if t.typ != unix.S_IFREG {
		return linux.EPERM
	}
	if err := validName(name); err != nil {
		return err
	}
	f.in.ioMu.Lock()
	defer f.in.ioMu.Unlock()
	var before, after unix.Stat_t
	beforeErr := unix.Fstat(f.fd, &before)
	if err := unix.Linkat(unix.AT_FDCWD, procPath(t.fd), f.fd, name, unix.AT_SYMLINK_FOLLOW); err != nil {
		return errno(err)
	}
	if beforeErr == nil && unix.Fstat(f.fd, &after) == nil {
		f.fs.acct.settle(0, 0, statBytes(&after)-statBytes(&before), 0)
	}
	return nil
}

// RenameAt implements p9.File.RenameAt. A target renamed over is credited
// like an unlink.
func (f *file) RenameAt(oldName string, newDir p9.File, newName string) error {
	nd, ok := newDir.(*file)
	if !ok || nd.fs != f.fs {
		return linux.EXDEV
	}
	if err := validName(oldName); err != nil {
		return err
	}
	if err := validName(newName); err != nil {
		return err
	}
	var src, dst unix.Stat_t
	if err := unix.Fstatat(f.fd, oldName, &src, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errno(err)
	}
	dstErr := unix.Fstatat(nd.fd, newName, &dst, unix.AT_SYMLINK_NOFOLLOW)
	if err := unix.Renameat(f.fd, oldName, nd.fd, newName); err != nil {
		return errno(err)
	}
	if dstErr == nil && (dst.Dev != src.Dev || dst.Ino != src.Ino) {
		f.fs.removed(&dst)
	}
	return nil
}

// Rename implements p9.File.Rename; the server uses RenameAt.
func (f *file) Rename(p9.File, string) error { return linux.ENOSYS }

// Renamed implements p9.File.Renamed: a file is its descriptor, not its
// name.
func (f *file) Renamed(p9.File, string) {}

// UnlinkAt implements p9.File.UnlinkAt. The entry's blocks and inode are
// credited when its last link goes, or at the last close of a File on it
// when one is open (else open, unlink and keep writing would grow the host
// without bound). A name that does not exist is reported removed: the
// library keeps a node for every name it is asked to unlink, and drops it
// only on success.
func (f *file) UnlinkAt(name string, flags uint32) error {
	if err := validName(name); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return errno(err)
	}
	if err := unix.Unlinkat(f.fd, name, int(flags&unix.AT_REMOVEDIR)); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return errno(err)
	}
	f.fs.removed(&st)
	return nil
}

var direntBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Readdir implements p9.File.Readdir. Offsets are the host's d_off
// cookies; the descriptor is repositioned only when the guest asks for an
// offset other than where the last answer ended. "." and ".." are passed
// as the host gives them, as QEMU does.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	fd, err := f.opened()
	if err != nil {
		return nil, err
	}
	if f.typ != unix.S_IFDIR {
		return nil, linux.ENOTDIR
	}
	count = min(count, MaxMessage)
	f.dirMu.Lock()
	defer f.dirMu.Unlock()
	if !f.dirSynced || offset != f.dirNext {
		if _, err := unix.Seek(fd, int64(offset), 0); err != nil {
			f.dirSynced = false
			return nil, errno(err)
		}
		f.dirNext, f.dirSynced = offset, true
	}
	bp := direntBufs.Get().(*[]byte)
	defer direntBufs.Put(bp)
	buf := *bp
	var out p9.Dirents
	used := 0
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			f.dirSynced = false
			return out, errno(err)
		}
		if n == 0 {
			return out, nil
		}
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				f.dirSynced = false
				return out, nil
			}
			name := direntName(b[19:reclen])
			size := 24 + len(name) // qid[13] offset[8] type[1] name[s]
			if used+size > int(count) {
				// The descriptor has moved past what we return.
				f.dirSynced = false
				return out, nil
			}
			ino := binary.NativeEndian.Uint64(b[0:8])
			dOff := binary.NativeEndian.Uint64(b[8:16])
			dtype := b[18]
			out = append(out, p9.Dirent{
				QID:    p9.QID{Type: qidType(uint32(dtype) << 12), Path: f.fs.qidPath(f.dev, ino)},
				Offset: dOff,
				Type:   p9.QIDType(dtype), // the Linux client reads d_type here
				Name:   name,
			})
			used += size
			f.dirNext = dOff
			b = b[reclen:]
		}
	}
}

// Readlink implements p9.File.Readlink.
func (f *file) Readlink() (string, error) {
	var buf [unix.PathMax]byte
	n, err := unix.Readlinkat(f.fd, "", buf[:])
	if err != nil {
		return "", errno(err)
	}
	return string(buf[:n]), nil
}
