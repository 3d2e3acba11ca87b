package guestfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// buildKernel makes the kernel artefact of in from the package p, under
// the kernel recipe's build lock: the bzImage, the vmlinux extracted from
// it, and the recipe's modules with their dependencies, each unsigned and
// prepatched, at their guest paths. A new guest binary (every development
// build) then rebuilds only the initramfs instead of unpacking 400 MB of
// modules and decompressing the kernel again.
func (b *bootBuilder) buildKernel(ctx context.Context, in KernelInputs, p pkgInfo) (*KernelManifest, error) {
	start := time.Now()
	deb, err := b.host.fetchDeb(ctx, b, p)
	if err != nil {
		return nil, &fetchError{fmt.Errorf("guestfs: %w", err)}
	}
	work, err := b.s.workDir(b.kernel.Name)
	if err != nil {
		return nil, err
	}
	defer removeWorkDir(work, b.log)
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	m := &KernelManifest{
		EntryHeader: EntryHeader{Kind: KindKernel, Recipe: b.kernel.Name, Key: in.Key(), Files: map[string]FileSum{}},
		Inputs:      in,
	}
	if err := b.stageKernel(ctx, deb, p, work, out, m); err != nil {
		return nil, fmt.Errorf("guestfs: kernel %s: %w", b.kernel.Name, err)
	}
	m.BuiltAt = time.Now().UTC()
	m.BuildSeconds = roundSeconds(time.Since(start))
	if err := writeManifest(out, m); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	final, err := b.s.publish(ctx, &m.EntryHeader, out, work)
	if err != nil {
		return nil, err
	}
	b.s.progress("kernel %s ready in %s (%s, %.1f s)", m.Release, final, humanBytes(m.Size()), time.Since(start).Seconds())
	return m, nil
}

// stageKernel unpacks the kernel package deb into work and writes the
// artefact's files into out, recording them in m.
func (b *bootBuilder) stageKernel(ctx context.Context, deb string, p pkgInfo, work, out string, m *KernelManifest) error {
	b.s.progress("unpacking %s %s…", p.Name, p.Version)
	kroot := filepath.Join(work, "deb")
	if err := b.host.unpackDeb(ctx, b, deb, kroot); err != nil {
		return err
	}
	release, vmlinuz, err := findKernel(kroot)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	m.Release = release
	put := func(rel string, data []byte) error {
		full := filepath.Join(out, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("staging %s: %w", rel, err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			return fmt.Errorf("staging %s: %w", rel, err)
		}
		sum := sha256.Sum256(data)
		m.Files[rel] = FileSum{Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
		b.s.sums.record(full, m.Files[rel].SHA256)
		return nil
	}
	bz, err := os.ReadFile(vmlinuz)
	if err != nil {
		return fmt.Errorf("reading the kernel: %w", err)
	}
	if err := put(FileVmlinuz, bz); err != nil {
		return err
	}
	b.s.progress("extracting the uncompressed kernel from %s…", filepath.Base(vmlinuz))
	elfKernel, err := ExtractVmlinux(bz)
	if err != nil {
		// The bzImage still boots, only more slowly under TCG.
		b.log.Warn("no uncompressed kernel; the guest boots the bzImage", "err", err)
		b.s.progress("warning: %v; using vmlinuz", err)
	} else {
		if m.PVH, err = HasPVHNote(bytes.NewReader(elfKernel)); err != nil {
			return err
		}
		if err := put(FileVmlinux, elfKernel); err != nil {
			return err
		}
		b.s.progress("vmlinux: %s, PVH entry: %v", humanBytes(int64(len(elfKernel))), m.PVH)
	}

	modRoot, err := findModuleRoot(kroot, release)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	mt, err := openModTree(modRoot, b.log)
	if err != nil {
		return err
	}
	wanted := b.kernel.Kernel.Modules
	order, builtin, absent, err := mt.selectModules(wanted)
	if err != nil {
		return fmt.Errorf("ordering kernel modules: %w", err)
	}
	m.BuiltIn, m.Absent = builtin, absent
	conds, err := mt.deviceConditions(wanted, order)
	if err != nil {
		return fmt.Errorf("kernel module device conditions: %w", err)
	}
	sizes := map[string]int64{}
	guestPaths := map[string]string{}
	// Module patching reads the kernel's export CRCs for the symbols it
	// adds; without the ELF kernel it adds none.
	var crcs map[string]uint32
	if elfKernel != nil {
		if crcs, err = kernelCRCs(elfKernel); err != nil {
			return err
		}
	}
	var patched moduleStats
	for _, name := range order {
		data, err := mt.readModule(name)
		if err != nil {
			return err
		}
		data, st, err := patchModule(data, crcs)
		if err != nil {
			return fmt.Errorf("patching module %s: %w", name, err)
		}
		patched.add(st)
		guestPath := path.Join("/lib/modules", release, plainModulePath(mt.paths[name]))
		if err := put(strings.TrimPrefix(guestPath, "/"), data); err != nil {
			return err
		}
		sizes[name], guestPaths[name] = int64(len(data)), guestPath
		if c := conds[name]; len(c) > 0 {
			if m.ModuleDevices == nil {
				m.ModuleDevices = map[string][]string{}
			}
			m.ModuleDevices[guestPath] = c
		}
	}
	b.s.progress("modules: %d static call sites, %d prepatched as direct calls and %d as NOPs; %d ftrace sites as NOPs; "+
		"ORC unwind tables of %d modules and trace event lists of %d left unloaded",
		patched.staticSites, patched.staticDirect, patched.staticNops, patched.fentryNops, patched.unwindTables, patched.eventTables)
	// Module size stands in for load time (relocations, symbols, code
	// patching all grow with it).
	chains, err := mt.chains(order, func(name string) int64 { return sizes[name] })
	if err != nil {
		return fmt.Errorf("kernel module chains: %w", err)
	}
	for _, c := range chains {
		var paths []string
		for _, name := range c {
			paths = append(paths, guestPaths[name])
		}
		m.ModuleChains = append(m.ModuleChains, paths)
		b.s.progress("modules, chain %d: %s", len(m.ModuleChains), strings.Join(c, ", "))
	}
	if len(absent) > 0 {
		b.s.progress("warning: not in this kernel: %s", strings.Join(absent, ", "))
	}
	return nil
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
