// Package workspacefs serves one workspace directory to a guest over
// 9P2000.L, with a bound on what the guest can take on the host. The guest
// mounts it with version=9p2000.L,msize=262144,cache=mmap over trans=fd;
// the protocol is github.com/hugelgupf/p9's server, and this package
// supplies the file layer (p9.Attacher, p9.File), the accounting and a
// transport that bounds what one connection can make the server hold.
//
// # Why not QEMU's local fsdev
//
// QEMU's -fsdev local has no size or quota option (its throttling limits
// only the rate), and its statfs is the host directory's, so a guest
// fills the host's disk and its df shows the host's free space. Host
// quotas, loop mounts and FUSE need root or /dev/fuse. Only an interposer
// on the write path can answer ENOSPC while the files stay live in place,
// which a user's project directory needs; this server is that interposer,
// and needs nothing on the host.
//
// # Threat model
//
// The guest is root in its VM and may write arbitrary bytes on the stream
// (raw 9P, not only what the Linux client sends). It must not:
//
//   - reach outside the workspace: every fid holds an O_PATH|O_NOFOLLOW
//     descriptor obtained by walking from the root one name at a time
//     (names "", ".", ".." and anything with "/" are refused); no symlink
//     is ever followed on the host, and a symlink's target is only stored
//     and read back. Opening reopens the inode the descriptor holds
//     through /proc/self/fd/N, which resolves no path. A hard link's target
//     is a fid, so it is inside the workspace by construction;
//   - touch host devices, block a server goroutine, or gain privilege:
//     only regular files and directories are opened (a FIFO, socket or
//     device in the tree gets ENXIO or EPERM), mknod makes FIFOs, sockets
//     and regular files only, setuid and setgid are stripped from every
//     mode set or created, and owners are never changed;
//   - take more than its bound, or the host's last bytes (see below);
//   - make the server hold unbounded memory, goroutines or descriptors:
//     at most MaxConns connections, MaxFids File objects (each with up to
//     two descriptors, and never more than half of RLIMIT_NOFILE less 256)
//     across the FS, MaxInflight unanswered requests per connection, and
//     messages of at most MaxMessage bytes (Tversion's msize is clamped to
//     it). A message outside the size range closes its connection with a
//     logged reason; other connections are not affected.
//
// The per-VM process that runs the server is the one the guest attacks;
// the server's file layer runs with that process's credentials, so the
// workspace's owner is its user.
//
// # The bound
//
// Usage is what fills the host's disk: the allocated blocks (st_blocks *
// 512) of every inode under the root, each counted once (hard links once),
// and the number of inodes. Open scans the tree once; a tree already over
// the bound opens, and growth is then refused. After that the count moves
// with what the guest does:
//
//   - a write reserves its length rounded up to 4 KiB plus one 4 KiB block
//     (a write straddling a block boundary) against the room left, the
//     lesser of Limits.Bytes less usage and the host filesystem's free
//     space (fstatfs of the root) less Limits.HostReserve. When all of it
//     fits, the write goes ahead; when part fits, the write is shortened to
//     the room less one block, rounded down to 4 KiB (the guest's kernel
//     retries the rest and gets ENOSPC); when less than two blocks are
//     left, it gets ENOSPC. After the write the reservation is settled to
//     the file's measured st_blocks change; writes and truncates on one
//     inode are serialized so the change is exact. An overwrite inside a
//     file without holes allocates nothing and needs no room, so a full
//     workspace still lets a database update in place;
//   - truncating credits or charges the measured change (growing is
//     sparse);
//   - create, mkdir, symlink and mknod need one inode (ENOSPC past
//     Limits.Inodes) and one block of room, and charge the new node's
//     blocks and the directory's growth;
//   - unlink, rmdir and rename-over credit the entry's blocks and inode
//     when its last link goes. When a fid (opened or not) holds the inode,
//     its blocks stay taken on the host, so the credit waits for the last
//     close; otherwise open, write, unlink and keep writing would fill the
//     host without bound.
//
// When a write or create is refused, the tree is rescanned in the
// background (at most once every 10 s), so space the user freed on the
// host counts again. The rescan runs while the guest works and never
// undercounts: growth charged during it is added to what it found (growth
// it also saw counts twice), credits during it are dropped (an entry it
// counted before it went stays counted) and inodes held after their last
// unlink, which no scan can see, are added. Overcounting is corrected by
// the next rescan.
//
// The accountant's lock covers arithmetic only; the syscalls around a
// write run outside it. Concurrent writes to different files may each see
// the host's free space before the others' blocks are allocated, so the
// host room is exact only up to the writes in flight (at most MaxInflight
// per connection, each at most MaxMessage); HostReserve absorbs that.
//
// # What the guest sees
//
// A write past the bound is short, then fails with ENOSPC; creating past
// either bound fails with ENOSPC. statfs (df) shows Limits.Bytes as the
// size and the room left as free and available, Limits.Inodes as the
// inode count, and 255 as the longest name.
//
// Deviations from a local filesystem:
//
//   - owners are the server's user, shown to the guest as root (0/0);
//     chown succeeds and changes nothing (as QEMU's security_model=none);
//   - no setuid or setgid bits, no device nodes (EPERM), and FIFOs and
//     sockets exist but cannot be opened (ENXIO);
//   - no extended attributes: get gives ENODATA, list is empty, set and
//     remove give EOPNOTSUPP (the host's xattrs are not the guest's);
//   - locks always succeed (the guest's kernel arbitrates its own
//     processes, as with QEMU);
//   - a symlink's mode and times cannot be set (silently kept);
//   - unlinking a name that no longer exists succeeds (the library keeps a
//     node for every name it is asked to unlink until the unlink succeeds);
//   - creating a name that appeared on the host meanwhile opens it unless
//     the guest asked for O_EXCL.
package workspacefs
