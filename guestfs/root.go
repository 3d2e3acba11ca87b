package guestfs

import (
	"context"
	"crypto/sha256"
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
	"strings"
	"time"
)

// RootBuilderVersion is part of every root image's cache key: bump it when
// a change in the builder alters what ends up in an image.
const RootBuilderVersion = "2"

// Files of a root image's store entry.
const (
	FileRootImage    = "root.erofs"
	FileRootManifest = "manifest.json"
)

// Layout under RootOptions.Dir.
const (
	rootStoreDir   = "store"
	rootRefsDir    = "refs"
	rootNPMDir     = "npm"
	rootLockFile   = ".root.lock"
	rootWorkPrefix = ".root-build-"
	// previousSuffix names the file beside a ref holding the key it named
	// before, kept by pruning so a VM started just before a rebuild can
	// still find its image.
	previousSuffix = ".previous"
)

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
func (in RootInputs) Key() string {
	data, _ := json.Marshal(in)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

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
	Recipe string     `json:"recipe"`
	Key    string     `json:"key"`
	Inputs RootInputs `json:"inputs"`
	NPM    []NPMPin   `json:"npm"`
	// Image is root.erofs's size and sha256.
	Image FileSum `json:"image"`
	// Mode is how mmdebstrap ran: unshare, or root when unshare failed.
	Mode         string      `json:"mmdebstrap_mode"`
	Steps        []RootStep  `json:"steps"`
	Checks       []RootCheck `json:"checks"`
	BuiltAt      time.Time   `json:"built_at"`
	BuildSeconds float64     `json:"build_seconds"`
}

// Root is one built root image in the store.
type Root struct {
	// Dir is the store entry, <Dir>/store/<first 24 hex of Key>.
	Dir string
	// Image is the EROFS image a VM mounts read-only.
	Image string
	RootManifest
}

var keyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// rootStorePath is the store entry for a key: 96 bits of it keep paths
// short and collisions out of reach.
func rootStorePath(dir, key string) string {
	return filepath.Join(dir, rootStoreDir, key[:24])
}

// LoadRoot reads a store entry's manifest, without verifying the image.
func LoadRoot(entry string) (*Root, error) {
	data, err := os.ReadFile(filepath.Join(entry, FileRootManifest))
	if err != nil {
		return nil, fmt.Errorf("reading the root image manifest: %w", err)
	}
	var m RootManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(entry, FileRootManifest), err)
	}
	if !keyRE.MatchString(m.Key) || filepath.Base(entry) != m.Key[:24] {
		return nil, fmt.Errorf("%s names key %q, not its directory's", filepath.Join(entry, FileRootManifest), m.Key)
	}
	return &Root{Dir: entry, Image: filepath.Join(entry, FileRootImage), RootManifest: m}, nil
}

// Verify re-hashes the image against the manifest.
func (r *Root) Verify() error { return r.verify(nil) }

