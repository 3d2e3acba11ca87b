package guestfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
)

// bootBuilder makes the two artefacts a VM boots from: the kernel (recipe
// of kind kernel) and the minimal root (kind initramfs) built on it.
type bootBuilder struct {
	opts            Options
	s               *store
	host            bootHost
	log             *slog.Logger
	kernel, minimal *Recipe
	// guest is the guest binary's sha256.
	guest string
	// updated: apt-get update already ran; force: Build, rebuild both.
	updated, force bool
}

func newBootBuilder(opts Options) (*bootBuilder, error) {
	if opts.GuestBinary == "" {
		return nil, errors.New("guestfs: Options.GuestBinary is empty")
	}
	minimal := opts.Minimal
	var err error
	if minimal == nil {
		if minimal, err = loadRecipeOfKind(MinimalRecipe, KindInitramfs); err != nil {
			return nil, err
		}
	} else if err := minimal.mustBe(KindInitramfs); err != nil {
		return nil, err
	}
	kernel := opts.Kernel
	if kernel == nil {
		if kernel, err = loadRecipeOfKind(minimal.Initramfs.Kernel, KindKernel); err != nil {
			return nil, fmt.Errorf("%s: initramfs.kernel: %w", minimal.File, err)
		}
	} else if err := kernel.mustBe(KindKernel); err != nil {
		return nil, err
	}
	if kernel.Name != minimal.Initramfs.Kernel || kernel.Arch != minimal.Arch {
		return nil, fmt.Errorf("guestfs: %s: initramfs.kernel names %q (%s), not the kernel recipe %q (%s)",
			minimal.File, minimal.Initramfs.Kernel, minimal.Arch, kernel.Name, kernel.Arch)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	log := opts.Logger.With("component", "guestfs")
	s, err := openStore(opts.Dir, log, opts.Progress)
	if err != nil {
		return nil, err
	}
	host := opts.host
	if host == nil {
		host = debianBoot{}
	}
	return &bootBuilder{opts: opts, s: s, host: host, log: log, kernel: kernel, minimal: minimal}, nil
}

// resolveError marks a failure to ask apt which packages to use.
type resolveError struct{ err error }

func (e *resolveError) Error() string { return e.err.Error() }
func (e *resolveError) Unwrap() error { return e.err }

// fetchError marks a failed download, the one failure an apt-get update
// may cure.
type fetchError struct{ err error }

func (e *fetchError) Error() string { return e.err.Error() }
func (e *fetchError) Unwrap() error { return e.err }

// run is Ensure and Build: the guest binary's hash, apt's answer, then
// each artefact from the store or built. A download failing runs apt-get
// update once and starts over; when apt cannot be asked or the packages
// fetched (offline), Ensure falls back to the newest cached assets for
// this guest binary.
func (b *bootBuilder) run(ctx context.Context) (*Assets, error) {
	guest, err := checkGuestBinary(b.opts.GuestBinary, b.minimal.Arch, b.s.sums)
	if err != nil {
		return nil, err
	}
	b.guest = guest
	a, err := b.attempt(ctx, b.force)
	var ferr *fetchError
	if errors.As(err, &ferr) && !b.updated {
		// The lists may name files the mirror no longer has: refresh once
		// and start over with whatever versions apt now picks.
		b.log.Info("download failed; running apt-get update once", "err", err)
		if uerr := b.host.aptUpdate(ctx, b); uerr != nil {
			return nil, fmt.Errorf("guestfs: %w (and apt-get update failed: %v)", err, uerr)
		}
		a, err = b.attempt(ctx, true)
	}
	var rerr *resolveError
	if err != nil && !b.force && (errors.As(err, &ferr) || errors.As(err, &rerr)) {
		// Offline, or apt broken: booting the last good build beats not
		// booting at all.
		if fb := b.fallback(); fb != nil {
			b.log.Warn("cannot resolve or fetch the packages; using the newest cached assets for this guest binary", "err", err, "dir", fb.Dir)
			b.s.progress("warning: %v; using the cached assets in %s", err, fb.Dir)
			return fb, nil
		}
	}
	return a, err
}

// attempt resolves the packages (fresh: asking apt rather than the memo)
// and ensures the kernel, then the minimal root.
func (b *bootBuilder) attempt(ctx context.Context, fresh bool) (*Assets, error) {
	kpkg, bpkg, err := b.resolvePackages(ctx, fresh)
	if err != nil {
		return nil, &resolveError{fmt.Errorf("guestfs: resolving %s and %s: %w", b.kernel.Kernel.Package, b.minimal.Initramfs.Busybox, err)}
	}
	kin := KernelInputs{
		Builder: BuilderVersion, Recipe: b.kernel.Name, RecipeSHA256: recipeSHA256(b.kernel),
		Package: kpkg.Name, Version: kpkg.Version, DebSHA256: kpkg.SHA256,
	}
	km, err := ensureEntry(ctx, b.s, b.kernel.Name, kin.Key(), b.force,
		func(key string) (*KernelManifest, bool) {
			m := &KernelManifest{}
			return m, b.s.cached(KindKernel, key, m, func() string { return m.Inputs.Key() })
		},
		func() (*KernelManifest, error) { return b.buildKernel(ctx, kin, kpkg) })
	if err != nil {
		return nil, err
	}
	iin := InitramfsInputs{
		Builder: BuilderVersion, Recipe: b.minimal.Name, RecipeSHA256: recipeSHA256(b.minimal), KernelKey: km.Key,
		BusyboxPackage: bpkg.Name, BusyboxVersion: bpkg.Version, BusyboxDebSHA256: bpkg.SHA256, GuestBinarySHA256: b.guest,
	}
	im, err := ensureEntry(ctx, b.s, b.minimal.Name, iin.Key(), b.force,
		func(key string) (*InitramfsManifest, bool) {
			m := &InitramfsManifest{}
			return m, b.s.cached(KindInitramfs, key, m, func() string { return m.Inputs.Key() })
		},
		func() (*InitramfsManifest, error) { return b.buildInitramfs(ctx, iin, km, kpkg, bpkg) })
	if err != nil {
		return nil, err
	}
	return loadAssets(b.s.dir, im.Key)
}

// ensureEntry returns recipe name's artefact of key: the store's, once
// its ref names it, or else a new build (which publishes it and moves the
// ref) under the recipe's build lock. Another process may have built it
// while this one waited for the lock: the store is asked again first.
// force builds regardless.
func ensureEntry[M manifest](ctx context.Context, s *store, name, key string, force bool,
	cached func(key string) (M, bool), build func() (M, error)) (M, error) {
	var zero M
	fromStore := func() (M, bool, error) {
		m, ok := cached(key)
		if !ok {
			return zero, false, nil
		}
		err := s.pointRef(ctx, name, key)
		if errors.Is(err, errEntryGone) {
			return zero, false, nil
		}
		return m, err == nil, err
	}
	if !force {
		if m, ok, err := fromStore(); ok || err != nil {
			return m, err
		}
	}
	unlock, err := s.lockBuild(ctx, name)
	if err != nil {
		return zero, err
	}
	defer unlock()
	if !force {
		if m, ok, err := fromStore(); ok || err != nil {
			return m, err
		}
	}
	return build()
}

// cached reads the entry of key into m and verifies it: a manifest of
// kind whose inputs hash to key (inputsKey, once m is read) and files that
// match it. Anything else is logged and treated as missing, so the entry
// is built again.
func (s *store) cached(kind, key string, m manifest, inputsKey func() string) bool {
	entry := storePath(s.dir, key)
	if err := readManifest(entry, kind, m); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("unreadable store entry; rebuilding", "dir", entry, "err", err)
		}
		return false
	}
	if h := m.header(); h.Key != key || inputsKey() != key {
		s.log.Warn("a store entry's manifest does not match its key; rebuilding", "dir", entry)
		return false
	}
	if err := m.header().verifyFiles(entry, s.sums); err != nil {
		s.log.Warn("a store entry failed verification; rebuilding", "err", err)
		return false
	}
	return true
}

