package guestfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"testing"

	"github.com/cavaliergopher/cpio"
)

type readEntry struct {
	hdr  *cpio.Header
	data []byte
}

// readCpio reads an archive back with cavaliergopher/cpio, in order.
func readCpio(t *testing.T, archive []byte) ([]string, map[string]readEntry) {
	t.Helper()
	r := cpio.NewReader(bytes.NewReader(archive))
	var names []string
	entries := map[string]readEntry{}
	for {
		hdr, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		entries[hdr.Name] = readEntry{hdr, data}
	}
	return names, entries
}

func testInitramfs(reverse bool) *fsTree {
	t := newFSTree()
	mods := []string{"/lib/modules/6.1.0-99-amd64/kernel/drivers/virtio/virtio.ko", "/lib/modules/6.1.0-99-amd64/kernel/fs/9p/9p.ko"}
	if reverse {
		// Same content, inserted in another order: the archive must match.
		mods = []string{mods[1], mods[0]}
	}
	for _, m := range mods {
		t.file(m, 0o644, []byte("module "+m))
	}
	t.file(LoadOrderPath, 0o644, []byte("/lib/modules/6.1.0-99-amd64/kernel/drivers/virtio/virtio.ko\n"))
	// The layout recipes/minimal.toml gives.
	r, err := LoadRecipe(MinimalRecipe)
	if err != nil {
		panic(err)
	}
	linked, err := layoutInitramfs(t, r, []byte("\x7fELF guest binary"), []byte("\x7fELF busybox"), []string{"bin/sh", "bin/ls", "sbin/mke2fs", "usr/bin/head", "usr/bin/capsem-doctor", "bin/busybox", "init/sub", "etc/hostname/x", "etc/hostname"})
	// Linked: the four applets where nothing else is, and nothing under a
	// file (init, etc/hostname).
	if err != nil || linked != 4 {
		panic(fmt.Sprintf("linked %d applets, %v", linked, err))
	}
	return t
}

func TestInitramfsContent(t *testing.T) {
	var buf bytes.Buffer
	if err := testInitramfs(false).writeCpio(&buf); err != nil {
		t.Fatal(err)
	}
	names, entries := readCpio(t, buf.Bytes())

	mode := func(name string) cpio.FileMode {
		e, ok := entries[name]
		if !ok {
			t.Fatalf("%s missing from the initramfs (have %v)", name, names)
		}
		return e.hdr.Mode
	}
	if m := mode("init"); m != cpio.TypeReg|0o755 {
		t.Fatalf("/init mode %o", m)
	}
	if string(entries["init"].data) != "\x7fELF guest binary" {
		t.Fatal("/init is not the guest binary")
	}
	if m := mode("bin/busybox"); m != cpio.TypeReg|0o755 {
		t.Fatalf("/bin/busybox mode %o", m)
	}
	for link, target := range map[string]string{
		"usr/bin/capsem-mcp-server": "/init",
		"usr/bin/capsem-doctor":     "/init", // ours wins over a same-named applet
		"usr/bin/capsem":            "/init",
		"bin/sh":                    "/bin/busybox",
		"sbin/mke2fs":               "/bin/busybox",
		"usr/bin/head":              "/bin/busybox",
	} {
		if m := mode(link); m != cpio.TypeSymlink|0o777 {
			t.Fatalf("%s mode %o, want a symlink", link, m)
		}
		if got := entries[link].hdr.Linkname; got != target {
			t.Fatalf("%s -> %s, want %s", link, got, target)
		}
	}
	for _, d := range []string{"dev", "proc", "sys", "run", "etc", "root", "tmp", "lib/modules", "usr/bin"} {
		if m := mode(d); m&cpio.ModeType != cpio.TypeDir {
			t.Fatalf("%s mode %o, want a directory", d, m)
		}
	}
	if m := mode("tmp"); m != cpio.TypeDir|cpio.ModeSticky|0o777 {
		t.Fatalf("/tmp mode %o", m)
	}
	if m := mode("root"); m != cpio.TypeDir|0o700 {
		t.Fatalf("/root mode %o", m)
	}
	if m := mode("dev/console"); m != cpio.TypeChar|0o600 {
		t.Fatalf("/dev/console mode %o", m)
	}
	if maj, min := rdev(t, buf.Bytes(), "dev/console"); maj != 5 || min != 1 {
		t.Fatalf("/dev/console is %d:%d, want 5:1", maj, min)
	}
	if got := string(entries["lib/modules/load-order"].data); got != "/lib/modules/6.1.0-99-amd64/kernel/drivers/virtio/virtio.ko\n" {
		t.Fatalf("load-order %q", got)
	}
	if !bytes.HasPrefix(entries["etc/passwd"].data, []byte("root:x:0:0:")) {
		t.Fatalf("/etc/passwd %q", entries["etc/passwd"].data)
	}
	for _, n := range names {
		h := entries[n].hdr
		if h.ModTime.Unix() != fixedMtime || h.Uid != 0 || h.Guid != 0 {
			t.Fatalf("%s: mtime %v uid %d gid %d, want fixed values", n, h.ModTime, h.Uid, h.Guid)
		}
	}
	// The kernel does not create parents: each directory precedes its
	// contents, which sorted order guarantees.
	if !slices.IsSorted(names) {
		t.Fatalf("entries not sorted: %v", names)
	}
	seen := map[string]bool{}
	for _, n := range names {
		for d := parentDir(n); d != ""; d = parentDir(d) {
			if !seen[d] {
				t.Fatalf("%s precedes its directory %s", n, d)
			}
		}
		seen[n] = true
	}
}

func parentDir(n string) string {
	i := bytes.LastIndexByte([]byte(n), '/')
	if i < 0 {
		return ""
	}
	return n[:i]
}

// rdev reads rdevmajor/rdevminor of name's newc header, which
// cavaliergopher/cpio does not expose.
func rdev(t *testing.T, archive []byte, name string) (uint64, uint64) {
	t.Helper()
	i := bytes.Index(archive, []byte(name+"\x00"))
	if i < 110 {
		t.Fatalf("%s not found", name)
	}
	hdr := archive[i-110 : i]
	field := func(n int) uint64 {
		v, err := strconv.ParseUint(string(hdr[6+8*n:6+8*n+8]), 16, 32)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	return field(9), field(10)
}

func TestInitramfsDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if err := testInitramfs(false).writeCpio(&a); err != nil {
		t.Fatal(err)
	}
	if err := testInitramfs(true).writeCpio(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("the same content gave different archives")
	}
	if a.Len()%4 != 0 {
		t.Fatalf("archive length %d not 4-aligned", a.Len())
	}
}
