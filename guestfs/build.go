package guestfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// build makes the assets for in under the lock: fetch (or reuse) the
// .debs, unpack, extract vmlinux, pick modules, write the initramfs, and
// rename the finished directory into place.
func (b *builder) build(ctx context.Context, in Inputs, res resolution) (*Assets, error) {
	start := time.Now()
	kdeb, bdeb, err := b.fetchAll(ctx, res)
	if err != nil && !b.updated {
		// The lists may name files the mirror no longer has: refresh once
		// and start over with whatever versions apt now picks.
		b.log.Info("download failed; running apt-get update once", "err", err)
		if uerr := b.aptUpdate(ctx); uerr != nil {
			return nil, fmt.Errorf("guestfs: %w (and apt-get update failed: %v)", err, uerr)
		}
		if res, err = b.resolve(ctx, true); err != nil {
			return nil, fmt.Errorf("guestfs: %w", err)
		}
		in = b.inputsFor(res)
		if a, ok := b.cached(in); ok {
			return a, nil
		}
		kdeb, bdeb, err = b.fetchAll(ctx, res)
	}
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}

	work, err := os.MkdirTemp(b.opts.Dir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("guestfs: creating a build directory: %w", err)
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	m := Manifest{Inputs: in, InputsHash: in.Hash(), Files: map[string]FileSum{}}

	// Kernel.
	b.progress("unpacking %s %s…", res.Kernel.Name, res.Kernel.Version)
	kroot := filepath.Join(work, "kernel")
	if err := b.unpackDeb(ctx, kdeb, kroot); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	release, vmlinuz, err := findKernel(kroot)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %s: %w", res.Kernel.Name, err)
	}
	m.Release = release
	bz, err := os.ReadFile(vmlinuz)
	if err != nil {
		return nil, fmt.Errorf("guestfs: reading the kernel: %w", err)
	}
	if err := b.writeAsset(out, FileVmlinuz, bz, &m); err != nil {
		return nil, err
	}
	b.progress("extracting the uncompressed kernel from %s…", filepath.Base(vmlinuz))
	if elfKernel, err := ExtractVmlinux(bz); err != nil {
		// The bzImage still boots, only more slowly under TCG.
		b.log.Warn("no uncompressed kernel; the guest boots the bzImage", "err", err)
		b.progress("warning: %v; using vmlinuz", err)
	} else {
		pvh, err := HasPVHNote(bytes.NewReader(elfKernel))
		if err != nil {
			return nil, fmt.Errorf("guestfs: %w", err)
		}
		m.PVH = pvh
		if err := b.writeAsset(out, FileVmlinux, elfKernel, &m); err != nil {
			return nil, err
		}
		b.progress("vmlinux: %s, PVH entry: %v", humanBytes(int64(len(elfKernel))), pvh)
	}

	tree := newFSTree()

	// Modules.
	modRoot, err := findModuleRoot(kroot, release)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %s: %w", res.Kernel.Name, err)
	}
	mt, err := openModTree(modRoot, b.log)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	order, builtin, absent, err := mt.selectModules(b.opts.Modules)
	m.BuiltIn, m.Absent = builtin, absent
	if err != nil {
		return nil, fmt.Errorf("guestfs: ordering kernel modules: %w", err)
	}
	var loadOrderText strings.Builder
	for _, name := range order {
		data, err := mt.readModule(name)
		if err != nil {
			return nil, fmt.Errorf("guestfs: %w", err)
		}
		guestPath := path.Join("/lib/modules", release, plainModulePath(mt.paths[name]))
		tree.file(guestPath, 0o644, data)
		m.Modules = append(m.Modules, guestPath)
		loadOrderText.WriteString(guestPath + "\n")
	}
	tree.file(LoadOrderPath, 0o644, []byte(loadOrderText.String()))
	b.progress("modules: %d in load order (%s)", len(order), strings.Join(order, ", "))
	if len(absent) > 0 {
		b.progress("warning: not in this kernel: %s", strings.Join(absent, ", "))
	}

	// Busybox.
	b.progress("unpacking %s %s…", res.Busybox.Name, res.Busybox.Version)
	broot := filepath.Join(work, "busybox")
	if err := b.unpackDeb(ctx, bdeb, broot); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	bbPath := filepath.Join(broot, "bin", "busybox")
	bb, err := os.ReadFile(bbPath)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %s has no /bin/busybox: %w", res.Busybox.Name, err)
	}
	applets := b.busyboxApplets(ctx, bbPath)
	m.Applets = len(applets)

	// Guest binary: re-hash what is read, so a binary replaced since
	// Ensure hashed it cannot end up under the old hash.
	guest, err := os.ReadFile(b.opts.GuestBinary)
	if err != nil {
		return nil, fmt.Errorf("guestfs: reading the guest binary: %w", err)
	}
	if sum := sha256.Sum256(guest); hex.EncodeToString(sum[:]) != in.GuestBinarySHA256 {
		return nil, fmt.Errorf("guestfs: guest binary %s changed during the build; run it again", b.opts.GuestBinary)
	}

	layoutInitramfs(tree, guest, bb, applets)
	var cpio bytes.Buffer
	if err := tree.writeCpio(&cpio); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	if err := b.writeAsset(out, FileInitramfs, cpio.Bytes(), &m); err != nil {
		return nil, err
	}
	b.progress("initramfs: %s (uncompressed newc, %d entries)", humanBytes(int64(cpio.Len())), len(tree.entries))

	// Manifest and publish.
	m.BuiltAt = time.Now().UTC()
	m.BuildSeconds = time.Since(start).Seconds()
	mdata, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("guestfs: encoding the manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, FileManifest), append(mdata, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("guestfs: writing the manifest: %w", err)
	}
	final := filepath.Join(b.opts.Dir, in.dirName())
	if err := publishDir(out, final, work); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.pruneDebs(kdeb, bdeb)
	b.pruneBuilds(final)
	a, err := Load(final)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.progress("assets ready in %s (%.1f s)", final, time.Since(start).Seconds())
	return a, nil
}

