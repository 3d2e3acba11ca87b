package workspacefs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

func TestFileOperationsRoundTrip(t *testing.T) {
	fs, root := testFS(t, Limits{})
	_, r := attach(t, fs)

	f := create(t, r, "a.txt")
	if _, err := writeAll(f, []byte("hello workspace"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := f.ReadAt(buf, 6)
	if err != nil || string(buf[:n]) != "workspace" {
		t.Fatalf("read = %q, %v", buf[:n], err)
	}
	if err := f.FSync(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "a.txt")); string(got) != "hello workspace" {
		t.Fatalf("host sees %q", got)
	}
	if _, err := r.Mkdir("d", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Symlink("a.txt", "l", p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	l := walk(t, r, "l")
	if target, err := l.Readlink(); err != nil || target != "a.txt" {
		t.Fatalf("readlink = %q, %v", target, err)
	}
	d := walk(t, r, "d")
	if err := r.RenameAt("a.txt", d, "b.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "d", "b.txt")); err != nil {
		t.Fatal(err)
	}
	qids, g, valid, attr, err := r.WalkGetAttr([]string{"d"})
	if err != nil || len(qids) != 1 || !valid.Mode || !attr.Mode.IsDir() || qids[0].Type != p9.TypeDir {
		t.Fatalf("walkgetattr = %v %v %v %v", qids, valid, attr, err)
	}
	g.Close()
	if err := d.UnlinkAt("b.txt", 0); err != nil {
		t.Fatal(err)
	}
	if err := r.UnlinkAt("d", unix.AT_REMOVEDIR); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "d")); !os.IsNotExist(err) {
		t.Fatalf("d still there: %v", err)
	}
	// Truncate and times.
	h := create(t, r, "h")
	if err := h.SetAttr(p9.SetAttrMask{Size: true, MTime: true, MTimeNotSystemTime: true},
		p9.SetAttr{Size: 10, MTimeSeconds: 1000}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(root, "h"))
	if err != nil || st.Size() != 10 || st.ModTime().Unix() != 1000 {
		t.Fatalf("host stat %v size %d mtime %v", err, st.Size(), st.ModTime())
	}
}

func TestOwnersAndModes(t *testing.T) {
	fs, root := testFS(t, Limits{})
	_, r := attach(t, fs)
	d := walk(t, r)
	f, _, _, err := d.Create("suid", p9.ReadWrite, 0o6755, p9.NoUID, p9.NoGID)
	if err != nil {
		t.Fatal(err)
	}
	_, _, attr, err := f.GetAttr(p9.AttrMaskAll)
	if err != nil {
		t.Fatal(err)
	}
	if attr.UID != 0 || attr.GID != 0 {
		t.Errorf("the server's own files show as uid %d gid %d, want 0 0", attr.UID, attr.GID)
	}
	cases := []struct {
		name string
		set  func() error
		path string
		want os.FileMode
	}{
		{"create strips setuid and setgid", func() error { return nil }, "suid", 0o755},
		{"setattr strips setuid and setgid", func() error {
			return f.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o6777})
		}, "suid", 0o777},
		{"mkdir strips setgid, keeps sticky", func() error {
			_, err := r.Mkdir("dir", 0o3777, p9.NoUID, p9.NoGID)
			return err
		}, "dir", os.ModeDir | os.ModeSticky | 0o777},
		{"chown is ignored", func() error {
			return f.SetAttr(p9.SetAttrMask{UID: true, GID: true, Permissions: true}, p9.SetAttr{UID: 1234, GID: 1234, Permissions: 0o600})
		}, "suid", 0o600},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.set(); err != nil {
				t.Fatal(err)
			}
			st, err := os.Lstat(filepath.Join(root, c.path))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode() != c.want {
				t.Errorf("mode %v, want %v", st.Mode(), c.want)
			}
			if uid := st.Sys().(*syscall.Stat_t).Uid; uid != uint32(os.Geteuid()) {
				t.Errorf("owner %d, want %d", uid, os.Geteuid())
			}
		})
	}
}

