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
	"syscall"
	"time"

	"github.com/capsem/capsem/core/modorder"
)

// build makes the assets for in under the lock: the kernel stage (from
// its cache, or fetched and unpacked), busybox, the initramfs, then the
// finished directory renamed into place.
func (b *builder) build(ctx context.Context, in Inputs, res resolution) (*Assets, error) {
	start := time.Now()
	ks, bdeb, err := b.prepare(ctx, res)
	var ferr *fetchError
	if errors.As(err, &ferr) && !b.updated {
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
		if a, ok := b.cached(in); ok && !b.force {
			return a, nil
		}
		ks, bdeb, err = b.prepare(ctx, res)
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
	m := Manifest{
		Inputs: in, InputsHash: in.Hash(), Files: map[string]FileSum{},
		Release: ks.Release, PVH: ks.PVH, Modules: ks.modules(), BuiltIn: ks.BuiltIn, Absent: ks.Absent,
	}
	// Kernel files: hard links into the kernel stage (no second 66 MB copy
	// per build); Verify re-hashes them all the same.
	for _, name := range []string{FileVmlinuz, FileVmlinux} {
		sum, ok := ks.Files[name]
		if !ok {
			continue
		}
		if err := linkOrCopy(filepath.Join(ks.dir, name), filepath.Join(out, name)); err != nil {
			return nil, fmt.Errorf("guestfs: %w", err)
		}
		m.Files[name] = sum
	}

	tree := newFSTree()
	for _, guestPath := range ks.modules() {
		data, err := os.ReadFile(filepath.Join(ks.dir, filepath.FromSlash(strings.TrimPrefix(guestPath, "/"))))
		if err != nil {
			return nil, fmt.Errorf("guestfs: reading a staged module: %w", err)
		}
		tree.file(guestPath, 0o644, data)
	}
	var chains [][]modorder.Entry
	for _, c := range ks.ModuleChains {
		var entries []modorder.Entry
		for _, p := range c {
			entries = append(entries, modorder.Entry{Path: p, Devices: ks.ModuleDevices[p]})
		}
		chains = append(chains, entries)
	}
	loadOrder, err := modorder.FormatChains(chains)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	tree.file(LoadOrderPath, 0o644, []byte(loadOrder))

	// Busybox.
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
	b.progress("initramfs: %s (uncompressed newc, %d entries, %d busybox applets)", humanBytes(int64(cpio.Len())), len(tree.entries), len(applets))

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
	b.pruneDebs(b.debPath(res.Kernel), b.debPath(res.Busybox))
	b.pruneBuilds(final)
	a, err := Load(final)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.progress("assets ready in %s (%.1f s)", final, time.Since(start).Seconds())
	return a, nil
}

// fetchError marks a failed download, the one failure an apt-get update
// may cure.
type fetchError struct{ err error }

func (e *fetchError) Error() string { return e.err.Error() }
func (e *fetchError) Unwrap() error { return e.err }

// prepare returns the kernel stage and the busybox .deb.
func (b *builder) prepare(ctx context.Context, res resolution) (*kernelStage, string, error) {
	ks, err := b.kernelStage(ctx, res.Kernel)
	if err != nil {
		return nil, "", err
	}
	bdeb, err := b.fetchDeb(ctx, res.Busybox)
	if err != nil {
		return nil, "", &fetchError{err}
	}
	return ks, bdeb, nil
}

// kernelStage is what the build takes from the kernel package: the
// bzImage, the extracted vmlinux and the selected modules (plain .ko at
// their guest paths), cached in <Dir>/kernels/<key> so that a new guest
// binary (every development build) only rewrites the initramfs instead of
// unpacking 400 MB of modules and decompressing the kernel again.
type kernelStage struct {
	dir     string
	Release string `json:"kernel_release"`
	PVH     bool   `json:"pvh"`
	// ModuleChains are the modules' guest paths in load order, split into
	// groups that share no dependency.
	ModuleChains [][]string `json:"module_chains"`
	// ModuleDevices holds, by guest path, the device aliases a module is
	// loaded for; modules not in it always load.
	ModuleDevices map[string][]string `json:"module_devices,omitempty"`
	BuiltIn       []string            `json:"built_in,omitempty"`
	Absent        []string            `json:"absent,omitempty"`
	// Files are slash-separated paths relative to the stage directory.
	Files map[string]FileSum `json:"files"`
}

const kernelStageFile = "kernel.json"

// modules is every module's guest path in load order: the chains one after
// the other.
func (ks *kernelStage) modules() []string {
	var out []string
	for _, c := range ks.ModuleChains {
		out = append(out, c...)
	}
	return out
}

// kernelStageKey names a kernel stage: the package's content, the module
// list and the builder version.
func (b *builder) kernelStageKey(p pkgInfo) string {
	data, _ := json.Marshal([]any{BuilderVersion, p.Name, p.SHA256, b.opts.Modules})
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:12])
}

