package workspacefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// rescanInterval is the least time between two rescans a refused write
// starts.
const rescanInterval = 10 * time.Second

// FS is a 9P2000.L server for one workspace directory, with a size bound.
type FS struct {
	log    *slog.Logger
	server *p9.Server

	rootMu sync.RWMutex // held for read while rootFD is used, for write by Close
	rootFD int
	closed atomic.Bool

	rootDev    uint64
	euid, egid uint32

	acct accountant
	// hostFree is the host filesystem's free space for us (a test may
	// replace it).
	hostFree atomic.Pointer[func() (int64, error)]

	tableMu sync.Mutex
	table   map[inodeKey]*inode
	devMu   sync.Mutex
	devIdx  map[uint64]uint64

	files    atomic.Int64 // File objects alive, on every connection
	maxFiles int64        // per connection
	conns    atomic.Int32

	rescanMu   sync.Mutex // single flight; guards lastRescan
	lastRescan time.Time
	rescans    sync.WaitGroup
}

// inode is what the open File objects on one host inode share.
type inode struct {
	key  inodeKey
	refs int   // File objects on it; tableMu
	fds  []int // their path descriptors (for rescan); tableMu
	gone bool  // unlinked while held: credit at the last close; tableMu
	// ioMu serializes writes, truncates and entry changes on this inode, so
	// the st_blocks delta measured around each is exact.
	ioMu sync.Mutex
}

// Open scans root once to learn its usage (a tree already over the bound
// opens; the guest then gets ENOSPC on growth).
func Open(ctx context.Context, root string, lim Limits, log *slog.Logger) (*FS, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open workspace %s: %w", root, err)
	}
	fs := &FS{
		log:    log,
		rootFD: fd,
		euid:   uint32(unix.Geteuid()),
		egid:   uint32(unix.Getegid()),
		table:  map[inodeKey]*inode{},
		devIdx: map[uint64]uint64{},
	}
	fs.acct.lim = lim.withDefaults()
	fs.setHostFree(fs.statfsFree)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("stat workspace %s: %w", root, err)
	}
	fs.rootDev = uint64(st.Dev)
	fs.maxFiles = fidCap()
	bytes, inodes, err := scanTree(fd, func() bool { return ctx.Err() != nil })
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("scan workspace %s: %w", root, err)
	}
	fs.acct.bytes, fs.acct.inodes = bytes, inodes
	fs.lastRescan = time.Now()
	log.Info("workspacefs: opened", "root", root, "bytes", bytes, "inodes", inodes,
		"limit_bytes", fs.acct.lim.Bytes, "limit_inodes", fs.acct.lim.Inodes)
	return fs, nil
}

// fidCap is a connection's share of the Files: the descriptors we may
// hold (two per File, on every connection) stay well inside RLIMIT_NOFILE.
func fidCap() int64 {
	var rl unix.Rlimit
	n := int64(MaxFids)
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur != unix.RLIM_INFINITY {
		n = min(n, (int64(rl.Cur)-256)/2/MaxConns)
	}
	return max(n, 16)
}

func (fs *FS) statfsFree() (int64, error) {
	fs.rootMu.RLock()
	defer fs.rootMu.RUnlock()
	if fs.closed.Load() {
		return 0, ErrClosed
	}
	var sf unix.Statfs_t
	if err := unix.Fstatfs(fs.rootFD, &sf); err != nil {
		return 0, err
	}
	return int64(sf.Bavail) * int64(sf.Bsize), nil
}

// hostAvail is the host's free space, 0 when it cannot be read (so that
// the guest gets ENOSPC rather than an unbounded write).
func (fs *FS) hostAvail() int64 {
	n, err := (*fs.hostFree.Load())()
	if err != nil {
		return 0
	}
	return n
}

func (fs *FS) setHostFree(f func() (int64, error)) { fs.hostFree.Store(&f) }

// Usage reports the workspace's usage.
func (fs *FS) Usage() Usage {
	b, i := fs.acct.snapshot()
	return Usage{Bytes: b, Inodes: i, Limits: fs.acct.lim, HostAvailable: fs.hostAvail()}
}