func (r *Root) verify(sums *sumCache) error {
	if err := verifyFile(r.Image, r.RootManifest.Image, sums); err != nil {
		return fmt.Errorf("root image %s: %w", r.Dir, err)
	}
	return nil
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
	r, err := LoadRoot(rootStorePath(dir, key))
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
	// Root is the image the ref names, when its manifest is readable.
	Root *Root
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
	if key, err := readRef(b.dir, b.recipe.Name); err == nil {
		st.RefKey = key
		if r, err := LoadRoot(rootStorePath(b.dir, key)); err == nil {
			st.Root = r
		}
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
	b, err := newRootBuilder(opts)
	if err != nil {
		return nil, err
	}
	defer b.sums.save()
	in, err := b.inputs(ctx, false)
	if err != nil {
		return nil, err
	}
	if r, ok := b.cached(in.Key()); ok {
		if err := b.pointRef(ctx, r.Key); err != nil {
			return nil, err
		}
		return r, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(b.dir, rootLockFile), "the root image", b.progress)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if r, ok := b.cached(in.Key()); ok { // another builder finished meanwhile
		if err := b.setRef(r.Key); err != nil {
			return nil, err
		}
		return r, nil
	}
	return b.build(ctx, in)
}

// BuildRoot builds the recipe's image unconditionally (capsem image build
// --force), with a fresh apt lookup, replacing a store entry of the same key.
func BuildRoot(ctx context.Context, opts RootOptions) (*Root, error) {
	b, err := newRootBuilder(opts)
	if err != nil {
		return nil, err
	}
	defer b.sums.save()
	unlock, err := lockFile(ctx, filepath.Join(b.dir, rootLockFile), "the root image", b.progress)
	if err != nil {
		return nil, err
	}
	defer unlock()
	in, err := b.inputs(ctx, true)
	if err != nil {
		return nil, err
	}
	return b.build(ctx, in)
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
	dir    string
	recipe *Recipe
	log    *slog.Logger
	host   rootHost
	sums   *sumCache
	// updated: apt-get update already ran in this build.
	updated bool
	// manifest collects steps and checks while building.
	manifest RootManifest
}

func newRootBuilder(opts RootOptions) (*rootBuilder, error) {
	if opts.Dir == "" {
		return nil, errors.New("guestfs: RootOptions.Dir is empty")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("guestfs: asset directory: %w", err)
	}
	recipe := opts.Recipe
	if recipe == nil {
		if recipe, err = LoadRecipe(DefaultRecipe); err != nil {
			return nil, err
		}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	host := opts.host
	if host == nil {
		host = debianHost{}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: creating the asset directory: %w", err)
	}
	return &rootBuilder{
		opts: opts, dir: dir, recipe: recipe, host: host, sums: loadSumCache(dir),
		log: opts.Logger.With("component", "guestfs", "recipe", recipe.Name),
	}, nil
}

func (b *rootBuilder) progress(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	b.log.Info(msg)
	if b.opts.Progress != nil {
		fmt.Fprintln(b.opts.Progress, msg)
	}
}

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
	sum := sha256.Sum256(b.recipe.Source)
	return RootInputs{
		Builder:      RootBuilderVersion,
		Recipe:       b.recipe.Name,
		RecipeSHA256: hex.EncodeToString(sum[:]),
		Closure:      closure,
		Sources:      string(sources),
		Mmdebstrap:   mmdebstrap,
		MkfsErofs:    mkfs,
	}, nil
}

// cached returns the verified store entry for key, if there is one.
func (b *rootBuilder) cached(key string) (*Root, bool) {
	entry := rootStorePath(b.dir, key)
	r, err := LoadRoot(entry)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("unreadable root image manifest; rebuilding", "dir", entry, "err", err)
		}
		return nil, false
	}
	if r.Key != key || r.Inputs.Key() != key {
		b.log.Warn("root image manifest does not match its key; rebuilding", "dir", entry)
		return nil, false
	}
	if err := r.verify(b.sums); err != nil {
		b.log.Warn("cached root image failed verification; rebuilding", "err", err)
		b.sums.forget(r.Image)
		return nil, false
	}
	return r, true
}

// pointRef makes refs/<recipe> name key, taking the lock only when it
// has to change.
func (b *rootBuilder) pointRef(ctx context.Context, key string) error {
	if cur, err := readRef(b.dir, b.recipe.Name); err == nil && cur == key {
		return nil
	}
	unlock, err := lockFile(ctx, filepath.Join(b.dir, rootLockFile), "the root image", b.progress)
	if err != nil {
		return err
	}
	defer unlock()
	return b.setRef(key)
}

// setRef points the recipe's ref at key (under the lock), remembering the
// key it named before, then prunes the store.
func (b *rootBuilder) setRef(key string) error {
	if err := writeRef(b.dir, b.recipe.Name, key); err != nil {
		return err
	}
	pruneRootStore(b.dir, b.log)
	return nil
}

// build makes the image under the lock in a work directory under Dir,
// renames the finished entry into the store, and points the ref at it.
func (b *rootBuilder) build(ctx context.Context, in RootInputs) (*Root, error) {
	start := time.Now()
	b.progress("root image %s: building (key %s…, %d Debian packages, %d npm packages)", b.recipe.Name, in.Key()[:12], len(in.Closure), len(b.recipe.NPM))
	work, err := os.MkdirTemp(b.dir, rootWorkPrefix)
	if err != nil {
		return nil, fmt.Errorf("guestfs: creating a build directory: %w", err)
	}
	defer removeWorkDir(work, b.log)
	// apt inside mmdebstrap downloads as _apt when that user can reach
	// the tree (MkdirTemp makes it 0700), as root with a warning otherwise.
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.manifest = RootManifest{}
	in, err = b.host.makeImage(ctx, b, in, work, filepath.Join(out, FileRootImage))
	if err != nil {
		return nil, fmt.Errorf("guestfs: root image %s: %w", b.recipe.Name, err)
	}
	key := in.Key()
	m := b.manifest
	m.Recipe, m.Key, m.Inputs = b.recipe.Name, key, in
	for _, n := range b.recipe.NPM {
		m.NPM = append(m.NPM, NPMPin{Spec: n.Spec, Integrity: n.Integrity})
	}
	hashStart := time.Now()
	size, sha, err := b.sums.sum(filepath.Join(out, FileRootImage))
	if err != nil {
		return nil, fmt.Errorf("guestfs: hashing the root image: %w", err)
	}
	m.Image = FileSum{Size: size, SHA256: sha}
	m.BuiltAt = time.Now().UTC()
	m.BuildSeconds = roundSeconds(time.Since(start))
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("guestfs: encoding the root manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, FileRootManifest), append(data, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("guestfs: writing the root manifest: %w", err)
	}
	final := rootStorePath(b.dir, key)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: creating the root store: %w", err)
	}
	if err := publishDir(out, final, work); err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.sums.moved(filepath.Join(out, FileRootImage), filepath.Join(final, FileRootImage))
	b.log.Debug("hashed the root image", "seconds", time.Since(hashStart).Seconds())
	if err := b.setRef(key); err != nil {
		return nil, err
	}
	r, err := LoadRoot(final)
	if err != nil {
		return nil, fmt.Errorf("guestfs: %w", err)
	}
	b.progress("root image %s ready: %s (%s, %.1f s)", b.recipe.Name, r.Image, humanBytes(size), time.Since(start).Seconds())
	return r, nil
}

