package guestfs

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeBoot stands in for apt-cache, apt-get download and dpkg-deb: apt's
// answers are fields; unpacking the kernel's .deb writes a small kernel
// package (a bzImage that is none, so no vmlinux, and writeModTree's
// modules), unpacking busybox's writes a script that lists applets.
type fakeBoot struct {
	t  testing.TB
	mu sync.Mutex
	// kernel and busybox are apt's answers.
	kernel, busybox pkgInfo
	// resolveErr and fetchErr make apt fail.
	resolveErr, fetchErr error
	// busyboxBin is what the busybox package holds at /bin/busybox.
	busyboxBin string
	// unpacked counts unpacks by package name.
	unpacked map[string]int
	// kernelGate, when set, is waited on inside the kernel's unpack.
	kernelGate chan struct{}
}

const fakeRelease = "6.1.0-99-amd64"

func newFakeBoot(t testing.TB) *fakeBoot {
	return &fakeBoot{
		t:          t,
		kernel:     pkgInfo{Name: "linux-image-" + fakeRelease, Version: "6.1.1-1", SHA256: strings.Repeat("a", 64), Filename: "pool/main/l/linux-image-99.deb"},
		busybox:    pkgInfo{Name: "busybox-static", Version: "1:1.35.0-4", SHA256: strings.Repeat("b", 64), Filename: "pool/main/b/busybox-static.deb"},
		busyboxBin: "#!/bin/sh\n[ \"$1\" = --list-full ] && printf 'bin/sh\\nbin/ls\\nsbin/mke2fs\\nusr/bin/env\\nlinuxrc\\ninit\\n'\n",
		unpacked:   map[string]int{},
	}
}

func (h *fakeBoot) resolve(_ context.Context, _ *bootBuilder, _ bool, queries []aptQuery) (map[string]pkgInfo, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.resolveErr != nil {
		return nil, h.resolveErr
	}
	res := map[string]pkgInfo{}
	for _, q := range queries {
		if q.Meta {
			res[q.memoKey()] = h.kernel
		} else {
			res[q.memoKey()] = h.busybox
		}
	}
	return res, nil
}

func (h *fakeBoot) fetchDeb(_ context.Context, _ *bootBuilder, p pkgInfo) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fetchErr != nil {
		return "", h.fetchErr
	}
	return "/fake/" + p.Name + "_" + p.Version + ".deb", nil
}

func (h *fakeBoot) unpackDeb(_ context.Context, _ *bootBuilder, deb, dir string) error {
	h.mu.Lock()
	name := strings.TrimPrefix(strings.Split(deb, "_")[0], "/fake/")
	h.unpacked[name]++
	gate, bb := h.kernelGate, h.busyboxBin
	h.mu.Unlock()
	switch {
	case strings.HasPrefix(name, "linux-image-"):
		if gate != nil {
			<-gate
		}
		writeFiles(h.t, dir, map[string]string{"boot/vmlinuz-" + fakeRelease: "not a bzImage"})
		writeModTreeAt(h.t, filepath.Join(dir, "lib", "modules", fakeRelease), false)
	case name == "busybox-static":
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "bin", "busybox"), []byte(bb), 0o755)
	default:
		return fmt.Errorf("no such package %s", deb)
	}
	return nil
}

func (h *fakeBoot) aptUpdate(context.Context, *bootBuilder) error { return nil }

func (h *fakeBoot) unpacks(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.unpacked[name]
}

func (h *fakeBoot) set(f func(h *fakeBoot)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}

// writeGuest writes a guest binary (a script) whose content is body.
func writeGuest(t testing.TB, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "guest-"+fmt.Sprint(len(body)))
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func bootOpts(dir, guest string, h *fakeBoot) Options {
	return Options{Dir: dir, GuestBinary: guest, host: h, Logger: slog.New(slog.DiscardHandler)}
}

