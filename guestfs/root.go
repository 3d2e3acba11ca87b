package guestfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

// RootBuilderVersion is part of every root image's key: bump it when a
// change in the builder alters what ends up in an image.
const RootBuilderVersion = "3"

// Files of a root image's store entry.
const (
	FileRootImage    = "root.erofs"
	FileRootManifest = FileManifest
)

// rootNPMDir holds the pinned npm tarballs, under the asset directory.
const rootNPMDir = "npm"

// RootOptions configure EnsureRoot and BuildRoot.
type RootOptions struct {
	// Dir is the asset directory, $CAPSEM_HOME/assets in production.
	Dir string
	// Recipe is what to build; nil means the embedded DefaultRecipe.
	Recipe *Recipe
	// Progress receives human-readable progress lines; nil discards them.
	Progress io.Writer
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger

	// host answers the builder's questions to the host and builds the
	// image; nil means debianHost (tests fake it).
	host rootHost
}

// RootInputs is everything a root image depends on; its hash is the key.
type RootInputs struct {
	Builder      string `json:"builder"`
	Recipe       string `json:"recipe"`
	RecipeSHA256 string `json:"recipe_sha256"`
	// Closure is every Debian package the image gets, name=version, sorted.
	Closure []string `json:"closure"`
	// Sources is the apt sources file (deb822) the image is built from and
	// keeps for its own apt.
	Sources    string `json:"sources"`
	Mmdebstrap string `json:"mmdebstrap"`
	MkfsErofs  string `json:"mkfs_erofs"`
}

// Key is the hex sha256 of the inputs' JSON form.
func (in RootInputs) Key() string { return inputsKey(in) }

// NPMPin is an npm tarball as the recipe pinned it.
type NPMPin struct {
	Spec      string `json:"spec"`
	Integrity string `json:"integrity"`
}

// RootStep is one build step and how long it took.
type RootStep struct {
	Name    string  `json:"name"`
	Detail  string  `json:"detail,omitempty"`
	Seconds float64 `json:"seconds"`
}

// RootCheck is one smoke check's command and output.
type RootCheck struct {
	Run     []string `json:"run"`
	Output  string   `json:"output"`
	Seconds float64  `json:"seconds"`
}

// RootManifest describes a root image (manifest.json beside it).
type RootManifest struct {
	EntryHeader
	Inputs RootInputs `json:"inputs"`
	NPM    []NPMPin   `json:"npm"`
	// Mode is how mmdebstrap ran: unshare, or root when unshare failed.
	Mode   string      `json:"mmdebstrap_mode"`
	Steps  []RootStep  `json:"steps"`
	Checks []RootCheck `json:"checks"`
}

// Root is one built root image in the store.
type Root struct {
	// Dir is the store entry, <Dir>/store/<first 24 hex of Key>.
	Dir string
	// Image is the EROFS image a VM mounts read-only.
	Image string
	RootManifest
}

// ImageSize is the size of the EROFS image.
func (r *Root) ImageSize() int64 { return r.Files[FileRootImage].Size }

// LoadRoot reads a store entry's manifest, without verifying the image.
func LoadRoot(entry string) (*Root, error) {
	r := &Root{Dir: entry, Image: filepath.Join(entry, FileRootImage)}
	if err := readManifest(entry, KindRoot, &r.RootManifest); err != nil {
		return nil, err
	}
	if _, ok := r.Files[FileRootImage]; !ok {
		return nil, fmt.Errorf("%s: the manifest lists no %s", entry, FileRootImage)
	}
	return r, nil
}

// Verify re-hashes the image against the manifest.
func (r *Root) Verify() error { return r.verify(nil) }

func (r *Root) verify(sums *sumCache) error {
	return r.verifyFiles(r.Dir, sums)
}

// ErrNoRoot is ResolveRoot's error when no image of that name was built.
var ErrNoRoot = errors.New("guestfs: no root image built")

// ResolveRoot returns the image refs/<name> names, verified (through the
// sum cache, so an unchanged image is not read again). It builds nothing
// and asks apt nothing: it is what a VM start uses.
func ResolveRoot(dir, name string) (*Root, error) {
	key, err := readRef(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w for recipe %q in %s (capsem image build makes it)", ErrNoRoot, name, dir)
	}
	if err != nil {
		return nil, err
	}
	r, err := LoadRoot(storePath(dir, key))
	if err != nil {
		return nil, fmt.Errorf("guestfs: root image %q: %w", name, err)
	}
	sums := loadSumCache(dir)
	defer sums.save()
	if err := r.verify(sums); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	return r, nil
}

