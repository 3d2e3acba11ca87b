package vmimage

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/vmm"
)

// sparseDisk writes a 64 MiB file with data at three offsets and holes
// between.
func sparseDisk(t *testing.T, path string) map[int64][]byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	data := map[int64][]byte{
		0:        bytes.Repeat([]byte("head"), 1024),
		20 << 20: bytes.Repeat([]byte{0xA5}, 1<<20),
		63 << 20: []byte("tail of the disk"),
	}
	for off, b := range data {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	return data
}

func checkDisk(t *testing.T, path string, data map[int64][]byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if st, _ := f.Stat(); st.Size() != 64<<20 {
		t.Errorf("%s: size %d, want %d", path, st.Size(), 64<<20)
	}
	for off, want := range data {
		got := make([]byte, len(want))
		if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s at %d: %q..., want %q... (%v)", path, off, got[:min(8, len(got))], want[:8], err)
		}
	}
	// A hole reads as zeros.
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, 40<<20); err != nil || !bytes.Equal(got, make([]byte, 4096)) {
		t.Errorf("%s: the hole at 40 MiB is not zeros (%v)", path, err)
	}
}

// TestCopyDiskKeepsHoles: a raw copy has the source's bytes and takes
// about what the source's data takes, not its size.
func TestCopyDiskKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src.img"), filepath.Join(dir, "dst.img")
	data := sparseDisk(t, src)
	u, err := CopyDisk(context.Background(), vmm.Disk{Path: src}, dst)
	if err != nil {
		t.Fatal(err)
	}
	checkDisk(t, dst, data)
	if u.Size != 64<<20 || u.Allocated > 4<<20 {
		t.Errorf("copy: size %d, allocated %d; want 64 MiB and at most 4 MiB allocated", u.Size, u.Allocated)
	}
	if _, err := CopyDisk(context.Background(), vmm.Disk{Path: src}, dst); err == nil {
		t.Error("a copy onto an existing file succeeded")
	}
	if _, err := CopyDisk(context.Background(), vmm.Disk{Path: src, Format: "vmdk"}, filepath.Join(dir, "x")); err == nil {
		t.Error("an unknown format was copied")
	}
}

// TestLayerAndFlatten: a qcow2 layer over a disk reads as the disk plus
// what was written to the layer, and flattens back into one raw file with
// both, the base untouched.
func TestLayerAndFlatten(t *testing.T) {
	if _, err := QemuImg(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	base, layer, flat := filepath.Join(dir, "base.img"), filepath.Join(dir, "layer.qcow2"), filepath.Join(dir, "flat.img")
	data := sparseDisk(t, base)
	if err := MakeLayer(ctx, base, layer); err != nil {
		t.Fatal(err)
	}
	if u, _ := Usage(layer); u.Allocated > 1<<20 {
		t.Errorf("a fresh layer takes %d bytes", u.Allocated)
	}
	if err := MakeLayer(ctx, "relative.img", filepath.Join(dir, "x.qcow2")); err == nil {
		t.Error("a layer over a relative path was made")
	}
	if _, err := CopyDisk(ctx, vmm.Disk{Path: layer, Format: vmm.DiskQcow2}, flat); err != nil {
		t.Fatal(err)
	}
	checkDisk(t, flat, data)
	if u, _ := Usage(flat); u.Allocated > 4<<20 {
		t.Errorf("the flattened disk takes %d bytes: not sparse", u.Allocated)
	}
}

// TestCopyTree copies files, modes, times, directories and links, and
// skips what is not a file, a directory or a link.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "ws")
	os.MkdirAll(filepath.Join(src, "a/b"), 0o755)
	os.WriteFile(filepath.Join(src, "a/b/f.txt"), []byte("hello"), 0o640)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	when := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	os.Chtimes(filepath.Join(src, "run.sh"), when, when)
	os.Symlink("a/b/f.txt", filepath.Join(src, "link"))
	os.Symlink("/etc/passwd", filepath.Join(src, "outside")) // copied as a link, never followed
	n, err := CopyTree(context.Background(), src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(len("hello")+len("#!/bin/sh\n")) {
		t.Errorf("copied %d bytes", n)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a/b/f.txt")); string(b) != "hello" {
		t.Errorf("f.txt: %q", b)
	}
	if st, _ := os.Stat(filepath.Join(dst, "run.sh")); st.Mode().Perm() != 0o755 || !st.ModTime().Equal(when) {
		t.Errorf("run.sh: mode %v, time %v", st.Mode(), st.ModTime())
	}
	for link, want := range map[string]string{"link": "a/b/f.txt", "outside": "/etc/passwd"} {
		if got, err := os.Readlink(filepath.Join(dst, link)); err != nil || got != want {
			t.Errorf("%s: %q, %v", link, got, err)
		}
	}
}

// TestStore: publish, get, list, a taken name, remove, and a sweep of
// what a crash left.
func TestStore(t *testing.T) {
	s := Store{Dir: filepath.Join(t.TempDir(), "images")}
	publish := func(name string) error {
		staging, err := s.Stage(name)
		if err != nil {
			return err
		}
		os.WriteFile(StagedDisk(staging), []byte("disk"), 0o600)
		os.Mkdir(StagedWorkspace(staging), 0o700)
		err = s.Publish(staging, api.Image{Name: name, Description: "d", Base: api.BaseMinimal, Source: api.ImageSource{ID: "vm-000000000001", State: "stopped"}})
		if err != nil {
			s.Discard(staging)
		}
		return err
	}
	if err := publish("tmpl"); err != nil {
		t.Fatal(err)
	}
	if err := publish("tmpl"); !errors.Is(err, ErrExists) {
		t.Errorf("publishing a taken name: %v, want ErrExists", err)
	}
	img, err := s.Get("tmpl")
	if err != nil || img.Description != "d" || img.Format != api.ImageFormat || img.Problem != "" {
		t.Errorf("get: %+v, %v", img, err)
	}
	for _, bad := range []string{"../x", "A", "", "-x", strings.Repeat("a", 64), "a/b"} {
		if _, err := s.Stage(bad); err == nil {
			t.Errorf("staged %q", bad)
		}
		if _, err := s.Get(bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("get %q: %v", bad, err)
		}
		if err := s.Remove(bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("remove %q: %v", bad, err)
		}
	}
	// A root image that is gone is the image's problem, not an error.
	staging, _ := s.Stage("gone")
	os.WriteFile(StagedDisk(staging), nil, 0o600)
	if err := s.Publish(staging, api.Image{Name: "gone", RootImage: "/nonexistent/root.erofs"}); err != nil {
		t.Fatal(err)
	}
	list, errs := s.List()
	if len(errs) != 0 || len(list) != 2 || list[0].Name != "gone" || !strings.Contains(list[0].Problem, "is gone") {
		t.Errorf("list: %+v, %v", list, errs)
	}
	// What a crash leaves goes at the next sweep.
	leftover, _ := s.Stage("crashed")
	if s.IsStaging(leftover) != true || s.IsStaging(filepath.Join(s.Dir, "tmpl")) || s.IsStaging("/tmp") {
		t.Error("IsStaging")
	}
	s.Sweep()
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("the sweep left %s", leftover)
	}
	if err := s.Remove("tmpl"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("tmpl"); !errors.Is(err, ErrNotFound) {
		t.Errorf("removing twice: %v", err)
	}
	if ents, _ := os.ReadDir(s.Dir); len(ents) != 1 {
		t.Errorf("left in the store: %v", ents)
	}
}
