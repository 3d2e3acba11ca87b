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
	"syscall"
	"time"
)

// BuilderVersion is part of the key of every kernel and initramfs
// artefact: bump it when a change here alters what ends up in them, so
// existing ones are rebuilt.
const BuilderVersion = "9"

// File names inside store entries.
const (
	FileVmlinux   = "vmlinux"
	FileVmlinuz   = "vmlinuz"
	FileInitramfs = "initramfs.cpio"
	FileManifest  = "manifest.json"
)

// Guest paths the personalities rely on (recipes/minimal.toml puts the
// guest binary and its links there).
const (
	GuestInit      = "/init"
	GuestMCPServer = "/usr/bin/capsem-mcp-server"
	GuestDoctor    = "/usr/bin/capsem-doctor"
	GuestCapsem    = "/usr/bin/capsem"
)

// Options configure Ensure, Build and Installed.
type Options struct {
	// Dir is the asset directory, $CAPSEM_HOME/assets in production.
	Dir string
	// GuestBinary is a CGO_ENABLED=0 capsem build: it becomes /init.
	GuestBinary string
	// Progress receives human-readable progress lines; nil discards them.
	Progress io.Writer
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// Minimal is the initramfs recipe; nil means the embedded
	// MinimalRecipe. Kernel is the kernel recipe it names; nil means the
	// embedded recipe of that name.
	Minimal *Recipe
	Kernel  *Recipe

	// host answers apt's questions and fetches and unpacks packages; nil
	// means debianBoot (tests fake it).
	host bootHost
}

// KernelInputs is everything a kernel artefact depends on; its hash is
// the key.
type KernelInputs struct {
	Builder      string `json:"builder"`
	Recipe       string `json:"recipe"`
	RecipeSHA256 string `json:"recipe_sha256"`
	// Package is the ABI kernel package the recipe's metapackage names,
	// at its exact version and .deb hash.
	Package   string `json:"package"`
	Version   string `json:"version"`
	DebSHA256 string `json:"deb_sha256"`
}

// Key is the hex sha256 of the inputs' JSON form.
func (in KernelInputs) Key() string { return inputsKey(in) }

// InitramfsInputs is everything a minimal root depends on; its hash is
// the key. The kernel enters by its artefact's key, so a changed guest
// binary rebuilds the initramfs alone.
type InitramfsInputs struct {
	Builder           string `json:"builder"`
	Recipe            string `json:"recipe"`
	RecipeSHA256      string `json:"recipe_sha256"`
	KernelKey         string `json:"kernel_key"`
	BusyboxPackage    string `json:"busybox_package"`
	BusyboxVersion    string `json:"busybox_version"`
	BusyboxDebSHA256  string `json:"busybox_deb_sha256"`
	GuestBinarySHA256 string `json:"guest_binary_sha256"`
}

// Key is the hex sha256 of the inputs' JSON form.
func (in InitramfsInputs) Key() string { return inputsKey(in) }