// TestSymlinkEscape: a guest-made symlink is never followed on the host.
func TestSymlinkEscape(t *testing.T) {
	fs, root := testFS(t, Limits{})
	// One made on the host too, pointing at the host's /etc.
	if err := os.Symlink("/etc", filepath.Join(root, "hostlink")); err != nil {
		t.Fatal(err)
	}
	_, r := attach(t, fs)
	for _, c := range [][2]string{{"/etc", "x"}, {"..", "up"}, {"../../../../etc/passwd", "deep"}} {
		if _, err := r.Symlink(c[0], c[1], p9.NoUID, p9.NoGID); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"x", "up", "deep", "hostlink"} {
		t.Run(name, func(t *testing.T) {
			l := walk(t, r, name)
			_, _, attr, err := l.GetAttr(p9.AttrMaskAll)
			if err != nil || !attr.Mode.IsSymlink() {
				t.Fatalf("%s is not seen as a symlink: %v %v", name, attr.Mode, err)
			}
			if _, _, err := l.Open(p9.ReadOnly); err == nil {
				t.Errorf("opened symlink %s", name)
			}
			for _, next := range []string{"passwd", "hostname", "ws"} {
				if _, f, err := r.Walk([]string{name, next}); err == nil {
					f.Close()
					t.Errorf("walked through %s to %s", name, next)
				}
			}
			if err := l.SetAttr(p9.SetAttrMask{Permissions: true, MTime: true}, p9.SetAttr{Permissions: 0o777}); err != nil {
				t.Fatal(err)
			}
			if _, f, err := l.Walk([]string{"passwd"}); err == nil {
				f.Close()
				t.Errorf("walked from symlink fid %s", name)
			}
		})
	}
	// The host's /etc kept its mode: SetAttr on the symlinks did not reach it.
	if st, err := os.Stat("/etc"); err != nil || st.Mode().Perm() == 0o777 {
		t.Fatalf("/etc mode %v, %v", st.Mode(), err)
	}
	for _, bad := range []string{"..", ".", "", "a/b", "/etc"} {
		if _, f, err := r.Walk([]string{bad}); err == nil {
			f.Close()
			t.Errorf("walked %q", bad)
		}
		if err := validName(bad); err == nil {
			t.Errorf("validName(%q) accepted", bad)
		}
	}
}

// TestHardLinks: a hard link names a File the guest reached by walking from
// the root, so a file outside the workspace cannot be its target; only
// regular files can.
func TestHardLinks(t *testing.T) {
	fs, root := testFS(t, Limits{})
	os.Symlink("/etc/passwd", filepath.Join(root, "out"))
	_, r := attach(t, fs)
	f := create(t, r, "file")
	f.Close()
	if _, err := r.Mkdir("dir", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		target string
		ok     bool
	}{{"file", true}, {"out", false}, {"dir", false}}
	for _, c := range cases {
		t.Run(c.target, func(t *testing.T) {
			tf := walk(t, r, c.target)
			defer tf.Close()
			err := r.Link(tf, "link-"+c.target)
			if (err == nil) != c.ok {
				t.Fatalf("link to %s: %v", c.target, err)
			}
		})
	}
	st, err := os.Lstat(filepath.Join(root, "link-file"))
	if err != nil || st.Sys().(*syscall.Stat_t).Nlink != 2 {
		t.Fatalf("link-file: %v", err)
	}
}

