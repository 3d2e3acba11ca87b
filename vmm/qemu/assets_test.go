package qemu

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/testkit"
)

// Boot assets for the real-QEMU tests, built from Debian packages until the
// guestfs package provides its own: the generic kernel and its modules
// (fetched with apt-get download and unpacked, never installed), and
// busybox-static. The .debs are cached under .tools/vmmtest; the initramfs
// is built per test process from the test guest program, busybox, an /init
// script and the virtio modules in dependency order.

type bootAssets struct {
	Kernel    string
	Initramfs string
}

var (
	assetsOnce sync.Once
	assets     bootAssets
	assetsErr  error
	assetsDir  string // per-process build output, removed by TestMain
)

// testAssets returns the kernel and initramfs, building them once. A missing
// dependency fails the test: nothing skips.
func testAssets(t *testing.T) bootAssets {
	t.Helper()
	assetsOnce.Do(func() { assets, assetsErr = buildAssets(testkit.ModuleRoot(t)) })
	if assetsErr != nil {
		t.Fatalf("building boot assets: %v", assetsErr)
	}
	return assets
}

// bootModules are what the test guest needs; their dependencies are added
// from each module's own .modinfo.
var bootModules = []string{"virtio_pci", "virtio_console", "virtio_blk", "9pnet_virtio", "9p", "virtio_net"}

func buildAssets(root string) (bootAssets, error) {
	cache := filepath.Join(root, ".tools", "vmmtest")
	pkgRoot := filepath.Join(cache, "root")
	if err := fetchDebs(cache, pkgRoot); err != nil {
		return bootAssets{}, err
	}
	kernels, _ := filepath.Glob(filepath.Join(pkgRoot, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return bootAssets{}, fmt.Errorf("want one kernel in %s/boot, found %v", pkgRoot, kernels)
	}
	kver := strings.TrimPrefix(filepath.Base(kernels[0]), "vmlinuz-")
	mods, err := moduleClosure(filepath.Join(pkgRoot, "lib", "modules", kver), bootModules)
	if err != nil {
		return bootAssets{}, err
	}

	out, err := os.MkdirTemp("", "capsem-vmmtest-")
	if err != nil {
		return bootAssets{}, err
	}
	assetsDir = out
	guest := filepath.Join(out, "testguest")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", guest, "./vmm/qemu/internal/testguest")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := build.CombinedOutput(); err != nil {
		return bootAssets{}, fmt.Errorf("building the test guest: %v\n%s", err, b)
	}

	var cpio cpioWriter
	for _, d := range []string{"bin", "dev", "proc", "sys", "mnt", "lib", "lib/modules"} {
		cpio.dir(d)
	}
	cpio.node("dev/console", 5, 1) // the kernel's /init stdout before devtmpfs
	if err := cpio.fileFrom("bin/busybox", filepath.Join(pkgRoot, "bin", "busybox"), 0o755); err != nil {
		return bootAssets{}, err
	}
	cpio.symlink("bin/sh", "busybox")
	if err := cpio.fileFrom("testguest", guest, 0o755); err != nil {
		return bootAssets{}, err
	}
	var order []string
	for _, m := range mods {
		name := filepath.Base(m)
		if err := cpio.fileFrom("lib/modules/"+name, m, 0o644); err != nil {
			return bootAssets{}, err
		}
		order = append(order, name)
	}
	cpio.file("modules.order", []byte(strings.Join(order, "\n")+"\n"), 0o644)
	cpio.file("init", []byte(initScript()), 0o755)
	initrd := filepath.Join(out, "initramfs.cpio")
	if err := os.WriteFile(initrd, cpio.finish(), 0o644); err != nil {
		return bootAssets{}, err
	}
	return bootAssets{Kernel: kernels[0], Initramfs: initrd}, nil
}

// initScript loads the modules, mounts the 9p share when there is one,
// gives each NIC the guest's address and pings the gateway from it in the
// background (traffic for the network test: ARP, then ICMP), runs the test
// guest and powers off whatever happens.
func initScript() string {
	return strings.NewReplacer("@GUEST@", guestwire.NetGuestIP+"/"+strconv.Itoa(guestwire.NetPrefixLen),
		"@GATEWAY@", guestwire.NetGatewayIP).Replace(`#!/bin/sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /lib/modules/$m || echo "insmod $m failed"; done
grep -qw share /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag 2>/dev/null &&
  mount -t 9p -o trans=virtio,version=9p2000.L share /mnt
for nic in /sys/class/net/*; do
  nic=${nic##*/}
  [ "$nic" = lo ] && continue
  ip addr add @GUEST@ dev $nic && ip link set $nic up && (ping -c 120 @GATEWAY@ >/dev/null 2>&1 &)
done
echo "capsem-test: init ready"
/testguest
echo "capsem-test: guest exited $?"
poweroff -f
`)
}