func inputsKey(in any) string {
	data, _ := json.Marshal(in)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func recipeSHA256(r *Recipe) string {
	sum := sha256.Sum256(r.Source)
	return hex.EncodeToString(sum[:])
}

// FileSum is one file's size and sha256.
type FileSum struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// KernelManifest describes a kernel artefact: vmlinuz, the vmlinux
// extracted from it, and the selected modules (plain, prepatched .ko at
// their guest paths under lib/modules).
type KernelManifest struct {
	EntryHeader
	Inputs KernelInputs `json:"inputs"`
	// Release is the kernel's uname -r, e.g. 6.1.0-48-amd64.
	Release string `json:"kernel_release"`
	// PVH is true when vmlinux carries the PVH entry note, so QEMU can
	// boot it with -kernel; otherwise the guest boots the bzImage.
	PVH bool `json:"pvh"`
	// ModuleChains are the modules' guest paths in load order, split into
	// groups that share no dependency.
	ModuleChains [][]string `json:"module_chains"`
	// ModuleDevices holds, by guest path, the device aliases a module is
	// loaded for; modules not in it always load.
	ModuleDevices map[string][]string `json:"module_devices,omitempty"`
	// BuiltIn are wanted modules the kernel has built in (nothing to load);
	// Absent are wanted modules it lacks altogether.
	BuiltIn []string `json:"built_in,omitempty"`
	Absent  []string `json:"absent,omitempty"`
}

// modules is every module's guest path in load order: the chains one after
// the other.
func (m *KernelManifest) modules() []string {
	var out []string
	for _, c := range m.ModuleChains {
		out = append(out, c...)
	}
	return out
}

// InitramfsManifest describes a minimal root: initramfs.cpio, built from
// the kernel artefact its Depends (and Inputs.KernelKey) names.
type InitramfsManifest struct {
	EntryHeader
	Inputs InitramfsInputs `json:"inputs"`
	// Release is the kernel release its modules are for.
	Release string `json:"kernel_release"`
	// Modules are the guest paths of the modules in load order, as in
	// /lib/modules/load-order.
	Modules []string `json:"modules"`
	// Applets counts busybox's links.
	Applets int `json:"applets"`
}

// Assets are what a VM boots: a minimal root and the kernel artefact it was
// built from, both in the store.
type Assets struct {
	// Dir is the minimal root's store entry, <Options.Dir>/store/<key24>.
	Dir string
	// KernelDir is the kernel artefact's store entry.
	KernelDir string
	// Kernel is what to pass to -kernel: the ELF vmlinux when it carries
	// the PVH note (much faster under TCG), else the bzImage.
	Kernel string
	// KernelCompressed is the bzImage (vmlinuz), always present.
	KernelCompressed string
	// Initramfs is the uncompressed newc initramfs.
	Initramfs string
	// KernelVersion is the kernel release (uname -r).
	KernelVersion string
	// PVH says Kernel is the vmlinux with the PVH entry.
	PVH bool
	// Modules are the guest paths of the initramfs's modules in load order.
	Modules []string
	// Files are the boot files (vmlinux, vmlinuz, initramfs.cpio) by name.
	Files map[string]FileSum
	// BootStateDir is where saved boots of these assets live
	// (<Options.Dir>/boot-states/<key24>), removed with the minimal root.
	BootStateDir string

	KernelManifest    KernelManifest
	InitramfsManifest InitramfsManifest
}

// assetDir is the asset directory the assets are in.
func (a *Assets) assetDir() string { return filepath.Dir(filepath.Dir(a.Dir)) }

// Verify re-hashes every file of both artefacts (the kernel's modules
// included) and fails on any missing or changed one. (Ensure verifies
// through the sum cache: a file whose identity has not changed since its
// last full hash is not read again.)
func (a *Assets) Verify() error { return a.verify(nil) }

func (a *Assets) verify(sums *sumCache) error {
	kerr := a.KernelManifest.verifyFiles(a.KernelDir, sums)
	ierr := a.InitramfsManifest.verifyFiles(a.Dir, sums)
	if err := errors.Join(kerr, ierr); err != nil {
		return fmt.Errorf("assets: %w", err)
	}
	return nil
}

// VerifyBootFiles re-hashes the files a boot hands to the VM (the kernel it
// boots and the initramfs, which holds the guest binary) against the
// manifests, reading every byte whatever the sum cache says. The per-VM
// process runs it while the VM boots and reports the VM ready only when it
// passed. A mismatch also drops both artefacts' entries from the sum
// cache, so the next Ensure hashes them again and rebuilds.
func (a *Assets) VerifyBootFiles() error {
	var errs []error
	for _, f := range []struct {
		path  string
		files map[string]FileSum
	}{{a.Kernel, a.KernelManifest.Files}, {a.Initramfs, a.InitramfsManifest.Files}} {
		want, ok := f.files[filepath.Base(f.path)]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: not in the manifest", filepath.Base(f.path)))
			continue
		}
		if err := verifyFile(f.path, want, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		sums := loadSumCache(a.assetDir())
		for dir, files := range map[string]map[string]FileSum{a.KernelDir: a.KernelManifest.Files, a.Dir: a.InitramfsManifest.Files} {
			for n := range files {
				sums.forget(filepath.Join(dir, filepath.FromSlash(n)))
			}
		}
		sums.save()
		return fmt.Errorf("assets in %s and %s: %w", a.Dir, a.KernelDir, err)
	}
	return nil
}

// ErrNoAssets is the error of Load and Installed when no minimal root (for
// the guest binary) is in the store.
var ErrNoAssets = errors.New("guestfs: no guest assets built for this guest binary")

// Load returns the assets refs/minimal names in the asset directory dir,
// without verifying the files (call Verify).
func Load(dir string) (*Assets, error) {
	key, err := readRef(dir, MinimalRecipe)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s", ErrNoAssets, dir)
	}
	if err != nil {
		return nil, err
	}
	return loadAssets(dir, key)
}