// TestSpecialFilesNeverOpened: a FIFO would block the goroutine that opens
// it; devices reach the host's hardware.
func TestSpecialFilesNeverOpened(t *testing.T) {
	fs, root := testFS(t, Limits{})
	if err := unix.Mkfifo(filepath.Join(root, "hostfifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, r := attach(t, fs)
	if _, err := r.Mknod("guestfifo", p9.ModeNamedPipe|0o644, 0, 0, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Mknod("sock", p9.ModeSocket|0o644, 0, 0, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"hostfifo", "guestfifo", "sock"} {
		for _, mode := range []p9.OpenFlags{p9.ReadOnly, p9.WriteOnly, p9.ReadWrite} {
			f := walk(t, r, name)
			done := make(chan error, 1)
			go func() { _, _, err := f.Open(mode); done <- err }()
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("opened %s", name)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("open of %s blocked", name)
			}
			f.Close()
		}
	}
	for _, mode := range []p9.FileMode{p9.ModeCharacterDevice | 0o666, p9.ModeBlockDevice | 0o666} {
		_, err := r.Mknod("dev", mode, 1, 3, p9.NoUID, p9.NoGID)
		if !isErrno(err, linux.EPERM) {
			t.Errorf("mknod %v: %v, want EPERM", mode, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "dev")); !os.IsNotExist(err) {
		t.Fatal("a device node was made")
	}
}

// TestWritePastBound: writing more than the bound ends in ENOSPC and the
// host holds no more than the bound plus one block of slack.
func TestWritePastBound(t *testing.T) {
	const bound = 2 * MiB
	fs, root := testFS(t, Limits{Bytes: bound})
	_, r := attach(t, fs)
	f := create(t, r, "big")
	chunk := bytes.Repeat([]byte{'x'}, 256<<10)
	var off int64
	var err error
	for off < 8*MiB && err == nil {
		var n int64
		n, err = writeAll(f, chunk, off)
		off += n
	}
	if !isErrno(err, linux.ENOSPC) {
		t.Fatalf("wrote %d bytes, err %v; want ENOSPC", off, err)
	}
	used, _ := hostUsage(t, root)
	if used > bound+blockSize {
		t.Fatalf("host holds %d bytes, bound %d", used, bound)
	}
	if off < bound-64<<10 {
		t.Fatalf("only %d bytes written under a %d bound", off, bound)
	}
	// A second file cannot go on either.
	g := create(t, r, "more")
	if _, err := g.WriteAt(chunk, 0); !isErrno(err, linux.ENOSPC) {
		t.Fatalf("second file: %v, want ENOSPC", err)
	}
	// Overwriting in place still works when full.
	if _, err := f.WriteAt([]byte("y"), 100); err != nil {
		t.Fatalf("overwrite in place when full: %v", err)
	}
	// Truncating gives the room back.
	if err := f.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := writeAll(g, chunk, 0); err != nil {
		t.Fatalf("after truncate: %v", err)
	}
	if u := fs.Usage(); u.Bytes < int64(len(chunk)) || u.Bytes > bound {
		t.Fatalf("usage %d", u.Bytes)
	}
}

// TestInodeBound: many empty files stop at the inode bound.
func TestInodeBound(t *testing.T) {
	const limit = 50
	fs, root := testFS(t, Limits{Inodes: limit})
	_, r := attach(t, fs)
	var err error
	made := 0
	for i := 0; i < 2*limit && err == nil; i++ {
		var f p9.File
		d := walk(t, r)
		switch i % 3 {
		case 0:
			f, _, _, err = d.Create("f"+strconv.Itoa(i), p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
			if err == nil {
				f.Close()
			}
		case 1:
			_, err = r.Mkdir("d"+strconv.Itoa(i), 0o755, p9.NoUID, p9.NoGID)
		case 2:
			_, err = r.Symlink("x", "s"+strconv.Itoa(i), p9.NoUID, p9.NoGID)
		}
		d.Close()
		if err == nil {
			made++
		}
	}
	if !isErrno(err, linux.ENOSPC) {
		t.Fatalf("made %d, err %v; want ENOSPC", made, err)
	}
	if _, n := hostUsage(t, root); n > limit {
		t.Fatalf("%d inodes on the host, bound %d", n, limit)
	}
	// Removing one makes room for one.
	if err := r.UnlinkAt("f0", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Mkdir("again", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatalf("after unlink: %v", err)
	}
}

// TestOpenUnlinkKeepWriting: a file unlinked while open still takes its
// blocks, so it is credited only at its last close.
func TestOpenUnlinkKeepWriting(t *testing.T) {
	const bound = 2 * MiB
	fs, root := testFS(t, Limits{Bytes: bound})
	_, r := attach(t, fs)
	chunk := bytes.Repeat([]byte{'z'}, 256<<10)
	var held []p9.File
	var total int64
	var err error
	for round := 0; round < 10 && err == nil; round++ {
		name := "victim" + strconv.Itoa(round)
		f := create(t, r, name)
		held = append(held, f)
		var n int64
		n, err = writeAll(f, chunk, 0)
		total += n
		if err == nil {
			if uerr := r.UnlinkAt(name, 0); uerr != nil {
				t.Fatal(uerr)
			}
			// Keep writing to the unlinked file.
			n, err = writeAll(f, chunk, int64(len(chunk)))
			total += n
		}
	}
	if !isErrno(err, linux.ENOSPC) {
		t.Fatalf("wrote %d bytes through unlinked files without ENOSPC (%v)", total, err)
	}
	// What the host holds: the visible tree plus the unlinked open files.
	var unlinked int64
	for _, f := range held {
		_, _, attr, _ := f.GetAttr(p9.AttrMaskAll)
		unlinked += int64(attr.Blocks) * 512
	}
	visible, _ := hostUsage(t, root)
	if visible+unlinked > bound+blockSize {
		t.Fatalf("host holds %d bytes (%d unlinked), bound %d", visible+unlinked, unlinked, bound)
	}
	for _, f := range held {
		f.Close()
	}
	// The clunks are processed before the next reply; then room is back.
	g := create(t, r, "after")
	if _, err := writeAll(g, chunk, 0); err != nil {
		t.Fatalf("after closing the unlinked files: %v", err)
	}
}

// TestUnlinkWhileWalkedCountsAtClose: a fid that was only walked (not
// opened) also keeps an unlinked inode's blocks alive.
func TestUnlinkWhileWalkedCountsAtClose(t *testing.T) {
	fs, _ := testFS(t, Limits{Bytes: 4 * MiB})
	_, r := attach(t, fs)
	f := create(t, r, "f")
	if _, err := writeAll(f, make([]byte, MiB), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	w := walk(t, r, "f")
	before := fs.Usage().Bytes
	if err := r.UnlinkAt("f", 0); err != nil {
		t.Fatal(err)
	}
	if u := fs.Usage().Bytes; u != before {
		t.Fatalf("credited at unlink (%d -> %d) while a fid holds the inode", before, u)
	}
	w.Close()
	walk(t, r).Close() // a round trip: the clunk is done
	if u := fs.Usage().Bytes; u > before-MiB {
		t.Fatalf("not credited at the last close: %d -> %d", before, u)
	}
}

func TestStatFSShowsBound(t *testing.T) {
	fs, _ := testFS(t, Limits{Bytes: 64 * MiB, Inodes: 1000})
	_, r := attach(t, fs)
	f := create(t, r, "f")
	if _, err := writeAll(f, make([]byte, MiB), 0); err != nil {
		t.Fatal(err)
	}
	st, err := r.StatFS()
	if err != nil {
		t.Fatal(err)
	}
	u := fs.Usage()
	want := p9.FSStat{Type: v9fsMagic, BlockSize: 4096, Blocks: 64 * MiB / 4096,
		BlocksFree: uint64(64*MiB-u.Bytes)/4096 - 1, BlocksAvailable: uint64(64*MiB-u.Bytes)/4096 - 1,
		Files: 1000, FilesFree: uint64(1000 - u.Inodes), FSID: st.FSID, NameLength: 255}
	if st != want {
		t.Fatalf("statfs %+v, want %+v", st, want)
	}
	// What it says is available can be written (to within a block: the
	// client cuts a write into messages that do not end on a block, and
	// the last one's first block was taken by the one before), then
	// nothing.
	avail := make([]byte, st.BlocksAvailable*4096)
	n, err := f.WriteAt(avail, MiB)
	if err != nil || n < len(avail)-4096 {
		t.Fatalf("writing the %d bytes statfs called available: %d, %v", len(avail), n, err)
	}
	if st, _ := r.StatFS(); st.BlocksAvailable != 0 {
		t.Fatalf("after filling what was available: %d blocks available", st.BlocksAvailable)
	}
	if _, err := f.WriteAt(make([]byte, 4096), MiB+int64(n)); !isErrno(err, linux.ENOSPC) {
		t.Fatalf("a write once nothing is available: %v, want ENOSPC", err)
	}
	if err := r.UnlinkAt("f", 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	walk(t, r).Close() // a round trip: the clunk is done
	// Host room below the bound's room shows instead.
	fs.setHostFree(func() (int64, error) { return DefaultHostReserve + 8*MiB, nil })
	if st, _ := r.StatFS(); st.BlocksAvailable != 8*MiB/4096-1 {
		t.Fatalf("available %d blocks, want %d", st.BlocksAvailable, 8*MiB/4096-1)
	}
	fs.setHostFree(func() (int64, error) { return 1, nil })
	if st, _ := r.StatFS(); st.BlocksAvailable != 0 {
		t.Fatalf("available %d with the host below its reserve", st.BlocksAvailable)
	}
}

// TestTreeOverBoundAtOpen: a workspace already over its bound opens, and
// growth is refused.
func TestTreeOverBoundAtOpen(t *testing.T) {
	root := filepath.Join(t.TempDir(), "ws")
	os.MkdirAll(filepath.Join(root, "sub"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "sub", "big"), bytes.Repeat([]byte{1}, 3*MiB), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Link(filepath.Join(root, "sub", "big"), filepath.Join(root, "hard"))
	fs := openFS(t, root, Limits{Bytes: MiB})
	if u := fs.Usage(); u.Bytes < 3*MiB || u.Bytes > 3*MiB+64<<10 || u.Inodes != 3 {
		t.Fatalf("usage %+v: the hard link must count once", u)
	}
	_, r := attach(t, fs)
	if _, _, _, err := walk(t, r).Create("new", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID); !isErrno(err, linux.ENOSPC) {
		t.Fatalf("create: %v, want ENOSPC", err)
	}
	f := walk(t, r, "hard")
	if _, _, err := f.Open(p9.ReadWrite); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("grow"), 3*MiB); !isErrno(err, linux.ENOSPC) {
		t.Fatalf("grow: %v, want ENOSPC", err)
	}
	if st, _ := r.StatFS(); st.BlocksAvailable != 0 {
		t.Fatalf("statfs shows %d blocks free", st.BlocksAvailable)
	}
}

// TestHostReserve: a bound larger than the host's free space still leaves
// the reserve free.
func TestHostReserve(t *testing.T) {
	fs, _ := testFS(t, Limits{Bytes: 1 << 40, HostReserve: 4 * MiB})
	var written int64
	fs.setHostFree(func() (int64, error) {
		u, _ := fs.acct.snapshot()
		return 5*MiB - u, nil // the host starts with 5 MiB free
	})
	_, r := attach(t, fs)
	f := create(t, r, "f")
	written, err := writeAll(f, make([]byte, 4*MiB), 0)
	if !isErrno(err, linux.ENOSPC) {
		t.Fatalf("wrote %d, err %v; want ENOSPC", written, err)
	}
	if u := fs.Usage(); u.Bytes > MiB {
		t.Fatalf("took %d bytes of 1 MiB above the reserve", u.Bytes)
	}
}

// TestRescanSeesHostFrees: space the user frees on the host counts again.
func TestRescanSeesHostFrees(t *testing.T) {
	fs, root := testFS(t, Limits{Bytes: 2 * MiB})
	if err := os.WriteFile(filepath.Join(root, "hostfile"), make([]byte, MiB), 0o644); err != nil {
		t.Fatal(err)
	}
	// The FS does not know of hostfile yet; it learns it at a rescan.
	if err := fs.rescan(); err != nil {
		t.Fatal(err)
	}
	_, r := attach(t, fs)
	f := create(t, r, "f")
	n, err := writeAll(f, make([]byte, 2*MiB), 0)
	if !isErrno(err, linux.ENOSPC) || n > MiB {
		t.Fatalf("wrote %d (%v) with 1 MiB taken on the host", n, err)
	}
	os.Remove(filepath.Join(root, "hostfile"))
	fs.rescanMu.Lock()
	fs.lastRescan = time.Time{}
	fs.rescanMu.Unlock()
	if _, err := f.WriteAt(make([]byte, 4096), n); !isErrno(err, linux.ENOSPC) {
		t.Fatalf("write before the rescan: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err = writeAll(f, make([]byte, 512<<10), n); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("room freed on the host never came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRescanNeverUndercounts: growth during a rescan is kept, and inodes
// held after their last unlink are counted though the scan cannot see them.
func TestRescanNeverUndercounts(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	_, r := attach(t, fs)
	f := create(t, r, "held")
	if _, err := writeAll(f, make([]byte, MiB), 0); err != nil {
		t.Fatal(err)
	}
	if err := r.UnlinkAt("held", 0); err != nil {
		t.Fatal(err)
	}
	if err := fs.rescan(); err != nil {
		t.Fatal(err)
	}
	if u := fs.Usage(); u.Bytes < MiB {
		t.Fatalf("rescan lost the held unlinked file: %d bytes", u.Bytes)
	}
	f.Close()
	walk(t, r).Close()
	if u := fs.Usage(); u.Bytes >= MiB {
		t.Fatalf("not credited at close: %d", u.Bytes)
	}
}

func TestReaddirOffsets(t *testing.T) {
	fs, root := testFS(t, Limits{})
	want := map[string]bool{}
	for i := 0; i < 500; i++ {
		name := "entry-with-a-longish-name-" + strconv.Itoa(i)
		os.WriteFile(filepath.Join(root, name), nil, 0o644)
		want[name] = true
	}
	_, r := attach(t, fs)
	d := walk(t, r)
	if _, _, err := d.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	read := func(count uint32) []string {
		var names []string
		var off uint64
		for {
			ents, err := d.Readdir(off, count)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) == 0 {
				return names
			}
			for _, e := range ents {
				names = append(names, e.Name)
				off = e.Offset
			}
		}
	}
	for _, count := range []uint32{200, 4096, 65536} {
		names := read(count)
		got := map[string]bool{}
		for _, n := range names {
			if got[n] {
				t.Fatalf("count %d: %s twice", count, n)
			}
			got[n] = true
		}
		delete(got, ".")
		delete(got, "..")
		if len(got) != len(want) {
			t.Fatalf("count %d: %d entries, want %d", count, len(got), len(want))
		}
	}
	// Offsets are stable: reading from a cookie again gives the same rest.
	ents, _ := d.Readdir(0, 4096)
	mid := ents[len(ents)/2]
	a, _ := d.Readdir(mid.Offset, 4096)
	b, _ := d.Readdir(mid.Offset, 4096)
	if len(a) == 0 || len(a) != len(b) || a[0].Name != b[0].Name {
		t.Fatal("rereading from a cookie differs")
	}
}

// TestXattrsAnsweredByTransport: the host's xattrs are not the guest's.
func TestXattrsAnsweredByTransport(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	conn, _ := serve(t, fs)
	conn.Write(tversion(0xffff))
	readReply(t, conn)
	conn.Write(tattach(1, 1))
	if typ, _, _ := readReply(t, conn); typ != tAttach+1 {
		t.Fatalf("attach reply %d", typ)
	}
	cases := []struct {
		name  string
		req   []byte
		typ   byte
		errno uint32
	}{
		{"get", msg(msgTxattrwalk, 2, u32(1), u32(2), str("user.x")), msgRlerror, errnoENODATA},
		{"list", msg(msgTxattrwalk, 3, u32(1), u32(3), str("")), msgRxattrwalk, 0},
		{"set", msg(msgTxattrcreate, 4, u32(1), str("user.x"), u64(1<<40), u32(0)), msgRlerror, errnoEOPNOTSUPP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conn.Write(c.req)
			typ, _, body := readReply(t, conn)
			if typ != c.typ {
				t.Fatalf("reply type %d, want %d", typ, c.typ)
			}
			if typ == msgRlerror && u32le(body) != c.errno {
				t.Fatalf("errno %d, want %d", u32le(body), c.errno)
			}
			if typ == msgRxattrwalk && !bytes.Equal(body, make([]byte, 8)) {
				t.Fatalf("list size %x", body)
			}
		})
	}
	// The connection still works after them.
	conn.Write(msg(tWalk, 5, u32(1), u32(9), []byte{0, 0}))
	if typ, _, _ := readReply(t, conn); typ != tWalk+1 {
		t.Fatalf("walk after xattrs: reply %d", typ)
	}
}

func u32le(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// TestFidCap: a client cannot make the server hold more Files (and
// descriptors) than the cap, nor take another connection's.
func TestFidCap(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	fs.maxFiles = 40
	fdsBefore := openFDs(t)
	_, r := attach(t, fs)
	var held []p9.File
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		var f p9.File
		_, f, err = r.Walk(nil)
		if err == nil {
			held = append(held, f)
		}
	}
	if !isErrno(err, linux.EMFILE) {
		t.Fatalf("%d clones, err %v; want EMFILE", len(held), err)
	}
	if n := fs.files.Load(); n > 40 {
		t.Fatalf("%d Files alive, cap 40", n)
	}
	// The cap is the connection's: another connection (the guest's own
	// mount, when a hostile one took its share) still works.
	other, otherRoot := attach(t, fs)
	walk(t, otherRoot).Close()
	otherRoot.Close()
	other.Close()
	held[0].Close()
	held = held[1:]
	d := walk(t, r) // takes the freed slot
	if _, _, _, err := d.Create("x", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID); !isErrno(err, linux.EMFILE) {
		t.Fatalf("create past the cap: %v", err)
	}
	held = append(held, d)
	if fds := openFDs(t); fds > fdsBefore+2*40+4 {
		t.Fatalf("%d descriptors open, %d before", fds, fdsBefore)
	}
	for _, f := range held {
		f.Close()
	}
	walk(t, r).Close()
	if n := fs.files.Load(); n != 1 {
		t.Fatalf("%d Files alive after closing, want 1 (the root)", n)
	}
}

func TestMaxConns(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	attach(t, fs)
	attach(t, fs)
	c, s := socketPair(t)
	defer c.Close()
	done := make(chan error, 1)
	go func() { done <- fs.Serve(context.Background(), s) }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("third connection served")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("third connection not refused at once")
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("third connection left open")
	}
}

// TestJunkClosesOnlyItsConnection: garbage on one connection closes it,
// without a panic, and another connection keeps working.
func TestJunkClosesOnlyItsConnection(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	_, r := attach(t, fs)
	junk := map[string][]byte{
		"huge size":         {0xff, 0xff, 0xff, 0x7f, tWrite, 1, 0},
		"size below header": {3, 0, 0, 0, tWrite, 1, 0},
		"over msize":        msg(tWrite, 1, make([]byte, MaxMessage)),
		"random":            bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0x01}, 1000),
		"tversion short":    msg(tVersion, 1, []byte{1}),
		"truncated header":  {20, 0},
	}
	names := make([]string, 0, len(junk))
	for k := range junk {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			conn, done := serve(t, fs)
			conn.Write(junk[name])
			if name == "truncated header" {
				conn.(interface{ CloseWrite() error }).CloseWrite()
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("junk connection still served")
			}
			if _, _, _, err := walk(t, r).GetAttr(p9.AttrMaskAll); err != nil {
				t.Fatalf("other connection broken: %v", err)
			}
		})
	}
}

// TestFloodStaysBounded: a client that sends 10,000 large requests and
// reads no reply makes the server hold at most MaxInflight of them (each
// Rread holds a message-sized buffer until it is sent).
func TestFloodStaysBounded(t *testing.T) {
	const flood = 10000
	fs, _ := testFS(t, Limits{Bytes: 1 << 40})
	startG := runtime.NumGoroutine()
	rc, r := attach(t, fs) // a second, well-behaved connection
	runtime.GC()
	baseG := runtime.NumGoroutine()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap := ms.HeapInuse

	conn, done := serve(t, fs)
	conn.Write(tversion(0xffff))
	readReply(t, conn)
	conn.Write(tattach(1, 1))
	readReply(t, conn)
	conn.Write(tlcreate(2, 1, "flood"))
	if typ, _, _ := readReply(t, conn); typ != tLcreate+1 {
		t.Fatalf("lcreate reply %d", typ)
	}
	conn.Write(twrite(3, 1, 0, make([]byte, 256<<10-64)))
	if typ, _, _ := readReply(t, conn); typ != tWrite+1 {
		t.Fatalf("write reply %d", typ)
	}
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < flood; n++ {
			tread := msg(tRead, uint16(n%60000), u32(1), u64(0), u32(256<<10-64))
			if _, err := conn.Write(tread); err != nil {
				break
			}
		}
		sent <- n
	}()
	time.Sleep(2 * time.Second) // let it stall
	runtime.GC()
	runtime.ReadMemStats(&ms)
	g := runtime.NumGoroutine()
	t.Logf("goroutines %d (before %d), heap grew %d KiB", g, baseG, (int64(ms.HeapInuse)-int64(baseHeap))>>10)
	if g > baseG+MaxInflight+16 {
		t.Errorf("%d goroutines during the flood, %d before", g, baseG)
	}
	if grown := int64(ms.HeapInuse) - int64(baseHeap); grown > 3*MaxInflight*MaxMessage {
		t.Errorf("heap grew %d MiB during the flood", grown/MiB)
	}
	// The other connection is served meanwhile.
	if _, _, _, err := walk(t, r).GetAttr(p9.AttrMaskAll); err != nil {
		t.Fatalf("other connection: %v", err)
	}
	conn.Close()
	<-sent
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	// The library keeps a varying number of idle receivers per connection;
	// once both connections are gone, every goroutine must be.
	rc.Close()
	waitGoroutines(t, startG)
}

// TestServeEndsWithContext: cancelling ctx closes the connection and
// Serve returns after its handlers, leaving no goroutine behind.
func TestServeEndsWithContext(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	base := runtime.NumGoroutine()
	c, s := socketPair(t)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fs.Serve(ctx, s) }()
	cl, err := p9.NewClient(c, p9.WithMessageSize(MaxMessage))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Attach("/"); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Serve returned nil after ctx ended")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after ctx ended")
	}
	cl.Close()
	waitGoroutines(t, base)
	if n := fs.files.Load(); n != 0 {
		t.Fatalf("%d Files alive after Serve returned", n)
	}
}

