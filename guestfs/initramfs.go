package guestfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capsem/capsem/core/modorder"
)

// buildInitramfs makes the minimal root of in under its recipe's build
// lock: the kernel artefact km's modules and their load order, busybox
// from bpkg with its applet links, the guest binary as /init, and the
// recipe's directories, devices and files, as one uncompressed newc
// archive. It reads the kernel from the store, never from its package.
func (b *bootBuilder) buildInitramfs(ctx context.Context, in InitramfsInputs, km *KernelManifest, kpkg, bpkg pkgInfo) (*InitramfsManifest, error) {
	start := time.Now()
	bdeb, err := b.host.fetchDeb(ctx, b, bpkg)
	if err != nil {
		return nil, &fetchError{fmt.Errorf("guestfs: %w", err)}
	}
	b.s.progress("minimal root: kernel %s from the store (%s)", km.Release, km.Key[:12])
	kdir := storePath(b.s.dir, km.Key)
	tree := newFSTree()
	for _, guestPath := range km.modules() {
		rel := strings.TrimPrefix(guestPath, "/")
		want, ok := km.Files[rel]
		if !ok || !validEntryFile(rel) {
			return nil, fmt.Errorf("guestfs: the kernel artefact %s names a module %q that is not among its files", km.Key[:12], guestPath)
		}
		data, err := os.ReadFile(filepath.Join(kdir, filepath.FromSlash(rel)))
		if err != nil {
			return nil, fmt.Errorf("guestfs: the kernel artefact's module %s: %w", guestPath, err)
		}
		// What the new manifest vouches for is checked, not assumed.
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != want.SHA256 {
			return nil, fmt.Errorf("guestfs: the kernel artefact's module %s does not match its manifest (modified or corrupt)", guestPath)
		}
		tree.file(guestPath, 0o644, data)
	}
	var chains [][]modorder.Entry
	for _, c := range km.ModuleChains {
		var entries []modorder.Entry
		for _, p := range c {
			entries = append(entries, modorder.Entry{Path: p, Devices: km.ModuleDevices[p]})
		}
		chains = append(chains, entries)
	}
	loadOrder, err := modorder.FormatChains(chains)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	tree.file(LoadOrderPath, 0o644, []byte(loadOrder))

	work, err := b.s.workDir(b.minimal.Name)
	if err != nil {
		return nil, err
	}
	defer removeWorkDir(work, b.log)
	broot := filepath.Join(work, "busybox")
	if err := b.host.unpackDeb(ctx, b, bdeb, broot); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	bbPath := filepath.Join(broot, filepath.FromSlash(strings.TrimPrefix(busyboxPath, "/")))
	bb, err := os.ReadFile(bbPath)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %s has no %s: %w", bpkg.Name, busyboxPath, err)
	}
	applets := b.busyboxApplets(ctx, bbPath)

	// Guest binary: re-hash what is read, so a binary replaced since
	// Ensure hashed it cannot end up under the old hash.
	guest, err := os.ReadFile(b.opts.GuestBinary)
	if err != nil {
		return nil, fmt.Errorf("guestfs: reading the guest binary: %w", err)
	}
	if sum := sha256.Sum256(guest); hex.EncodeToString(sum[:]) != in.GuestBinarySHA256 {
		return nil, fmt.Errorf("guestfs: guest binary %s changed during the build; run it again", b.opts.GuestBinary)
	}
	linked, err := layoutInitramfs(tree, b.minimal, guest, bb, applets)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %s: %w", b.minimal.File, err)
	}
	var cpio bytes.Buffer
	if err := tree.writeCpio(&cpio); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}

	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	sum := sha256.Sum256(cpio.Bytes())
	m := &InitramfsManifest{
		EntryHeader: EntryHeader{
			Kind: KindInitramfs, Recipe: b.minimal.Name, Key: in.Key(), Depends: []string{km.Key},
			Files: map[string]FileSum{FileInitramfs: {Size: int64(cpio.Len()), SHA256: hex.EncodeToString(sum[:])}},
		},
		Inputs: in, Release: km.Release, Modules: km.modules(), Applets: linked,
	}
	p := filepath.Join(out, FileInitramfs)
	if err := os.WriteFile(p, cpio.Bytes(), 0o644); err != nil {
		return nil, fmt.Errorf("guestfs: writing %s: %w", FileInitramfs, err)
	}
	b.s.sums.record(p, m.Files[FileInitramfs].SHA256)
	b.s.progress("initramfs: %s (uncompressed newc, %d entries, %d busybox applets)", humanBytes(int64(cpio.Len())), len(tree.entries), linked)
	m.BuiltAt = time.Now().UTC()
	m.BuildSeconds = roundSeconds(time.Since(start))
	if err := writeManifest(out, m); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	final, err := b.s.publish(ctx, &m.EntryHeader, out, work)
	if err != nil {
		return nil, err
	}
	b.pruneDebs(b.debPath(kpkg), b.debPath(bpkg))
	b.s.progress("minimal root ready in %s (%.1f s)", final, time.Since(start).Seconds())
	return m, nil
}

// layoutInitramfs adds everything but the modules, as the recipe says:
// the guest binary (its personality follows argv[0]) and its links,
// busybox, the directories, devices and files, then a link to busybox
// for each applet where nothing else is. It returns how many applets it
// linked.
func layoutInitramfs(t *fsTree, r *Recipe, guest, busybox []byte, applets []string) (int, error) {
	spec := r.Initramfs
	t.file(spec.Init, 0o755, guest)
	for _, l := range spec.InitLinks {
		t.symlink(l, spec.Init)
	}
	t.file(busyboxPath, 0o755, busybox)
	for _, d := range spec.Dirs {
		mode, err := parseMode(d.Mode)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", d.Path, err)
		}
		t.dir(d.Path, unixPerm(mode))
	}
	for _, d := range spec.Devices {
		mode, err := parseMode(d.Mode)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", d.Path, err)
		}
		t.charDev(d.Path, unixPerm(mode), uint32(d.Major), uint32(d.Minor))
	}
	for _, f := range r.Files {
		if f.Target != "" {
			t.symlink(f.Path, f.Target)
			continue
		}
		mode := fs.FileMode(0o644)
		if f.Mode != "" {
			var err error
			if mode, err = parseMode(f.Mode); err != nil {
				return 0, fmt.Errorf("%s: %w", f.Path, err)
			}
		}
		t.file(f.Path, unixPerm(mode), []byte(f.Content))
	}
	linked := 0
	for _, a := range applets {
		name := cleanName(a)
		if _, taken := t.entries[name]; taken || name == "" || name == cleanName(spec.Init) || t.underNonDir(name) {
			continue
		}
		t.symlink(name, busyboxPath)
		linked++
	}
	return linked, nil
}

// unixPerm turns a parsed mode's permission and set-ID and sticky bits
// into their octal form.
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		p |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		p |= 0o1000
	}
	return p
}
