package guestfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// The initramfs is written with a small newc writer of our own rather than
// cavaliergopher/cpio's Writer because that one cannot set a device
// node's rdev (major/minor), and the kernel needs /dev/console in the
// initramfs: it opens it for init's stdin/stdout/stderr before /init runs,
// and devtmpfs is not mounted yet. cavaliergopher/cpio reads the archives
// back in the tests.

// Mode type bits of a cpio (and stat) mode.
const (
	modeDir     = 0o040000
	modeReg     = 0o100000
	modeSymlink = 0o120000
	modeChar    = 0o020000
)

// fixedMtime is every entry's mtime, so the archive (and its hash) depends
// only on content.
const fixedMtime = 0

type cpioEntry struct {
	Mode                 uint32 // type | permission bits
	Data                 []byte // regular file contents
	Link                 string // symlink target
	RdevMajor, RdevMinor uint32
}

// fsTree is the initramfs being assembled: entries by path without the
// leading slash.
type fsTree struct {
	entries map[string]*cpioEntry
}

func newFSTree() *fsTree { return &fsTree{entries: map[string]*cpioEntry{}} }

func cleanName(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// parents adds the directories above name (0755) that are not there yet.
func (t *fsTree) parents(name string) {
	for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
		if _, ok := t.entries[d]; !ok {
			t.entries[d] = &cpioEntry{Mode: modeDir | 0o755}
		}
	}
}

// underNonDir says whether an entry above name is not a directory.
func (t *fsTree) underNonDir(name string) bool {
	for d := path.Dir(cleanName(name)); d != "." && d != "/"; d = path.Dir(d) {
		if e, ok := t.entries[d]; ok && e.Mode&^0o7777 != modeDir {
			return true
		}
	}
	return false
}

func (t *fsTree) put(name string, e *cpioEntry) {
	name = cleanName(name)
	t.parents(name)
	t.entries[name] = e
}

func (t *fsTree) dir(name string, perm uint32) {
	t.put(name, &cpioEntry{Mode: modeDir | perm})
}

func (t *fsTree) file(name string, perm uint32, data []byte) {
	t.put(name, &cpioEntry{Mode: modeReg | perm, Data: data})
}

func (t *fsTree) symlink(name, target string) {
	t.put(name, &cpioEntry{Mode: modeSymlink | 0o777, Link: target})
}

func (t *fsTree) charDev(name string, perm, major, minor uint32) {
	t.put(name, &cpioEntry{Mode: modeChar | perm, RdevMajor: major, RdevMinor: minor})
}

// names returns the entry names sorted; a directory sorts before anything
// inside it (a prefix sorts first), which the kernel's unpacker needs since
// it does not create parent directories.
func (t *fsTree) names() []string {
	names := make([]string, 0, len(t.entries))
	for n := range t.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// writeCpio writes the tree as an uncompressed newc archive: sorted
// entries, inodes numbered in that order, uid/gid 0, fixed mtimes.
func (t *fsTree) writeCpio(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	cw := &newcWriter{w: bw}
	for i, name := range t.names() {
		e := t.entries[name]
		if err := cw.entry(uint32(i+1), name, e); err != nil {
			return fmt.Errorf("writing cpio entry %s: %w", name, err)
		}
	}
	if err := cw.entry(0, "TRAILER!!!", &cpioEntry{}); err != nil {
		return fmt.Errorf("writing cpio trailer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing cpio: %w", err)
	}
	return nil
}

type newcWriter struct {
	w   io.Writer
	off int64
}

func (c *newcWriter) write(p []byte) error {
	n, err := c.w.Write(p)
	c.off += int64(n)
	return err
}

func (c *newcWriter) pad() error {
	if n := (4 - c.off%4) % 4; n > 0 {
		return c.write(make([]byte, n))
	}
	return nil
}

func (c *newcWriter) entry(ino uint32, name string, e *cpioEntry) error {
	var body []byte
	switch e.Mode &^ 0o7777 {
	case modeReg:
		body = e.Data
	case modeSymlink:
		body = []byte(e.Link)
	}
	if int64(len(body)) > 0xFFFFFFFF {
		return errors.New("file larger than 4 GiB does not fit in newc")
	}
	nlink := uint32(1)
	if e.Mode&^0o7777 == modeDir {
		nlink = 2
	}
	if name == "TRAILER!!!" {
		nlink = 1
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, e.Mode, 0, 0, nlink, fixedMtime, len(body),
		0, 0, e.RdevMajor, e.RdevMinor, len(name)+1, 0)
	if err := c.write([]byte(hdr)); err != nil {
		return err
	}
	if err := c.write(append([]byte(name), 0)); err != nil {
		return err
	}
	if err := c.pad(); err != nil {
		return err
	}
	if err := c.write(body); err != nil {
		return err
	}
	return c.pad()
}