func TestCloseRefusesServe(t *testing.T) {
	fs, _ := testFS(t, Limits{})
	fs.Close()
	c, s := socketPair(t)
	defer c.Close()
	if err := fs.Serve(context.Background(), s); err == nil {
		t.Fatal("Serve after Close")
	}
}

// A directory's entries carry the QIDs a walk to them gives (type and
// path), so the guest's kernel sees one file, not two.
func TestReaddirQIDsAreTheWalksQIDs(t *testing.T) {
	fs, root := testFS(t, Limits{})
	os.WriteFile(filepath.Join(root, "file"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(root, "dir"), 0o755)
	os.Symlink("file", filepath.Join(root, "link"))
	_, r := attach(t, fs)
	d := walk(t, r)
	if _, _, err := d.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	ents, err := d.Readdir(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]p9.QIDType{"file": p9.TypeRegular, "dir": p9.TypeDir, "link": p9.TypeSymlink}
	for _, e := range ents {
		typ, ok := want[e.Name]
		if !ok {
			continue
		}
		delete(want, e.Name)
		qids, f, err := r.Walk([]string{e.Name})
		if err != nil || len(qids) != 1 {
			t.Fatalf("walk %s: %v %v", e.Name, qids, err)
		}
		f.Close()
		if e.QID.Type != typ || e.QID != qids[0] {
			t.Errorf("%s: readdir QID %+v, walk QID %+v, want type %v", e.Name, e.QID, qids[0], typ)
		}
	}
	if len(want) > 0 {
		t.Fatalf("not in readdir: %v", want)
	}
}
