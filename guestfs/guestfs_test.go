package guestfs

import (
	"context"
	"debug/elf"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func testBuilder(t *testing.T, dir string) *builder {
	t.Helper()
	b, err := newBuilder(Options{Dir: dir, GuestBinary: "/nonexistent", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFakeBuild publishes an asset directory for in with made-up files.
func writeFakeBuild(t *testing.T, b *builder, in Inputs, builtAt time.Time) *Assets {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	m := Manifest{Inputs: in, InputsHash: in.Hash(), Release: "6.1.0-99-amd64", PVH: true, Files: map[string]FileSum{}, BuiltAt: builtAt}
	for name, data := range map[string]string{FileVmlinux: "\x7fELF kernel", FileVmlinuz: "bzImage", FileInitramfs: "070701..."} {
		if err := b.writeAsset(out, name, []byte(data), &m); err != nil {
			t.Fatal(err)
		}
	}
	data, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(out, FileManifest), data, 0o644); err != nil {
		t.Fatal(err)
	}
	final := filepath.Join(b.opts.Dir, in.dirName())
	if err := publishDir(out, final, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	a, err := Load(final)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestVerifyDetectsChanges(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		change     func(dir string) error
	}{
		{"byte flipped", "sha256", func(d string) error {
			return os.WriteFile(filepath.Join(d, FileInitramfs), []byte("070701,.."), 0o644)
		}},
		{"truncated", "size", func(d string) error { return os.Truncate(filepath.Join(d, FileVmlinux), 3) }},
		{"removed", "no such file", func(d string) error { return os.Remove(filepath.Join(d, FileVmlinuz)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := testBuilder(t, t.TempDir())
			a := writeFakeBuild(t, b, Inputs{Builder: "test"}, time.Now())
			if err := a.Verify(); err != nil {
				t.Fatalf("fresh assets fail verification: %v", err)
			}
			if a.Kernel != filepath.Join(a.Dir, FileVmlinux) || a.KernelVersion != "6.1.0-99-amd64" {
				t.Fatalf("assets %+v", a)
			}
			if err := tc.change(a.Dir); err != nil {
				t.Fatal(err)
			}
			err := a.Verify()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify after change: %v, want an error containing %q", err, tc.want)
			}
			// Ensure's cache lookup treats such a build as missing.
			if _, ok := b.cached(a.Inputs); ok {
				t.Fatal("a modified build was served from the cache")
			}
		})
	}
}

func TestVerifyRejectsManifestPaths(t *testing.T) {
	b := testBuilder(t, t.TempDir())
	a := writeFakeBuild(t, b, Inputs{Builder: "test"}, time.Now())
	a.Files["../../etc/passwd"] = FileSum{}
	if err := a.Verify(); err == nil || !strings.Contains(err.Error(), "invalid file") {
		t.Fatalf("Verify: %v", err)
	}
}

func TestInputsHashCoversEveryField(t *testing.T) {
	base := Inputs{Builder: "1", KernelPackage: "k", KernelVersion: "v", KernelDebSHA256: "a",
		BusyboxPackage: "b", BusyboxVersion: "bv", BusyboxDebSHA256: "bs", GuestBinarySHA256: "g", Modules: []string{"m"}}
	seen := map[string]string{base.Hash(): "base"}
	v := reflect.ValueOf(&base).Elem()
	for i := range v.NumField() {
		changed := base
		changed.Modules = []string{"m"}
		f := reflect.ValueOf(&changed).Elem().Field(i)
		if f.Kind() == reflect.String {
			f.SetString(f.String() + "x")
		} else {
			changed.Modules = []string{"m", "x"}
		}
		name := v.Type().Field(i).Name
		if prev, dup := seen[changed.Hash()]; dup {
			t.Fatalf("changing %s gives the same hash as %s", name, prev)
		}
		seen[changed.Hash()] = name
	}
	if base.Hash() != base.Hash() || len(base.dirName()) != 24 {
		t.Fatal("hash not stable")
	}
}

func TestCheckGuestBinary(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"static x86-64", "", fakeKernelELF(t, false, elf.EM_X86_64, false)},
		{"script", "", []byte("#!/bin/sh\necho hi\n")},
		{"dynamic", "dynamically linked", fakeKernelELF(t, false, elf.EM_X86_64, true)},
		{"arm64", "x86-64", fakeKernelELF(t, false, elf.EM_AARCH64, false)},
		{"text", "not an ELF", []byte("hello world")},
		{"empty", "too short", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum, err := checkGuestBinary(write(tc.name, tc.data), nil)
			if tc.want == "" {
				if err != nil || len(sum) != 64 {
					t.Fatalf("sum %q err %v", sum, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseAptRecords(t *testing.T) {
	out := `Package: linux-image-amd64
Source: linux-signed-amd64 (6.1.172+1)
Version: 6.1.172-1
Depends: linux-image-6.1.0-48-amd64 (= 6.1.172-1)
Description: Linux for 64-bit PCs (meta-package)
 This package depends on the latest Linux kernel
 and modules for use on PCs.
Filename: pool/updates/main/l/linux-signed-amd64/linux-image-amd64_6.1.172-1_amd64.deb
Size: 1480
SHA256: 6aeb6981404aa737857506d094a60fc311ea89b471995d1677b26b516d8bdf2e

Package: busybox-static
Version: 1:1.35.0-4+deb12u1+b1
Filename: pool/main/b/busybox/busybox-static_1.35.0-4+deb12u1+b1_amd64.deb
Size: 928188
SHA256: 3D3FDBE91D4660C873E14B092C213FE81C1DA6362DAA236EB25D0171EB108744
`
	recs, err := parseStanzas(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || !strings.Contains(recs[0]["Description"], "\nand modules") {
		t.Fatalf("records %v", recs)
	}
	bb, err := stanzaPkg(recs[1])
	if err != nil {
		t.Fatal(err)
	}
	if bb.Version != "1:1.35.0-4+deb12u1+b1" || bb.Size != 928188 || bb.SHA256[:4] != "3d3f" {
		t.Fatalf("busybox %+v", bb)
	}
	name, ver, err := kernelDependency(recs[0]["Depends"])
	if err != nil || name != "linux-image-6.1.0-48-amd64" || ver != "6.1.172-1" {
		t.Fatalf("kernel dependency %q %q %v", name, ver, err)
	}
	if r := kernelRelease(name); r != "6.1.0-48-amd64" {
		t.Fatalf("release %q", r)
	}
	for depends, want := range map[string]string{
		"linux-image-6.12.9-amd64 | linux-image-6.12.9-amd64-unsigned, initramfs-tools": "linux-image-6.12.9-amd64",
		"foo (>= 1), linux-image-6.1.0-7-amd64:amd64":                                   "linux-image-6.1.0-7-amd64",
	} {
		if n, _, err := kernelDependency(depends); err != nil || n != want {
			t.Fatalf("kernelDependency(%q) = %q, %v", depends, n, err)
		}
	}
	if _, _, err := kernelDependency("libc6, kmod"); err == nil {
		t.Fatal("no kernel in Depends accepted")
	}
	for _, bad := range []map[string]string{
		{"Package": "x", "Version": "1", "SHA256": "short", "Filename": "pool/x.deb", "Size": "1"},
		{"Package": "x", "Version": "1", "SHA256": strings.Repeat("a", 64), "Filename": "pool/x.tar", "Size": "1"},
		{"Package": "x", "Version": "1", "SHA256": strings.Repeat("a", 64), "Filename": "pool/x.deb", "Size": "many"},
	} {
		if _, err := stanzaPkg(bad); err == nil {
			t.Fatalf("stanzaPkg accepted %v", bad)
		}
	}
}

func TestLockDirExcludes(t *testing.T) {
	b := testBuilder(t, t.TempDir())
	unlock, err := lockDir(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := lockDir(ctx, b); err == nil {
		t.Fatal("a second lock was granted while the first is held")
	}
	got := make(chan error, 1)
	go func() {
		u, err := lockDir(context.Background(), b)
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(150 * time.Millisecond)
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting locker never got the lock")
	}
}

func TestCachedFallbackAndPrune(t *testing.T) {
	b := testBuilder(t, t.TempDir())
	b.guest = "guest-1"
	mk := func(kv string, guest string, age time.Duration) *Assets {
		in := Inputs{Builder: BuilderVersion, KernelVersion: kv, GuestBinarySHA256: guest, Modules: DefaultModules}
		return writeFakeBuild(t, b, in, time.Now().Add(-age))
	}
	old := mk("1", "guest-1", 3*time.Hour)
	newest := mk("2", "guest-1", time.Hour)
	mk("3", "guest-2", 0) // newer, but another guest binary
	if a := b.cachedFallback(); a == nil || a.Dir != newest.Dir {
		t.Fatalf("fallback %v, want %s", a, newest.Dir)
	}
	if a, ok := b.cached(old.Inputs); !ok || a.Dir != old.Dir {
		t.Fatal("cached lookup missed an intact build")
	}

	current := mk("4", "guest-1", 2*time.Hour)
	b.pruneBuilds(current.Dir)
	left := map[string]bool{}
	for _, a := range b.listBuilds() {
		left[a.Dir] = true
	}
	if len(left) != keepBuilds || !left[current.Dir] || left[old.Dir] {
		t.Fatalf("after pruning: %v (current %s, oldest %s)", left, current.Dir, old.Dir)
	}
}

func TestKernelStageVerify(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{FileVmlinuz: "bzImage", "lib/modules/6.1.0-99-amd64/kernel/fs/9p/9p.ko": "\x7fELF 9p"}
	ks := &kernelStage{dir: dir, Files: map[string]FileSum{}}
	for rel, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		sum, err := fileSHA256(p)
		if err != nil {
			t.Fatal(err)
		}
		ks.Files[rel] = FileSum{Size: int64(len(data)), SHA256: sum}
	}
	if err := ks.verify(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lib/modules/6.1.0-99-amd64/kernel/fs/9p/9p.ko"), []byte("\x7fELF 9P"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ks.verify(); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("verify after a module changed: %v", err)
	}
	ks.Files = map[string]FileSum{FileVmlinuz: ks.Files[FileVmlinuz], "../escape": {}}
	if err := ks.verify(); err == nil || !strings.Contains(err.Error(), "invalid file") {
		t.Fatalf("verify with an escaping path: %v", err)
	}
}

func TestPublishDirReplaces(t *testing.T) {
	b := testBuilder(t, t.TempDir())
	in := Inputs{Builder: "test"}
	first := writeFakeBuild(t, b, in, time.Now().Add(-time.Minute))
	second := writeFakeBuild(t, b, in, time.Now())
	if first.Dir != second.Dir {
		t.Fatal("same inputs, different directories")
	}
	a, err := Load(second.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if !a.BuiltAt.Equal(second.BuiltAt) {
		t.Fatal("the second publish did not replace the first")
	}
}