// loadAssets reads the minimal root of key in the store in dir and the
// kernel artefact it was built from.
func loadAssets(dir, minimalKey string) (*Assets, error) {
	a := &Assets{Dir: storePath(dir, minimalKey)}
	im := &a.InitramfsManifest
	if err := readManifest(a.Dir, KindInitramfs, im); err != nil {
		return nil, fmt.Errorf("guestfs: minimal root: %w", err)
	}
	if im.Key != minimalKey || !keyRE.MatchString(im.Inputs.KernelKey) {
		return nil, fmt.Errorf("guestfs: %s: the manifest names key %q and kernel %q", a.Dir, im.Key, im.Inputs.KernelKey)
	}
	a.KernelDir = storePath(dir, im.Inputs.KernelKey)
	km := &a.KernelManifest
	if err := readManifest(a.KernelDir, KindKernel, km); err != nil {
		return nil, fmt.Errorf("guestfs: the minimal root's kernel: %w", err)
	}
	if km.Key != im.Inputs.KernelKey {
		return nil, fmt.Errorf("guestfs: %s is not kernel %s", a.KernelDir, im.Inputs.KernelKey)
	}
	for _, need := range []struct {
		files map[string]FileSum
		name  string
	}{{km.Files, FileVmlinuz}, {im.Files, FileInitramfs}} {
		if _, ok := need.files[need.name]; !ok {
			return nil, fmt.Errorf("guestfs: the manifests of %s lack %s", a.Dir, need.name)
		}
	}
	a.KernelCompressed = filepath.Join(a.KernelDir, FileVmlinuz)
	a.Kernel = a.KernelCompressed
	if _, ok := km.Files[FileVmlinux]; ok && km.PVH {
		a.Kernel, a.PVH = filepath.Join(a.KernelDir, FileVmlinux), true
	}
	a.Initramfs = filepath.Join(a.Dir, FileInitramfs)
	a.KernelVersion = km.Release
	a.Modules = im.Modules
	a.Files = map[string]FileSum{FileInitramfs: im.Files[FileInitramfs]}
	for _, n := range []string{FileVmlinux, FileVmlinuz} {
		if f, ok := km.Files[n]; ok {
			a.Files[n] = f
		}
	}
	a.BootStateDir = filepath.Join(dir, bootStatesDir, minimalKey[:24])
	return a, nil
}

// Ensure returns verified assets for the current inputs, building only
// what the store lacks: a new kernel package in apt's lists or a changed
// kernel recipe builds the kernel artefact, and then (like a changed guest
// binary, busybox or minimal recipe) the minimal root. Files are checked
// against the manifests' sha256, re-read only when their identity changed
// since they were last hashed (see sumCache). refs/kernel and refs/minimal
// end up naming what it returns.
func Ensure(ctx context.Context, opts Options) (*Assets, error) {
	b, err := newBootBuilder(opts)
	if err != nil {
		return nil, err
	}
	defer b.s.saveSums()
	return b.run(ctx)
}

// Build builds the kernel artefact and the minimal root unconditionally
// (capsem image build --force), with a fresh apt lookup, replacing store
// entries of the same keys.
func Build(ctx context.Context, opts Options) (*Assets, error) {
	b, err := newBootBuilder(opts)
	if err != nil {
		return nil, err
	}
	b.force = true
	defer b.s.saveSums()
	return b.run(ctx)
}

// Installed returns the assets in opts.Dir for opts.GuestBinary as they
// are: refs/minimal's when that was built for this guest binary, else the
// newest minimal root in the store that was. Nothing is built, apt is not
// asked, and the files are not verified (Verify does that). It is for
// diagnosis: Ensure is what a VM boots from.
func Installed(opts Options) (*Assets, error) {
	b, err := newBootBuilder(opts)
	if err != nil {
		return nil, err
	}
	guest, err := checkGuestBinary(b.opts.GuestBinary, b.minimal.Arch, b.s.sums)
	if err != nil {
		return nil, err
	}
	b.guest = guest
	if a := b.newest(func(*Assets) bool { return true }); a != nil {
		return a, nil
	}
	return nil, fmt.Errorf("%w in %s", ErrNoAssets, b.s.dir)
}

// checkGuestBinary returns the binary's sha256 after checking it can be
// PID 1 of a guest of arch with no libc: a static ELF for that machine
// (or, for tests and debugging, a #! script).
func checkGuestBinary(p, arch string, sums *sumCache) (string, error) {
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
		if want := supportedArchs[arch]; ef.Machine != want {
			return "", fmt.Errorf("guestfs: guest binary %s is for %s, the guest is %s (%s)", p, ef.Machine, arch, want)
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

// lockFile takes an exclusive flock on p, saying once through progress
// (with waiting) that it waits for another process. It polls so ctx can
// cancel the wait.
func lockFile(ctx context.Context, p, waiting string, progress func(string, ...any)) (func(), error) {
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
			progress("%s", waiting)
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