// RootState is what RootStatus finds.
type RootState struct {
	Recipe string
	// RefKey is the key refs/<recipe> names; "" when none was built.
	RefKey string
	// Key is the key the recipe and the host's apt give now.
	Key string
	// Current is true when the ref names Key and its image is in the store.
	Current bool
	// Root is the image the ref names, when its manifest is readable;
	// RootErr says why it is not.
	Root    *Root
	RootErr error
}

// RootStatus reports, without building, whether recipe's image was built
// and whether it is current (the key recomputed from the recipe, the
// host's apt lists and tools). It neither fetches nor writes anything but
// its memo of apt's answers. When the key cannot be recomputed (a tool
// missing, apt failing) the error comes with what was found: the ref and
// its image.
func RootStatus(ctx context.Context, dir string, recipe *Recipe) (*RootState, error) {
	return rootStatus(ctx, RootOptions{Dir: dir, Recipe: recipe, Logger: slog.New(slog.DiscardHandler)})
}

func rootStatus(ctx context.Context, opts RootOptions) (*RootState, error) {
	b, err := newRootBuilder(opts)
	if err != nil {
		return nil, err
	}
	st := &RootState{Recipe: b.recipe.Name}
	if key, err := readRef(b.s.dir, b.recipe.Name); err == nil {
		st.RefKey = key
		st.Root, st.RootErr = LoadRoot(storePath(b.s.dir, key))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return st, err
	}
	in, err := b.inputs(ctx, false)
	if err != nil {
		return st, err
	}
	st.Key = in.Key()
	st.Current = st.RefKey == st.Key && st.Root != nil
	return st, nil
}

// EnsureRoot returns the recipe's image for the current inputs, building it
// only when the store has none (a changed recipe, new Debian packages in
// apt's lists, new tools or builder, or an image that fails verification),
// and points refs/<recipe> at it.
func EnsureRoot(ctx context.Context, opts RootOptions) (*Root, error) {
	return ensureRoot(ctx, opts, false)
}

// BuildRoot builds the recipe's image unconditionally (capsem image build
// --force), with a fresh apt lookup, replacing a store entry of the same key.
func BuildRoot(ctx context.Context, opts RootOptions) (*Root, error) {
	return ensureRoot(ctx, opts, true)
}

func ensureRoot(ctx context.Context, opts RootOptions, force bool) (*Root, error) {
	b, err := newRootBuilder(opts)
	if err != nil {
		return nil, err
	}
	defer b.s.saveSums()
	in, err := b.inputs(ctx, force)
	if err != nil {
		return nil, err
	}
	return ensureEntry(ctx, b.s, b.recipe.Name, in.Key(), force,
		func(key string) (*Root, bool) {
			r := &Root{Dir: storePath(b.s.dir, key), Image: filepath.Join(storePath(b.s.dir, key), FileRootImage)}
			if !b.s.cached(KindRoot, key, &r.RootManifest, func() string { return r.Inputs.Key() }) {
				b.s.sums.forget(r.Image)
				return nil, false
			}
			return r, true
		},
		func() (*Root, error) { return b.build(ctx, in) })
}

// rootHost is what the builder asks of the host: tool versions, apt's
// answers, and the build itself.
type rootHost interface {
	// toolVersions are mmdebstrap's and mkfs.erofs's version lines.
	toolVersions(ctx context.Context, b *rootBuilder) (mmdebstrap, mkfs string, err error)
	// sources is the deb822 apt sources of the Debian archive for suite.
	sources(suite string) ([]byte, error)
	// closure is the sorted name=version packages the recipe installs.
	closure(ctx context.Context, b *rootBuilder, fresh bool) ([]string, error)
	// makeImage builds the image at out from in and the recipe. It may
	// return changed inputs (apt's lists were stale and got refreshed).
	makeImage(ctx context.Context, b *rootBuilder, in RootInputs, work, out string) (RootInputs, error)
}

type rootBuilder struct {
	opts   RootOptions
	s      *store
	recipe *Recipe
	log    *slog.Logger
	host   rootHost
	// updated: apt-get update already ran in this build.
	updated bool
	// manifest collects steps and checks while building.
	manifest RootManifest
}

// hostArch is the Debian architecture of this host: a root image is
// built for it alone (mmdebstrap runs the image's programs here).
func hostArch() string {
	if runtime.GOARCH == "386" {
		return "i386"
	}
	return runtime.GOARCH
}