func (b *builder) fetchAll(ctx context.Context, res resolution) (kdeb, bdeb string, err error) {
	if kdeb, err = b.fetchDeb(ctx, res.Kernel); err != nil {
		return "", "", err
	}
	if bdeb, err = b.fetchDeb(ctx, res.Busybox); err != nil {
		return "", "", err
	}
	return kdeb, bdeb, nil
}

// writeAsset writes one output file and records its hash in the manifest.
func (b *builder) writeAsset(dir, name string, data []byte, m *Manifest) error {
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		return fmt.Errorf("guestfs: writing %s: %w", name, err)
	}
	sum := sha256.Sum256(data)
	m.Files[name] = FileSum{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
	return nil
}

// publishDir renames the finished build into place. A build already there
// (Build --force) is moved aside into work first, then removed with it.
func publishDir(out, final, work string) error {
	err := os.Rename(out, final)
	if err == nil {
		return nil
	}
	if !errors.Is(err, os.ErrExist) && !isNotEmpty(err) {
		return fmt.Errorf("publishing the assets: %w", err)
	}
	if err := os.Rename(final, filepath.Join(work, "previous")); err != nil {
		return fmt.Errorf("replacing the previous assets: %w", err)
	}
	if err := os.Rename(out, final); err != nil {
		return fmt.Errorf("publishing the assets: %w", err)
	}
	return nil
}

func isNotEmpty(err error) bool {
	var le *os.LinkError
	return errors.As(err, &le) && strings.Contains(le.Err.Error(), "not empty")
}

// pruneBuilds keeps the newest keepBuilds asset directories (always keeping
// current) and removes the rest, plus leftovers of interrupted builds.
func (b *builder) pruneBuilds(current string) {
	builds := b.listBuilds()
	sort.Slice(builds, func(i, j int) bool { return builds[i].BuiltAt.After(builds[j].BuiltAt) })
	kept := 0
	for _, a := range builds {
		if a.Dir == current || kept < keepBuilds-1 {
			if a.Dir != current {
				kept++
			}
			continue
		}
		if err := os.RemoveAll(a.Dir); err == nil {
			b.log.Info("removed old assets", "dir", a.Dir)
		}
	}
	// Directories of builds killed midway: we hold the lock, so none is live.
	ents, _ := os.ReadDir(b.opts.Dir)
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), ".build-") {
			p := filepath.Join(b.opts.Dir, e.Name())
			if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > time.Hour {
				_ = os.RemoveAll(p)
			}
		}
	}
}

// findKernel returns the release and bzImage path in an unpacked
// linux-image package.
func findKernel(root string) (release, vmlinuz string, err error) {
	matches, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(matches) != 1 {
		return "", "", fmt.Errorf("expected one /boot/vmlinuz-*, found %d", len(matches))
	}
	return strings.TrimPrefix(filepath.Base(matches[0]), "vmlinuz-"), matches[0], nil
}

// findModuleRoot returns lib/modules/<release> (usr/lib/modules on
// merged-/usr packages).
func findModuleRoot(root, release string) (string, error) {
	for _, p := range []string{"lib/modules", "usr/lib/modules"} {
		d := filepath.Join(root, p, release)
		if st, err := os.Stat(filepath.Join(d, "kernel")); err == nil && st.IsDir() {
			return d, nil
		}
	}
	return "", fmt.Errorf("no modules directory for %s", release)
}

// layoutInitramfs adds everything but the modules: /init (the capsem
// binary; its personality follows argv[0]), busybox and its applet links,
// the capsem symlinks, the mount points and a minimal /etc.
func layoutInitramfs(t *fsTree, guest, busybox []byte, applets []string) {
	t.file(GuestInit, 0o755, guest)
	for _, l := range []string{GuestMCPServer, GuestDoctor, GuestCapsem} {
		t.symlink(l, GuestInit)
	}
	t.file("/bin/busybox", 0o755, busybox)
	for _, a := range applets {
		name := cleanName(a)
		if _, taken := t.entries[name]; taken || name == "" || name == "init" {
			continue
		}
		t.symlink(name, "/bin/busybox")
	}
	for _, d := range []string{"/dev", "/proc", "/sys", "/run", "/mnt", "/var", "/etc", "/usr/sbin", "/sbin", "/lib/modules"} {
		t.dir(d, 0o755)
	}
	t.dir("/tmp", 0o1777)
	t.dir("/var/tmp", 0o1777)
	t.dir("/root", 0o700)
	// The kernel opens /dev/console for init's stdio before /init runs and
	// before anything mounts devtmpfs; the agent mounts devtmpfs over /dev.
	t.charDev("/dev/console", 0o600, 5, 1)
	t.charDev("/dev/null", 0o666, 1, 3)
	t.file("/etc/hostname", 0o644, []byte("capsem\n"))
	t.file("/etc/hosts", 0o644, []byte("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\tcapsem\n"))
	t.file("/etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
	t.file("/etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n"))
	t.file("/etc/shells", 0o644, []byte("/bin/sh\n"))
}