func mustEnsure(t testing.TB, opts Options) *Assets {
	t.Helper()
	a, err := Ensure(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestEnsureBuildsTheKernelOnce: the first Ensure builds the kernel and
// the minimal root from their recipes and names them by refs; an unchanged
// second one builds nothing and says nothing; a new guest binary rebuilds
// the initramfs alone, from the kernel in the store.
func TestEnsureBuildsTheKernelOnce(t *testing.T) {
	dir, tmp := t.TempDir(), t.TempDir()
	h := newFakeBoot(t)
	var progress bytes.Buffer
	opts := bootOpts(dir, writeGuest(t, tmp, "echo one"), h)
	opts.Progress = &progress
	a := mustEnsure(t, opts)
	if h.unpacks(h.kernel.Name) != 1 || h.unpacks("busybox-static") != 1 {
		t.Fatalf("unpacks %v", h.unpacked)
	}
	if err := a.Verify(); err != nil {
		t.Fatal(err)
	}
	km, im := a.KernelManifest, a.InitramfsManifest
	if a.KernelDir != storePath(dir, km.Key) || a.Dir != storePath(dir, im.Key) || im.Inputs.KernelKey != km.Key || !slices.Equal(im.Depends, []string{km.Key}) {
		t.Fatalf("kernel %s, minimal %s (depends %v)", a.KernelDir, a.Dir, im.Depends)
	}
	if readRefFile(t, dir, KernelRecipe) != km.Key || readRefFile(t, dir, MinimalRecipe) != im.Key {
		t.Fatal("the refs do not name the artefacts")
	}
	// Not a real bzImage, so no vmlinux: the guest boots vmlinuz.
	if a.Kernel != filepath.Join(a.KernelDir, FileVmlinuz) || a.PVH || a.KernelVersion != fakeRelease {
		t.Fatalf("kernel %s (PVH %v, %s)", a.Kernel, a.PVH, a.KernelVersion)
	}
	if a.Initramfs != filepath.Join(a.Dir, FileInitramfs) || a.BootStateDir != filepath.Join(dir, "boot-states", im.Key[:24]) {
		t.Fatalf("initramfs %s, boot states %s", a.Initramfs, a.BootStateDir)
	}
	if !slices.Contains(km.BuiltIn, "virtio_pci") || !slices.Contains(km.Absent, "erofs") || len(a.Modules) == 0 {
		t.Fatalf("modules %v, built in %v, absent %v", a.Modules, km.BuiltIn, km.Absent)
	}
	if _, ok := km.Files["lib/modules/"+fakeRelease+"/kernel/fs/ext4/ext4.ko"]; !ok {
		t.Fatalf("the kernel artefact holds no plain ext4.ko: %v", km.Files)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".work-*")); len(ents) != 0 {
		t.Fatalf("work directories left: %v", ents)
	}

	progress.Reset()
	again := mustEnsure(t, opts)
	if h.unpacks(h.kernel.Name) != 1 || h.unpacks("busybox-static") != 1 || progress.Len() != 0 ||
		again.Dir != a.Dir || !again.InitramfsManifest.BuiltAt.Equal(im.BuiltAt) {
		t.Fatalf("an unchanged Ensure built (unpacks %v) or said %q", h.unpacked, progress.String())
	}

	opts.GuestBinary = writeGuest(t, tmp, "echo two, longer")
	second := mustEnsure(t, opts)
	if h.unpacks(h.kernel.Name) != 1 || h.unpacks("busybox-static") != 2 {
		t.Fatalf("a new guest binary unpacked %v", h.unpacked)
	}
	if second.KernelManifest.Key != km.Key || second.InitramfsManifest.Key == im.Key || second.KernelDir != a.KernelDir {
		t.Fatal("a new guest binary made a new kernel, or no new minimal root")
	}
	if readRefFile(t, dir, MinimalRecipe+".previous") != im.Key {
		t.Fatal("refs/minimal.previous does not name the first minimal root")
	}
	if _, err := os.Stat(a.Initramfs); err != nil {
		t.Fatalf("the previous minimal root is gone: %v", err)
	}
	// A third guest binary: the first minimal root is named by nothing now,
	// and goes with its saved boots; the kernel, named by both, stays.
	writeFiles(t, a.BootStateDir, map[string]string{"k.json": "{}"})
	opts.GuestBinary = writeGuest(t, tmp, "echo three, longer still")
	third := mustEnsure(t, opts)
	want := []string{km.Key[:24], second.InitramfsManifest.Key[:24], third.InitramfsManifest.Key[:24]}
	slices.Sort(want)
	if got := storeEntries(dir); !slices.Equal(got, want) {
		t.Fatalf("store %v, want %v", got, want)
	}
	if _, err := os.Stat(a.BootStateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the saved boots of a pruned minimal root survived: %v", err)
	}
}

// TestEnsureInitramfsFollowsTheRecipe: the initramfs holds what
// recipes/minimal.toml says, the kernel artefact's modules and busybox's
// applets where nothing else is.
func TestEnsureInitramfsFollowsTheRecipe(t *testing.T) {
	h := newFakeBoot(t)
	guestBody := "echo guest"
	a := mustEnsure(t, bootOpts(t.TempDir(), writeGuest(t, t.TempDir(), guestBody), h))
	data, err := os.ReadFile(a.Initramfs)
	if err != nil {
		t.Fatal(err)
	}
	_, entries := readCpio(t, data)
	if e := entries["init"]; string(e.data) != "#!/bin/sh\n"+guestBody+"\n" || e.hdr.Mode.Perm() != 0o755 {
		t.Fatalf("/init: %q %v", e.data, e.hdr)
	}
	for _, l := range []string{"usr/bin/capsem", "usr/bin/capsem-mcp-server", "usr/bin/capsem-doctor"} {
		if e := entries[l]; e.hdr == nil || e.hdr.Linkname != GuestInit {
			t.Errorf("%s is not a link to /init", l)
		}
	}
	for _, l := range []string{"bin/sh", "bin/ls", "sbin/mke2fs", "usr/bin/env"} {
		if e := entries[l]; e.hdr == nil || e.hdr.Linkname != "/bin/busybox" {
			t.Errorf("applet %s is not a link to busybox", l)
		}
	}
	if _, ok := entries["linuxrc"]; ok || a.InitramfsManifest.Applets != 4 {
		t.Errorf("applets: linuxrc %v, %d linked", ok, a.InitramfsManifest.Applets)
	}
	if e := entries["dev/console"]; e.hdr == nil || e.hdr.Mode&0o170000 != 0o020000 || e.hdr.Mode.Perm() != 0o600 {
		t.Errorf("/dev/console: %+v", e.hdr)
	}
	if e := entries["tmp"]; e.hdr == nil || e.hdr.Mode&0o7777 != 0o1777 {
		t.Errorf("/tmp: %+v", e.hdr)
	}
	if e := entries["root"]; e.hdr == nil || e.hdr.Mode.Perm() != 0o700 {
		t.Errorf("/root: %+v", e.hdr)
	}
	if string(entries["etc/hostname"].data) != "capsem\n" || !strings.HasPrefix(string(entries["etc/passwd"].data), "root:x:0:0:") {
		t.Errorf("/etc: %q %q", entries["etc/hostname"].data, entries["etc/passwd"].data)
	}
	order := string(entries["lib/modules/load-order"].data)
	for _, m := range a.Modules {
		if !strings.Contains(order, m) {
			t.Errorf("load-order lacks %s:\n%s", m, order)
		}
		got := entries[strings.TrimPrefix(m, "/")].data
		want, err := os.ReadFile(filepath.Join(a.KernelDir, filepath.FromSlash(strings.TrimPrefix(m, "/"))))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("module %s is not the kernel artefact's (%v)", m, err)
		}
	}

	// A busybox that cannot run here gets the recipe's fallback applets.
	h.set(func(h *fakeBoot) { h.busyboxBin, h.busybox.Version = "\x7fELF not runnable", "2" })
	b := mustEnsure(t, bootOpts(filepath.Dir(filepath.Dir(a.Dir)), writeGuest(t, t.TempDir(), guestBody), h))
	recipe, _ := LoadRecipe(MinimalRecipe)
	if b.InitramfsManifest.Applets != len(recipe.Initramfs.FallbackApplets) {
		t.Fatalf("%d applets linked, the recipe's fallback has %d", b.InitramfsManifest.Applets, len(recipe.Initramfs.FallbackApplets))
	}
}