func loadKernelStage(dir string) (*kernelStage, error) {
	data, err := os.ReadFile(filepath.Join(dir, kernelStageFile))
	if err != nil {
		return nil, err
	}
	ks := &kernelStage{dir: dir}
	if err := json.Unmarshal(data, ks); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(dir, kernelStageFile), err)
	}
	return ks, nil
}

// verify re-hashes the stage, so a damaged cache cannot leak into a new
// build whose manifest would then vouch for it.
func (ks *kernelStage) verify() error {
	if _, ok := ks.Files[FileVmlinuz]; !ok {
		return errors.New("kernel stage lacks vmlinuz")
	}
	for rel, sum := range ks.Files {
		if !filepath.IsLocal(filepath.FromSlash(rel)) {
			return fmt.Errorf("kernel stage names an invalid file %q", rel)
		}
		if err := verifyFile(filepath.Join(ks.dir, filepath.FromSlash(rel)), sum, nil); err != nil {
			return err
		}
	}
	return nil
}

// kernelStage returns the verified kernel stage for p, making it when
// missing (or when forced).
func (b *builder) kernelStage(ctx context.Context, p pkgInfo) (*kernelStage, error) {
	kernels := filepath.Join(b.opts.Dir, "kernels")
	dir := filepath.Join(kernels, b.kernelStageKey(p))
	if !b.force {
		if ks, err := loadKernelStage(dir); err == nil {
			verr := ks.verify()
			if verr == nil {
				b.progress("using the cached kernel %s (%s %s)", ks.Release, p.Name, p.Version)
				return ks, nil
			}
			b.log.Warn("cached kernel stage failed verification; rebuilding it", "dir", dir, "err", verr)
		}
	}
	deb, err := b.fetchDeb(ctx, p)
	if err != nil {
		return nil, &fetchError{err}
	}
	if err := os.MkdirAll(kernels, 0o755); err != nil {
		return nil, fmt.Errorf("creating the kernel cache: %w", err)
	}
	work, err := os.MkdirTemp(b.opts.Dir, ".build-")
	if err != nil {
		return nil, fmt.Errorf("creating a build directory: %w", err)
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "stage")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("creating the kernel stage: %w", err)
	}

	b.progress("unpacking %s %s…", p.Name, p.Version)
	kroot := filepath.Join(work, "deb")
	if err := b.unpackDeb(ctx, deb, kroot); err != nil {
		return nil, err
	}
	release, vmlinuz, err := findKernel(kroot)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	ks := &kernelStage{dir: dir, Release: release, Files: map[string]FileSum{}}
	put := func(rel string, data []byte) error {
		full := filepath.Join(out, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("staging %s: %w", rel, err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			return fmt.Errorf("staging %s: %w", rel, err)
		}
		sum := sha256.Sum256(data)
		ks.Files[rel] = FileSum{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
		return nil
	}
	bz, err := os.ReadFile(vmlinuz)
	if err != nil {
		return nil, fmt.Errorf("reading the kernel: %w", err)
	}
	if err := put(FileVmlinuz, bz); err != nil {
		return nil, err
	}
	b.progress("extracting the uncompressed kernel from %s…", filepath.Base(vmlinuz))
	elfKernel, err := ExtractVmlinux(bz)
	if err != nil {
		// The bzImage still boots, only more slowly under TCG.
		b.log.Warn("no uncompressed kernel; the guest boots the bzImage", "err", err)
		b.progress("warning: %v; using vmlinuz", err)
	} else {
		if ks.PVH, err = HasPVHNote(bytes.NewReader(elfKernel)); err != nil {
			return nil, err
		}
		if err := put(FileVmlinux, elfKernel); err != nil {
			return nil, err
		}
		b.progress("vmlinux: %s, PVH entry: %v", humanBytes(int64(len(elfKernel))), ks.PVH)
	}

	modRoot, err := findModuleRoot(kroot, release)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	mt, err := openModTree(modRoot, b.log)
	if err != nil {
		return nil, err
	}
	order, builtin, absent, err := mt.selectModules(b.opts.Modules)
	if err != nil {
		return nil, fmt.Errorf("ordering kernel modules: %w", err)
	}
	ks.BuiltIn, ks.Absent = builtin, absent
	conds, err := mt.deviceConditions(b.opts.Modules, order)
	if err != nil {
		return nil, fmt.Errorf("kernel module device conditions: %w", err)
	}
	sizes := map[string]int64{}
	guestPaths := map[string]string{}
	// Module patching reads the kernel's export CRCs for the symbols it
	// adds; without the ELF kernel it adds none.
	var crcs map[string]uint32
	if elfKernel != nil {
		if crcs, err = kernelCRCs(elfKernel); err != nil {
			return nil, err
		}
	}
	var patched moduleStats
	for _, name := range order {
		data, err := mt.readModule(name)
		if err != nil {
			return nil, err
		}
		data, st, err := patchModule(data, crcs)
		if err != nil {
			return nil, fmt.Errorf("patching module %s: %w", name, err)
		}
		patched.add(st)
		guestPath := path.Join("/lib/modules", release, plainModulePath(mt.paths[name]))
		if err := put(strings.TrimPrefix(guestPath, "/"), data); err != nil {
			return nil, err
		}
		sizes[name], guestPaths[name] = int64(len(data)), guestPath
		if c := conds[name]; len(c) > 0 {
			if ks.ModuleDevices == nil {
				ks.ModuleDevices = map[string][]string{}
			}
			ks.ModuleDevices[guestPath] = c
		}
	}
	b.progress("modules: %d static call sites, %d prepatched as direct calls and %d as NOPs; %d ftrace sites as NOPs; "+
		"ORC unwind tables of %d modules and trace event lists of %d left unloaded",
		patched.staticSites, patched.staticDirect, patched.staticNops, patched.fentryNops, patched.unwindTables, patched.eventTables)
	// Module size stands in for load time (relocations, symbols, code
	// patching all grow with it).
	chains, err := mt.chains(order, func(name string) int64 { return sizes[name] })
	if err != nil {
		return nil, fmt.Errorf("kernel module chains: %w", err)
	}
	for _, c := range chains {
		var paths []string
		for _, name := range c {
			paths = append(paths, guestPaths[name])
		}
		ks.ModuleChains = append(ks.ModuleChains, paths)
		b.progress("modules, chain %d: %s", len(ks.ModuleChains), strings.Join(c, ", "))
	}
	if len(absent) > 0 {
		b.progress("warning: not in this kernel: %s", strings.Join(absent, ", "))
	}

	data, err := json.MarshalIndent(ks, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", kernelStageFile, err)
	}
	if err := os.WriteFile(filepath.Join(out, kernelStageFile), data, 0o644); err != nil {
		return nil, fmt.Errorf("writing %s: %w", kernelStageFile, err)
	}
	if err := publishDir(out, dir, work); err != nil {
		return nil, err
	}
	b.pruneKernelStages(dir)
	return ks, nil
}

// pruneKernelStages keeps the current kernel stage and the newest other
// one, so going back one kernel does not mean unpacking it again.
func (b *builder) pruneKernelStages(current string) {
	kernels := filepath.Dir(current)
	ents, err := os.ReadDir(kernels)
	if err != nil {
		return
	}
	type stage struct {
		dir string
		mod time.Time
	}
	var others []stage
	for _, e := range ents {
		p := filepath.Join(kernels, e.Name())
		if !e.IsDir() || p == current {
			continue
		}
		if info, err := e.Info(); err == nil {
			others = append(others, stage{p, info.ModTime()})
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i].mod.After(others[j].mod) })
	for i, s := range others {
		if i < 1 {
			continue
		}
		if err := os.RemoveAll(s.dir); err == nil {
			b.log.Info("removed an old kernel stage", "dir", s.dir)
		}
	}
}

// linkOrCopy hard-links src to dst, copying when linking is impossible
// (another file system).
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
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
	if !errors.Is(err, os.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
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
