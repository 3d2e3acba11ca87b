package guestfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// BuilderVersion is part of every cache key: bump it when a change here
// alters what ends up in the assets, so existing caches are rebuilt.
const BuilderVersion = "8"

// File names inside an asset directory.
const (
	FileVmlinux   = "vmlinux"
	FileVmlinuz   = "vmlinuz"
	FileInitramfs = "initramfs.cpio"
	FileManifest  = "manifest.json"
)

// Guest paths the personalities rely on.
const (
	GuestInit      = "/init"
	GuestMCPServer = "/usr/bin/capsem-mcp-server"
	GuestDoctor    = "/usr/bin/capsem-doctor"
	GuestCapsem    = "/usr/bin/capsem"
)

// keepBuilds is how many asset directories survive pruning (the newest),
// so a VM that resolved its paths just before a rebuild still finds them.
const keepBuilds = 3

// Options configure Build and Ensure.
type Options struct {
	// Dir is the cache directory, $CAPSEM_HOME/assets in production.
	Dir string
	// GuestBinary is a CGO_ENABLED=0 capsem build: it becomes /init.
	GuestBinary string
	// Progress receives human-readable progress lines; nil discards them.
	Progress io.Writer
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Modules overrides DefaultModules (module names).
	Modules []string
}

// Inputs is everything an asset build depends on; its hash names the
// asset directory, so a change in any of them selects a new build.
type Inputs struct {
	Builder           string   `json:"builder"`
	KernelPackage     string   `json:"kernel_package"`
	KernelVersion     string   `json:"kernel_package_version"`
	KernelDebSHA256   string   `json:"kernel_deb_sha256"`
	BusyboxPackage    string   `json:"busybox_package"`
	BusyboxVersion    string   `json:"busybox_version"`
	BusyboxDebSHA256  string   `json:"busybox_deb_sha256"`
	GuestBinarySHA256 string   `json:"guest_binary_sha256"`
	Modules           []string `json:"modules"`
}