// readRef returns the key refs/<name> holds.
func readRef(dir, name string) (string, error) {
	if !recipeNameRE.MatchString(name) {
		return "", fmt.Errorf("guestfs: %q is not a recipe name", name)
	}
	data, err := os.ReadFile(filepath.Join(dir, rootRefsDir, name))
	if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(data))
	if !keyRE.MatchString(key) {
		return "", fmt.Errorf("guestfs: %s holds %q, not a root image key", filepath.Join(dir, rootRefsDir, name), key)
	}
	return key, nil
}

// writeRef points refs/<name> at key, each file replaced atomically
// (temp file and rename); the key it named before goes to
// refs/<name>.previous first, so pruning keeps both images.
func writeRef(dir, name, key string) error {
	refs := filepath.Join(dir, rootRefsDir)
	if err := os.MkdirAll(refs, 0o755); err != nil {
		return fmt.Errorf("guestfs: creating %s: %w", refs, err)
	}
	old, err := readRef(dir, name)
	if err == nil && old != key {
		if err := writeFileAtomic(filepath.Join(refs, name+previousSuffix), []byte(old+"\n"), 0o644); err != nil {
			return fmt.Errorf("guestfs: writing the previous ref: %w", err)
		}
	}
	if err := writeFileAtomic(filepath.Join(refs, name), []byte(key+"\n"), 0o644); err != nil {
		return fmt.Errorf("guestfs: writing the ref: %w", err)
	}
	return nil
}

// referencedKeys are the store entries (first 24 hex) some ref or
// previous ref names.
func referencedKeys(dir string) (map[string]bool, error) {
	keep := map[string]bool{}
	ents, err := os.ReadDir(filepath.Join(dir, rootRefsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return keep, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a temp file of writeFileAtomic
		}
		data, err := os.ReadFile(filepath.Join(dir, rootRefsDir, e.Name()))
		if err != nil {
			return nil, err
		}
		if key := strings.TrimSpace(string(data)); keyRE.MatchString(key) {
			keep[key[:24]] = true
		}
	}
	return keep, nil
}

var storeEntryRE = regexp.MustCompile(`^[0-9a-f]{24}$`)

// pruneRootStore removes store entries no ref or previous ref names, and
// work directories of interrupted builds. The caller holds the lock. When
// the refs cannot be read nothing is removed.
func pruneRootStore(dir string, log *slog.Logger) {
	keep, err := referencedKeys(dir)
	if err != nil {
		log.Warn("cannot read the root image refs; not pruning", "err", err)
		return
	}
	store := filepath.Join(dir, rootStoreDir)
	ents, _ := os.ReadDir(store)
	for _, e := range ents {
		if !storeEntryRE.MatchString(e.Name()) || keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(store, e.Name())); err == nil {
			log.Info("removed an unreferenced root image", "dir", filepath.Join(store, e.Name()))
		}
	}
	ents, _ = os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), rootWorkPrefix) {
			removeWorkDir(filepath.Join(dir, e.Name()), log)
		}
	}
}

// rootStoreEntries lists the store's entries, for tests and diagnosis.
func rootStoreEntries(dir string) []string {
	ents, _ := os.ReadDir(filepath.Join(dir, rootStoreDir))
	var out []string
	for _, e := range ents {
		if storeEntryRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}