// fallback is the newest verified assets for this guest binary, used when
// apt cannot be asked or the packages fetched.
func (b *bootBuilder) fallback() *Assets {
	return b.newest(func(a *Assets) bool { return a.verify(b.s.sums) == nil })
}

// newest is the assets for this guest binary, recipes and builder that
// pass ok: refs/<minimal>'s when it qualifies, else the newest minimal
// root in the store that does.
func (b *bootBuilder) newest(ok func(*Assets) bool) *Assets {
	suits := func(a *Assets) bool {
		in := a.InitramfsManifest.Inputs
		return in.GuestBinarySHA256 == b.guest && in.Builder == BuilderVersion &&
			in.Recipe == b.minimal.Name && in.RecipeSHA256 == recipeSHA256(b.minimal) &&
			a.KernelManifest.Inputs.RecipeSHA256 == recipeSHA256(b.kernel) && ok(a)
	}
	if key, err := readRef(b.s.dir, b.minimal.Name); err == nil {
		if a, err := loadAssets(b.s.dir, key); err == nil && suits(a) {
			return a
		}
	}
	var best *Assets
	for _, e := range storeEntries(b.s.dir) {
		var h EntryHeader
		if readManifest(filepath.Join(b.s.dir, storeDir, e), KindInitramfs, &h) != nil || h.Recipe != b.minimal.Name {
			continue
		}
		a, err := loadAssets(b.s.dir, h.Key)
		if err != nil {
			continue
		}
		if (best == nil || a.InitramfsManifest.BuiltAt.After(best.InitramfsManifest.BuiltAt)) && suits(a) {
			best = a
		}
	}
	return best
}