// Serve serves one 9P2000.L connection until it closes or ctx ends (then it
// closes conn and returns after every handler finished). At most MaxConns
// at once; more get an error at once and conn is closed.
func (fs *FS) Serve(ctx context.Context, conn io.ReadWriteCloser) error {
	if fs.closed.Load() {
		conn.Close()
		return ErrClosed
	}
	if fs.conns.Add(1) > MaxConns {
		fs.conns.Add(-1)
		conn.Close()
		return fmt.Errorf("workspacefs: %d connections already served", MaxConns)
	}
	defer fs.conns.Add(-1)
	fc := newFramedConn(conn, fs.log, MaxMessage, MaxInflight)
	stop := context.AfterFunc(ctx, fc.close)
	defer stop()
	// A server, and a share of the Files, per connection: a hostile
	// connection that takes all of its share leaves the other's whole.
	server := p9.NewServer(attacher{fs, &fidQuota{fs: fs, max: fs.maxFiles}})
	err := server.Handle(readerEnd{fc}, writerEnd{fc})
	fc.close()
	if r := fc.err(); r != nil {
		return r
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Close closes the root descriptor; Serve calls after Close fail. Files
// still open keep their own descriptors until their connection ends.
func (fs *FS) Close() error {
	if fs.closed.Swap(true) {
		return nil
	}
	fs.rootMu.Lock()
	err := unix.Close(fs.rootFD)
	fs.rootFD = -1
	fs.rootMu.Unlock()
	fs.rescans.Wait()
	return err
}

type attacher struct {
	fs    *FS
	quota *fidQuota
}

// Attach implements p9.Attacher.
func (a attacher) Attach() (p9.File, error) {
	fs := a.fs
	fs.rootMu.RLock()
	defer fs.rootMu.RUnlock()
	if fs.closed.Load() {
		return nil, errno(unix.EBADF)
	}
	if !a.quota.take() {
		return nil, errno(unix.EMFILE)
	}
	fd, err := unix.FcntlInt(uintptr(fs.rootFD), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		a.quota.release()
		return nil, errno(err)
	}
	f, err := fs.newFile(a.quota, fd)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// fidQuota counts one connection's Files against its cap (FS.maxFiles),
// and in the FS's total.
type fidQuota struct {
	fs  *FS
	n   atomic.Int64
	max int64
}

// take counts one more File, or reports that the cap is reached.
func (q *fidQuota) take() bool {
	if q.n.Add(1) > q.max {
		q.n.Add(-1)
		return false
	}
	q.fs.files.Add(1)
	return true
}

func (q *fidQuota) release() {
	q.n.Add(-1)
	q.fs.files.Add(-1)
}

// holdInode registers a File on the inode st describes.
func (fs *FS) holdInode(st *unix.Stat_t, fd int) *inode {
	k := inodeKey{uint64(st.Dev), st.Ino}
	fs.tableMu.Lock()
	defer fs.tableMu.Unlock()
	in := fs.table[k]
	if in == nil {
		in = &inode{key: k}
		fs.table[k] = in
	}
	in.refs++
	in.fds = append(in.fds, fd)
	return in
}

// releaseInode drops a File's hold; fd is still open. An inode unlinked
// while held is credited now if no link is left.
func (fs *FS) releaseInode(in *inode, fd int) {
	fs.tableMu.Lock()
	in.refs--
	for i, x := range in.fds {
		if x == fd {
			in.fds = append(in.fds[:i], in.fds[i+1:]...)
			break
		}
	}
	last := in.refs == 0
	gone := in.gone
	if last {
		delete(fs.table, in.key)
	}
	fs.tableMu.Unlock()
	if !last || !gone {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Nlink == 0 {
		fs.acct.credit(statBytes(&st), 1)
	}
}

// removed accounts for an entry whose inode (stat taken just before) was
// unlinked or renamed over.
func (fs *FS) removed(st *unix.Stat_t) {
	k := inodeKey{uint64(st.Dev), st.Ino}
	fs.tableMu.Lock()
	if in := fs.table[k]; in != nil {
		// We hold it open: its blocks stay taken until the last close.
		in.gone = true
		fs.tableMu.Unlock()
		return
	}
	fs.tableMu.Unlock()
	if st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Nlink <= 1 {
		fs.acct.credit(statBytes(st), 1)
	}
}

// qidPath is the inode number, with an index of the device in the top
// byte for inodes on another filesystem mounted under root.
func (fs *FS) qidPath(dev, ino uint64) uint64 {
	if dev == fs.rootDev {
		return ino
	}
	fs.devMu.Lock()
	idx, ok := fs.devIdx[dev]
	if !ok {
		idx = uint64(len(fs.devIdx)+1) & 0xff
		fs.devIdx[dev] = idx
	}
	fs.devMu.Unlock()
	return ino&(1<<56-1) | idx<<56
}

// refused is called when a write or create gets ENOSPC: it starts a rescan
// (at most one per rescanInterval) so that space freed on the host counts.
func (fs *FS) refused() {
	fs.rescanMu.Lock()
	if time.Since(fs.lastRescan) < rescanInterval || fs.closed.Load() {
		fs.rescanMu.Unlock()
		return
	}
	fs.lastRescan = time.Now()
	fs.rescans.Add(1)
	fs.rescanMu.Unlock()
	b, i := fs.acct.snapshot()
	fs.log.Warn("workspacefs: workspace full, rescanning", "bytes", b, "inodes", i,
		"limit_bytes", fs.acct.lim.Bytes, "limit_inodes", fs.acct.lim.Inodes)
	go func() {
		defer fs.rescans.Done()
		if err := fs.rescan(); err != nil {
			fs.log.Warn("workspacefs: rescan failed", "err", err)
		}
	}()
}

// rescan recounts the tree while the guest may be changing it. The result
// never undercounts: growth charged while the scan runs is added to what
// the scan found (growth the scan also saw is counted twice), credits
// during the scan are dropped (an entry the scan counted before it was
// removed stays counted), and inodes we hold open after their last unlink,
// which the scan cannot see, are added.
func (fs *FS) rescan() error {
	fs.acct.mu.Lock()
	fs.acct.scanning = true
	fs.acct.scanGrowBytes, fs.acct.scanGrowInodes = 0, 0
	fs.acct.mu.Unlock()
	defer func() {
		fs.acct.mu.Lock()
		fs.acct.scanning = false
		fs.acct.mu.Unlock()
	}()
	fs.rootMu.RLock()
	if fs.closed.Load() {
		fs.rootMu.RUnlock()
		return ErrClosed
	}
	fd, err := unix.FcntlInt(uintptr(fs.rootFD), unix.F_DUPFD_CLOEXEC, 0)
	fs.rootMu.RUnlock()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	bytes, inodes, err := scanTree(fd, fs.closed.Load)
	if err != nil {
		return err
	}
	heldBytes, heldInodes := fs.heldGone()
	fs.acct.mu.Lock()
	fs.acct.bytes = bytes + heldBytes + fs.acct.scanGrowBytes
	fs.acct.inodes = inodes + heldInodes + fs.acct.scanGrowInodes
	fs.acct.mu.Unlock()
	fs.log.Info("workspacefs: rescanned", "bytes", bytes+heldBytes, "inodes", inodes+heldInodes)
	return nil
}

// heldGone sums the inodes unlinked while we hold them, which a scan
// cannot see. It stats them under tableMu, which keeps their descriptors
// open; it runs only in a rescan and only for such inodes.
func (fs *FS) heldGone() (bytes, inodes int64) {
	fs.tableMu.Lock()
	defer fs.tableMu.Unlock()
	for _, in := range fs.table {
		if !in.gone || len(in.fds) == 0 {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(in.fds[0], &st) == nil && st.Nlink == 0 {
			bytes += statBytes(&st)
			inodes++
		}
	}
	return bytes, inodes
}

func errno(err error) error {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EIO
}