// TestEnsureRebuildsWhatFailsVerification: a changed initramfs rebuilds
// the minimal root alone; a changed module rebuilds the kernel.
func TestEnsureRebuildsWhatFailsVerification(t *testing.T) {
	dir := t.TempDir()
	h := newFakeBoot(t)
	opts := bootOpts(dir, writeGuest(t, t.TempDir(), "echo g"), h)
	a := mustEnsure(t, opts)
	if err := os.WriteFile(a.Initramfs, []byte("070701 not the archive"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(); err == nil || !strings.Contains(err.Error(), FileInitramfs) {
		t.Fatalf("Verify of a changed initramfs: %v", err)
	}
	b := mustEnsure(t, opts)
	if h.unpacks(h.kernel.Name) != 1 || h.unpacks("busybox-static") != 2 || b.Dir != a.Dir {
		t.Fatalf("unpacks %v", h.unpacked)
	}
	if err := b.Verify(); err != nil {
		t.Fatal(err)
	}
	mod := filepath.Join(a.KernelDir, filepath.FromSlash(strings.TrimPrefix(a.Modules[0], "/")))
	if err := os.WriteFile(mod, []byte("\x7fELF changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(); err == nil || !strings.Contains(err.Error(), "kernel") {
		t.Fatalf("Verify of a changed module: %v", err)
	}
	c := mustEnsure(t, opts)
	if h.unpacks(h.kernel.Name) != 2 || c.KernelDir != a.KernelDir {
		t.Fatalf("a changed module: unpacks %v", h.unpacked)
	}
	if err := c.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyBootFiles: a boot re-hashes what QEMU reads, whatever the sum
// cache says, and a failure makes the cache forget both artefacts.
func TestVerifyBootFiles(t *testing.T) {
	dir := t.TempDir()
	a := mustEnsure(t, bootOpts(dir, writeGuest(t, t.TempDir(), "echo g"), newFakeBoot(t)))
	if err := a.VerifyBootFiles(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(a.Initramfs)
	data[len(data)/2] ^= 0xff
	os.WriteFile(a.Initramfs, data, 0o644)
	sums := loadSumCache(dir)
	sums.record(a.Initramfs, a.Files[FileInitramfs].SHA256) // the cache vouches for the bad bytes
	sums.save()
	if err := a.VerifyBootFiles(); err == nil || !strings.Contains(err.Error(), FileInitramfs) {
		t.Fatalf("VerifyBootFiles: %v", err)
	}
	after := loadSumCache(dir)
	for _, p := range []string{a.Initramfs, a.KernelCompressed} {
		if _, ok := after.entries[p]; ok {
			t.Errorf("the sum cache still vouches for %s", p)
		}
	}
}

func TestVerifyRejectsManifestPaths(t *testing.T) {
	a := mustEnsure(t, bootOpts(t.TempDir(), writeGuest(t, t.TempDir(), "echo g"), newFakeBoot(t)))
	for _, bad := range []string{"../../etc/passwd", "/etc/passwd", "lib/../../x", ".sums.json", "manifest.json", ""} {
		a.KernelManifest.Files[bad] = FileSum{}
		if err := a.Verify(); err == nil || !strings.Contains(err.Error(), "invalid file") {
			t.Errorf("Verify with %q: %v", bad, err)
		}
		delete(a.KernelManifest.Files, bad)
	}
}

// TestEnsureFallsBackOffline: when apt cannot be asked or the packages
// fetched, Ensure boots the newest cached assets for this guest binary;
// Build does not, and neither does a guest binary never built.
func TestEnsureFallsBackOffline(t *testing.T) {
	dir, tmp := t.TempDir(), t.TempDir()
	h := newFakeBoot(t)
	guest := writeGuest(t, tmp, "echo g")
	good := mustEnsure(t, bootOpts(dir, guest, h))
	h.set(func(h *fakeBoot) {
		h.kernel.Version, h.kernel.SHA256, h.fetchErr = "6.1.2-1", strings.Repeat("c", 64), errors.New("network unreachable")
	})
	var progress bytes.Buffer
	opts := bootOpts(dir, guest, h)
	opts.Progress = &progress
	a, err := Ensure(context.Background(), opts)
	if err != nil || a.Dir != good.Dir {
		t.Fatalf("offline Ensure: %v, %v", a, err)
	}
	if !strings.Contains(progress.String(), "network unreachable; using the cached assets") {
		t.Fatalf("progress %q", progress.String())
	}
	h.set(func(h *fakeBoot) { h.fetchErr, h.resolveErr = nil, errors.New("apt-cache: no lists") })
	if a, err := Ensure(context.Background(), bootOpts(dir, guest, h)); err != nil || a.Dir != good.Dir {
		t.Fatalf("Ensure without apt: %v", err)
	}
	if _, err := Build(context.Background(), bootOpts(dir, guest, h)); err == nil || !strings.Contains(err.Error(), "no lists") {
		t.Fatalf("Build without apt: %v", err)
	}
	if _, err := Ensure(context.Background(), bootOpts(dir, writeGuest(t, tmp, "echo another"), h)); err == nil {
		t.Fatal("a guest binary never built fell back to another's assets")
	}
}

// TestBuildForces: Build rebuilds both artefacts under the same keys.
func TestBuildForces(t *testing.T) {
	dir := t.TempDir()
	h := newFakeBoot(t)
	opts := bootOpts(dir, writeGuest(t, t.TempDir(), "echo g"), h)
	first := mustEnsure(t, opts)
	forced, err := Build(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if h.unpacks(h.kernel.Name) != 2 || h.unpacks("busybox-static") != 2 {
		t.Fatalf("unpacks %v", h.unpacked)
	}
	if forced.Dir != first.Dir || forced.KernelDir != first.KernelDir || !forced.InitramfsManifest.BuiltAt.After(first.InitramfsManifest.BuiltAt) {
		t.Fatal("Build did not replace the entries of the same keys")
	}
	if got := storeEntries(dir); len(got) != 2 {
		t.Fatalf("store %v", got)
	}
	if err := forced.Verify(); err != nil {
		t.Fatal(err)
	}
}

// TestEnsureConcurrent: two Ensures at once build each artefact once.
func TestEnsureConcurrent(t *testing.T) {
	dir := t.TempDir()
	h := newFakeBoot(t)
	h.kernelGate = make(chan struct{})
	guest := writeGuest(t, t.TempDir(), "echo g")
	var wg sync.WaitGroup
	results := make([]*Assets, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { results[i], errs[i] = Ensure(context.Background(), bootOpts(dir, guest, h)) })
	}
	time.Sleep(300 * time.Millisecond)
	close(h.kernelGate)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if h.unpacks(h.kernel.Name) != 1 || h.unpacks("busybox-static") != 1 || results[0].Dir != results[1].Dir {
		t.Fatalf("unpacks %v", h.unpacked)
	}
}

// TestInstalledAndLoad: Installed gives refs/minimal's assets when they
// are for the guest binary, else the newest that are; Load gives the ref's.
func TestInstalledAndLoad(t *testing.T) {
	dir, tmp := t.TempDir(), t.TempDir()
	h := newFakeBoot(t)
	one, two := writeGuest(t, tmp, "echo one"), writeGuest(t, tmp, "echo two, longer")
	if _, err := Installed(bootOpts(dir, one, h)); !errors.Is(err, ErrNoAssets) {
		t.Fatalf("Installed before any build: %v", err)
	}
	if _, err := Load(dir); !errors.Is(err, ErrNoAssets) {
		t.Fatalf("Load before any build: %v", err)
	}
	a1 := mustEnsure(t, bootOpts(dir, one, h))
	a2 := mustEnsure(t, bootOpts(dir, two, h))
	for guest, want := range map[string]string{one: a1.Dir, two: a2.Dir} {
		got, err := Installed(bootOpts(dir, guest, h))
		if err != nil || got.Dir != want {
			t.Fatalf("Installed for %s: %v, %v; want %s", filepath.Base(guest), got, err, want)
		}
	}
	if _, err := Installed(bootOpts(dir, writeGuest(t, tmp, "echo never built"), h)); !errors.Is(err, ErrNoAssets) {
		t.Fatalf("Installed for a guest never built: %v", err)
	}
	if h.unpacks("busybox-static") != 2 {
		t.Fatal("Installed built something")
	}
	loaded, err := Load(dir)
	if err != nil || loaded.Dir != a2.Dir || loaded.Kernel != a2.Kernel {
		t.Fatalf("Load: %+v, %v", loaded, err)
	}
}

func TestEnsureChecksRecipes(t *testing.T) {
	kernel, _ := LoadRecipe(KernelRecipe)
	full, _ := LoadRecipe(DefaultRecipe)
	other := testKernelRecipe(t, "other-kernel")
	guest := writeGuest(t, t.TempDir(), "echo g")
	for name, tc := range map[string]struct {
		minimal, kernel *Recipe
		want            string
	}{
		"a kernel as the minimal root": {kernel, nil, `recipe "kernel" is of kind "kernel", not "initramfs"`},
		"a root as the kernel":         {nil, full, `recipe "full" is of kind "root", not "kernel"`},
		"another kernel":               {nil, other, `initramfs.kernel names "kernel" (amd64), not the kernel recipe "other-kernel"`},
	} {
		opts := bootOpts(t.TempDir(), guest, newFakeBoot(t))
		opts.Minimal, opts.Kernel = tc.minimal, tc.kernel
		if _, err := Ensure(context.Background(), opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := EnsureRoot(context.Background(), RootOptions{Dir: t.TempDir(), Recipe: kernel, host: newFakeHost()}); err == nil || !strings.Contains(err.Error(), `not "root"`) {
		t.Fatalf("EnsureRoot of a kernel recipe: %v", err)
	}
}

func testKernelRecipe(t testing.TB, name string) *Recipe {
	t.Helper()
	r, err := ParseRecipe(name+".toml", []byte(fmt.Sprintf("name = %q\nkind = \"kernel\"\narch = \"amd64\"\n[kernel]\npackage = \"linux-image-amd64\"\nmodules = [\"ext4\"]\n", name)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestInputsKeyCoversEveryField: every field of the inputs changes the key.
func TestInputsKeyCoversEveryField(t *testing.T) {
	for _, base := range []interface{ Key() string }{
		KernelInputs{Builder: "1", Recipe: "k", RecipeSHA256: "r", Package: "p", Version: "v", DebSHA256: "d"},
		InitramfsInputs{Builder: "1", Recipe: "m", RecipeSHA256: "r", KernelKey: "k", BusyboxPackage: "b", BusyboxVersion: "bv", BusyboxDebSHA256: "bs", GuestBinarySHA256: "g"},
		RootInputs{Builder: "1", Recipe: "full", RecipeSHA256: "aa", Closure: []string{"a=1"}, Sources: "s", Mmdebstrap: "m 1", MkfsErofs: "k 1"},
	} {
		v := reflect.ValueOf(base)
		seen := map[string]string{base.Key(): "base"}
		for i := range v.NumField() {
			changed := reflect.New(v.Type()).Elem()
			changed.Set(v)
			f := changed.Field(i)
			switch f.Kind() {
			case reflect.String:
				f.SetString(f.String() + "x")
			case reflect.Slice:
				f.Set(reflect.Append(reflect.MakeSlice(f.Type(), 0, 2), reflect.ValueOf("b=2")))
			default:
				t.Fatalf("%s.%s: a field of kind %s", v.Type(), v.Type().Field(i).Name, f.Kind())
			}
			key := changed.Interface().(interface{ Key() string }).Key()
			name := v.Type().Field(i).Name
			if prev, dup := seen[key]; dup {
				t.Errorf("%s: changing %s gives the key of %s", v.Type(), name, prev)
			}
			seen[key] = name
		}
		if !keyRE.MatchString(base.Key()) {
			t.Fatalf("%s: key %q", v.Type(), base.Key())
		}
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
		{"arm64", "the guest is amd64", fakeKernelELF(t, false, elf.EM_AARCH64, false)},
		{"text", "not an ELF", []byte("hello world")},
		{"empty", "too short", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum, err := checkGuestBinary(write(tc.name, tc.data), "amd64", nil)
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