func newRootBuilder(opts RootOptions) (*rootBuilder, error) {
	recipe := opts.Recipe
	var err error
	if recipe == nil {
		if recipe, err = LoadRecipe(DefaultRecipe); err != nil {
			return nil, err
		}
	}
	if err := recipe.mustBe(KindRoot); err != nil {
		return nil, err
	}
	if recipe.Arch != hostArch() {
		return nil, fmt.Errorf("guestfs: %s: arch: a %s root image cannot be built on this %s host", recipe.File, recipe.Arch, hostArch())
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	host := opts.host
	if host == nil {
		host = debianHost{}
	}
	log := opts.Logger.With("component", "guestfs", "recipe", recipe.Name)
	s, err := openStore(opts.Dir, log, opts.Progress)
	if err != nil {
		return nil, err
	}
	return &rootBuilder{opts: opts, s: s, recipe: recipe, host: host, log: log}, nil
}

func (b *rootBuilder) progress(format string, args ...any) { b.s.progress(format, args...) }

// step records a finished build step and reports it with its time.
func (b *rootBuilder) step(name string, start time.Time, detail string) {
	s := RootStep{Name: name, Detail: detail, Seconds: roundSeconds(time.Since(start))}
	b.manifest.Steps = append(b.manifest.Steps, s)
	if detail != "" {
		detail = ": " + detail
	}
	b.progress("root image %s: %s%s (%.1f s)", b.recipe.Name, name, detail, s.Seconds)
}

func roundSeconds(d time.Duration) float64 {
	return float64(d.Round(10*time.Millisecond)) / float64(time.Second)
}

// inputs gathers the cache key's inputs: no network, and no subprocess
// when the memo answers.
func (b *rootBuilder) inputs(ctx context.Context, fresh bool) (RootInputs, error) {
	mmdebstrap, mkfs, err := b.host.toolVersions(ctx, b)
	if err != nil {
		return RootInputs{}, fmt.Errorf("guestfs: root image tools: %w", err)
	}
	sources, err := b.host.sources(b.recipe.Suite)
	if err != nil {
		return RootInputs{}, fmt.Errorf("guestfs: root image %s: %w", b.recipe.Name, err)
	}
	closure, err := b.host.closure(ctx, b, fresh)
	if err != nil {
		return RootInputs{}, fmt.Errorf("guestfs: root image %s: resolving the Debian packages: %w", b.recipe.Name, err)
	}
	return RootInputs{
		Builder:      RootBuilderVersion,
		Recipe:       b.recipe.Name,
		RecipeSHA256: recipeSHA256(b.recipe),
		Closure:      closure,
		Sources:      string(sources),
		Mmdebstrap:   mmdebstrap,
		MkfsErofs:    mkfs,
	}, nil
}

// build makes the image under the recipe's build lock in a work
// directory beside the store, then publishes it and points the ref at it.
func (b *rootBuilder) build(ctx context.Context, in RootInputs) (*Root, error) {
	start := time.Now()
	b.progress("root image %s: building (key %s…, %d Debian packages, %d npm packages)", b.recipe.Name, in.Key()[:12], len(in.Closure), len(b.recipe.NPM))
	work, err := b.s.workDir(b.recipe.Name)
	if err != nil {
		return nil, err
	}
	defer removeWorkDir(work, b.log)
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.manifest = RootManifest{}
	in, err = b.host.makeImage(ctx, b, in, work, filepath.Join(out, FileRootImage))
	if err != nil {
		return nil, fmt.Errorf("guestfs: root image %s: %w", b.recipe.Name, err)
	}
	m := b.manifest
	m.Kind, m.Recipe, m.Key, m.Inputs = KindRoot, b.recipe.Name, in.Key(), in
	for _, n := range b.recipe.NPM {
		m.NPM = append(m.NPM, NPMPin{Spec: n.Spec, Integrity: n.Integrity})
	}
	hashStart := time.Now()
	size, sha, err := b.s.sums.sum(filepath.Join(out, FileRootImage))
	if err != nil {
		return nil, fmt.Errorf("guestfs: hashing the root image: %w", err)
	}
	b.log.Debug("hashed the root image", "seconds", time.Since(hashStart).Seconds())
	m.Files = map[string]FileSum{FileRootImage: {Size: size, SHA256: sha}}
	m.BuiltAt = time.Now().UTC()
	m.BuildSeconds = roundSeconds(time.Since(start))
	if err := writeManifest(out, &m); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	final, err := b.s.publish(ctx, &m.EntryHeader, out, work)
	if err != nil {
		return nil, err
	}
	r, err := LoadRoot(final)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.progress("root image %s ready: %s (%s, %.1f s)", b.recipe.Name, r.Image, humanBytes(size), time.Since(start).Seconds())
	return r, nil
}