// Hash is the hex sha256 of the inputs' JSON form.
func (in Inputs) Hash() string {
	data, _ := json.Marshal(in)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// dirName is the asset directory for these inputs: 96 bits of the hash
// keeps paths short and collisions out of reach.
func (in Inputs) dirName() string { return in.Hash()[:24] }

var buildDirRE = regexp.MustCompile(`^[0-9a-f]{24}$`)

// FileSum is one asset file's size and sha256.
type FileSum struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest describes a built asset directory (manifest.json).
type Manifest struct {
	Inputs     Inputs `json:"inputs"`
	InputsHash string `json:"inputs_hash"`
	// Release is the kernel's uname -r, e.g. 6.1.0-48-amd64.
	Release string `json:"kernel_release"`
	// PVH is true when vmlinux carries the PVH entry note, so QEMU can
	// boot it with -kernel; otherwise Kernel is the bzImage.
	PVH bool `json:"pvh"`
	// Modules are the guest paths of the modules in load order, as in
	// /lib/modules/load-order.
	Modules []string `json:"modules"`
	// BuiltIn are wanted modules the kernel has built in (nothing to load);
	// Absent are wanted modules it lacks altogether.
	BuiltIn []string `json:"built_in,omitempty"`
	Absent  []string `json:"absent,omitempty"`
	// Applets counts busybox's links in the initramfs.
	Applets int                `json:"applets"`
	Files   map[string]FileSum `json:"files"`
	BuiltAt time.Time          `json:"built_at"`
	// BuildSeconds is how long the build took, for reporting.
	BuildSeconds float64 `json:"build_seconds"`
}

// Assets are the boot files of one build.
type Assets struct {
	// Dir is the asset directory, <Options.Dir>/<hash>.
	Dir string
	// Kernel is what to pass to -kernel: the ELF vmlinux when it carries
	// the PVH note (much faster under TCG), else the bzImage.
	Kernel string
	// KernelCompressed is the bzImage (vmlinuz), always present.
	KernelCompressed string
	// Initramfs is the uncompressed newc initramfs.
	Initramfs string
	// KernelVersion is the kernel release (uname -r).
	KernelVersion string
	Manifest
}

// Verify re-hashes every file the manifest lists and fails on any missing
// or changed one. (Ensure verifies through the sum cache: a file whose
// identity has not changed since its last full hash is not read again.)
func (a *Assets) Verify() error { return a.verify(nil) }

// VerifyBootFiles re-hashes the files a boot hands to the VM (the kernel it
// boots and the initramfs, which holds the guest binary) against the
// manifest, reading every byte whatever the sum cache says. The per-VM
// process runs it while the VM boots and reports the VM ready only when it
// passed. A mismatch also drops the asset's entries from the sum cache, so
// the next Ensure hashes them again and rebuilds.
func (a *Assets) VerifyBootFiles() error {
	var errs []error
	for _, p := range []string{a.Kernel, a.Initramfs} {
		want, ok := a.Files[filepath.Base(p)]
		if !ok {
			errs = append(errs, fmt.Errorf("asset %s: not in the manifest", filepath.Base(p)))
			continue
		}
		if err := verifyFile(p, want, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		sums := loadSumCache(filepath.Dir(a.Dir))
		for n := range a.Files {
			sums.forget(filepath.Join(a.Dir, n))
		}
		sums.save()
		return fmt.Errorf("assets in %s: %w", a.Dir, err)
	}
	return nil
}

// verify checks every file against the manifest; sums, when not nil,
// answers for files unchanged since they were last hashed.
func (a *Assets) verify(sums *sumCache) error {
	names := make([]string, 0, len(a.Files))
	for n := range a.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		if n != filepath.Base(n) || n == FileManifest || strings.HasPrefix(n, ".") {
			errs[i] = fmt.Errorf("asset manifest names an invalid file %q", n)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = verifyFile(filepath.Join(a.Dir, n), a.Files[n], sums)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("assets in %s: %w", a.Dir, err)
	}
	for _, need := range []string{FileVmlinuz, FileInitramfs} {
		if _, ok := a.Files[need]; !ok {
			return fmt.Errorf("assets in %s: manifest lacks %s", a.Dir, need)
		}
	}
	return nil
}

func verifyFile(p string, want FileSum, sums *sumCache) error {
	size, got, err := sums.sum(p)
	if err != nil {
		return fmt.Errorf("asset %s: %w", filepath.Base(p), err)
	}
	if size != want.Size {
		sums.forget(p)
		return fmt.Errorf("asset %s: size %d, manifest says %d", filepath.Base(p), size, want.Size)
	}
	if got != want.SHA256 {
		sums.forget(p)
		return fmt.Errorf("asset %s: sha256 %s, manifest says %s (modified or corrupt)", filepath.Base(p), got, want.SHA256)
	}
	return nil
}

// Load reads the manifest in dir and returns the assets it describes,
// without verifying the files (call Verify).
func Load(dir string) (*Assets, error) {
	data, err := os.ReadFile(filepath.Join(dir, FileManifest))
	if err != nil {
		return nil, fmt.Errorf("reading asset manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("parsing asset manifest %s: %w", filepath.Join(dir, FileManifest), err)
	}
	a := &Assets{
		Dir:              dir,
		KernelCompressed: filepath.Join(dir, FileVmlinuz),
		Initramfs:        filepath.Join(dir, FileInitramfs),
		KernelVersion:    m.Release,
		Manifest:         m,
	}
	a.Kernel = a.KernelCompressed
	if _, ok := m.Files[FileVmlinux]; ok && m.PVH {
		a.Kernel = filepath.Join(dir, FileVmlinux)
	}
	return a, nil
}

// Ensure returns verified assets for the current inputs, building them
// only when the cache has none: a new kernel or busybox in apt's lists, a
// changed guest binary, a new builder version, or a failed verification.
// Files are checked against the manifest's sha256, re-read only when their
// identity changed since they were last hashed (see sumCache).
func Ensure(ctx context.Context, opts Options) (*Assets, error) {
	b, err := newBuilder(opts)
	if err != nil {
		return nil, err
	}
	defer b.saveSums()
	in, res, err := b.inputs(ctx, false)
	if err != nil {
		if a := b.cachedFallback(); a != nil {
			b.log.Warn("cannot resolve packages; using the newest cached assets for this guest binary", "err", err, "dir", a.Dir)
			return a, nil
		}
		return nil, err
	}
	if a, ok := b.cached(in); ok {
		return a, nil
	}
	unlock, err := lockDir(ctx, b)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if a, ok := b.cached(in); ok { // another builder finished meanwhile
		return a, nil
	}
	a, err := b.build(ctx, in, res)
	var ferr *fetchError
	if errors.As(err, &ferr) {
		// Offline with lists naming a newer package: booting the last good
		// build beats not booting at all.
		if fb := b.cachedFallback(); fb != nil {
			b.log.Warn("cannot fetch the packages; using the newest cached assets for this guest binary", "err", err, "dir", fb.Dir)
			b.progress("warning: %v; using the cached assets in %s", err, fb.Dir)
			return fb, nil
		}
	}
	return a, err
}

// Build builds the assets unconditionally (capsem image build --force),
// replacing a cached build of the same inputs, with a fresh apt lookup.
func Build(ctx context.Context, opts Options) (*Assets, error) {
	b, err := newBuilder(opts)
	if err != nil {
		return nil, err
	}
	b.force = true
	defer b.saveSums()
	unlock, err := lockDir(ctx, b)
	if err != nil {
		return nil, err
	}
	defer unlock()
	in, res, err := b.inputs(ctx, true)
	if err != nil {
		return nil, err
	}
	return b.build(ctx, in, res)
}

type builder struct {
	opts    Options
	log     *slog.Logger
	updated bool // apt-get update already ran in this build
	force   bool // Build: remake the kernel stage too
	guest   string
	sums    *sumCache // sha256 of files unchanged since hashed
}

func newBuilder(opts Options) (*builder, error) {
	if opts.Dir == "" {
		return nil, errors.New("guestfs: Options.Dir is empty")
	}
	if opts.GuestBinary == "" {
		return nil, errors.New("guestfs: Options.GuestBinary is empty")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("guestfs: asset directory: %w", err)
	}
	opts.Dir = dir
	if opts.Modules == nil {
		opts.Modules = DefaultModules
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: creating the asset directory: %w", err)
	}
	return &builder{opts: opts, log: opts.Logger.With("component", "guestfs"), sums: loadSumCache(dir)}, nil
}

// saveSums keeps the sums hashed in this run for the next one.
func (b *builder) saveSums() {
	if err := b.sums.save(); err != nil {
		b.log.Debug("saving the asset sum cache", "err", err)
	}
}

func (b *builder) progress(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.log.Info(msg)
	if b.opts.Progress != nil {
		fmt.Fprintln(b.opts.Progress, msg)
	}
}

// inputs hashes the guest binary and resolves the packages.
func (b *builder) inputs(ctx context.Context, fresh bool) (Inputs, resolution, error) {
	guestSum, err := checkGuestBinary(b.opts.GuestBinary, b.sums)
	if err != nil {
		return Inputs{}, resolution{}, err
	}
	b.guest = guestSum
	res, err := b.resolve(ctx, fresh)
	if err != nil {
		return Inputs{}, res, fmt.Errorf("guestfs: resolving the kernel and busybox packages: %w", err)
	}
	return b.inputsFor(res), res, nil
}

func (b *builder) inputsFor(res resolution) Inputs {
	return Inputs{
		Builder:           BuilderVersion,
		KernelPackage:     res.Kernel.Name,
		KernelVersion:     res.Kernel.Version,
		KernelDebSHA256:   res.Kernel.SHA256,
		BusyboxPackage:    res.Busybox.Name,
		BusyboxVersion:    res.Busybox.Version,
		BusyboxDebSHA256:  res.Busybox.SHA256,
		GuestBinarySHA256: b.guest,
		Modules:           slices.Clone(b.opts.Modules),
	}
}

// cached returns the verified build for in, if there is one. A build that
// fails verification is logged and treated as missing (then rebuilt).
func (b *builder) cached(in Inputs) (*Assets, bool) {
	dir := filepath.Join(b.opts.Dir, in.dirName())
	a, err := Load(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("unreadable asset manifest; rebuilding", "dir", dir, "err", err)
		}
		return nil, false
	}
	if a.InputsHash != in.Hash() {
		b.log.Warn("asset manifest does not match its directory; rebuilding", "dir", dir)
		return nil, false
	}
	if err := a.verify(b.sums); err != nil {
		b.log.Warn("cached assets failed verification; rebuilding", "err", err)
		return nil, false
	}
	return a, true
}

// cachedFallback is the newest verified build for this guest binary and
// module list, used when apt cannot be asked (offline, apt broken).
func (b *builder) cachedFallback() *Assets {
	if b.guest == "" {
		return nil
	}
	return b.newest(b.guest, func(a *Assets) bool { return a.verify(b.sums) == nil })
}

// newest is the newest build for the guest binary with that sha256 (and
// this builder and module list) that passes ok.
func (b *builder) newest(guest string, ok func(*Assets) bool) *Assets {
	var best *Assets
	for _, a := range b.listBuilds() {
		if a.Inputs.GuestBinarySHA256 != guest || a.Inputs.Builder != BuilderVersion ||
			!slices.Equal(a.Inputs.Modules, b.opts.Modules) {
			continue
		}
		if (best == nil || a.BuiltAt.After(best.BuiltAt)) && ok(a) {
			best = a
		}
	}
	return best
}

// listBuilds loads every asset directory's manifest (unverified).
func (b *builder) listBuilds() []*Assets {
	ents, err := os.ReadDir(b.opts.Dir)
	if err != nil {
		return nil
	}
	var out []*Assets
	for _, e := range ents {
		if !e.IsDir() || !buildDirRE.MatchString(e.Name()) {
			continue
		}
		if a, err := Load(filepath.Join(b.opts.Dir, e.Name())); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// checkGuestBinary returns the binary's sha256 after checking it can be
// PID 1 of a guest with no libc: a static x86-64 ELF (or, for tests and
// debugging, a #! script).
func checkGuestBinary(p string, sums *sumCache) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("guestfs: guest binary: %w", err)
	}
	defer f.Close()
	head := make([]byte, 4)
	if _, err := io.ReadFull(f, head); err != nil {
		return "", fmt.Errorf("guestfs: guest binary %s: too short to be a program", p)
	}
	switch {
	case bytes.Equal(head, elfMagic):
		ef, err := elf.NewFile(f)
		if err != nil {
			return "", fmt.Errorf("guestfs: guest binary %s: %w", p, err)
		}
		if ef.Machine != elf.EM_X86_64 {
			return "", fmt.Errorf("guestfs: guest binary %s is for %s, the guest is x86-64", p, ef.Machine)
		}
		for _, prog := range ef.Progs {
			if prog.Type == elf.PT_INTERP {
				return "", fmt.Errorf("guestfs: guest binary %s is dynamically linked; the guest has no libc: build it with CGO_ENABLED=0", p)
			}
		}
	case bytes.HasPrefix(head, []byte("#!")):
	default:
		return "", fmt.Errorf("guestfs: guest binary %s is not an ELF program", p)
	}
	_, sum, err := sums.sum(p)
	if err != nil {
		return "", fmt.Errorf("guestfs: hashing the guest binary %s: %w", p, err)
	}
	return sum, nil
}

// lockDir takes an exclusive flock on <Dir>/.lock so two builders (two
// capsem processes booting at once) never build the same assets twice or
// prune what the other is writing. It polls so ctx can cancel the wait.
func lockDir(ctx context.Context, b *builder) (func(), error) {
	return lockFile(ctx, filepath.Join(b.opts.Dir, ".lock"), "the assets", b.progress)
}

// lockFile takes an exclusive flock on p, saying once through progress
// that it waits for another builder of what.
func lockFile(ctx context.Context, p, what string, progress func(string, ...any)) (func(), error) {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("guestfs: opening the lock %s: %w", p, err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("guestfs: locking %s: %w", p, err)
		}
		if !said {
			progress("waiting for another capsem process building %s…", what)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("guestfs: waiting for the lock %s: %w", p, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// fileSHA256 hashes a file.
func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeFileAtomic writes via a temporary file and rename, so readers see
// the old or the new content, never a torn one.
func writeFileAtomic(p string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), "."+filepath.Base(p)+".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), p)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}

// ErrNoAssets is Installed's error when no build exists for the guest
// binary.
var ErrNoAssets = errors.New("guestfs: no guest assets built for this guest binary")

// Installed returns the newest build in opts.Dir for opts.GuestBinary and
// module list, as it is: nothing is built, apt is not asked, and the files
// are not verified (Verify does that). It is for diagnosis: Ensure is what
// a VM boots from.
func Installed(opts Options) (*Assets, error) {
	b, err := newBuilder(opts)
	if err != nil {
		return nil, err
	}
	guest, err := checkGuestBinary(b.opts.GuestBinary, b.sums)
	if err != nil {
		return nil, err
	}
	best := b.newest(guest, func(*Assets) bool { return true })
	if best == nil {
		return nil, fmt.Errorf("%w in %s", ErrNoAssets, b.opts.Dir)
	}
	return best, nil
}