// fetchDebs downloads and unpacks the kernel and busybox-static .debs into
// pkgRoot once.
func fetchDebs(cache, pkgRoot string) error {
	if _, err := os.Stat(filepath.Join(pkgRoot, "bin", "busybox")); err == nil {
		if k, _ := filepath.Glob(filepath.Join(pkgRoot, "boot", "vmlinuz-*")); len(k) > 0 {
			return nil
		}
	}
	debs := filepath.Join(cache, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return err
	}
	kpkg, err := kernelPackage()
	if err != nil {
		return err
	}
	dl := exec.Command("apt-get", "download", kpkg, "busybox-static")
	dl.Dir = debs
	if b, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s busybox-static: %v\n%s", kpkg, err, b)
	}
	files, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	tmp := pkgRoot + ".tmp"
	os.RemoveAll(tmp)
	for _, f := range files {
		if b, err := exec.Command("dpkg-deb", "-x", f, tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg-deb -x %s: %v\n%s", f, err, b)
		}
	}
	os.RemoveAll(pkgRoot)
	return os.Rename(tmp, pkgRoot)
}

// kernelPackage resolves linux-image-amd64 to the versioned package it
// depends on today.
func kernelPackage() (string, error) {
	out, err := exec.Command("apt-cache", "depends", "linux-image-amd64").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-amd64 (run apt-get update?): %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Depends: (linux-image-[0-9][^\s]*-amd64)`).FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("no versioned kernel in apt-cache depends linux-image-amd64:\n%s", out)
	}
	return string(m[1]), nil
}

// moduleClosure returns the .ko paths for want and everything they depend
// on, dependencies first. Dependencies come from each module's .modinfo
// "depends=" entry (the .deb carries no modules.dep: depmod makes it at
// install time).
func moduleClosure(modDir string, want []string) ([]string, error) {
	paths := map[string]string{}
	filepath.WalkDir(filepath.Join(modDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".ko") {
			paths[normMod(strings.TrimSuffix(d.Name(), ".ko"))] = p
		}
		return nil
	})
	var (
		order []string
		state = map[string]int{} // 1 visiting, 2 done
		visit func(string) error
	)
	visit = func(name string) error {
		name = normMod(name)
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		case 2:
			return nil
		}
		p, ok := paths[name]
		if !ok {
			return fmt.Errorf("module %s not found under %s (built in?)", name, modDir)
		}
		state[name] = 1
		deps, err := moduleDepends(p)
		if err != nil {
			return err
		}
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, p)
		return nil
	}
	for _, w := range want {
		if err := visit(w); err != nil {
			return nil, err
		}
	}
	return order, nil
}

func normMod(s string) string { return strings.ReplaceAll(s, "-", "_") }

func moduleDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading module %s: %w", path, err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s has no .modinfo", path)
	}
	b, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// cpioWriter writes a newc ("070701") archive, the format the kernel
// unpacks as an initramfs.
type cpioWriter struct {
	buf bytes.Buffer
	ino uint32
}

func (w *cpioWriter) entry(name string, mode, rmaj, rmin uint32, data []byte) {
	w.ino++
	fmt.Fprintf(&w.buf, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		w.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	w.buf.WriteString(name)
	w.buf.WriteByte(0)
	w.pad()
	w.buf.Write(data)
	w.pad()
}

func (w *cpioWriter) pad() {
	for w.buf.Len()%4 != 0 {
		w.buf.WriteByte(0)
	}
}

func (w *cpioWriter) dir(name string)                         { w.entry(name, 0o040755, 0, 0, nil) }
func (w *cpioWriter) file(name string, b []byte, perm uint32) { w.entry(name, 0o100000|perm, 0, 0, b) }
func (w *cpioWriter) symlink(name, target string)             { w.entry(name, 0o120777, 0, 0, []byte(target)) }
func (w *cpioWriter) node(name string, maj, min uint32)       { w.entry(name, 0o020600, maj, min, nil) }

func (w *cpioWriter) fileFrom(name, src string, perm uint32) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	w.file(name, b, perm)
	return nil
}

func (w *cpioWriter) finish() []byte {
	w.entry("TRAILER!!!", 0, 0, 0, nil)
	// Pad to 512 like cpio(1) does; the kernel does not care.
	w.buf.Write(make([]byte, (512-w.buf.Len()%512)%512))
	return w.buf.Bytes()
}
