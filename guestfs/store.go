package guestfs

import (
	"context"
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

// The store holds every artefact a recipe makes, whatever its kind, in one
// layout under the asset directory:
//
//	store/<key24>/          one artefact: its files and manifest.json, never changed in place
//	refs/<recipe>           the key of the recipe's current artefact
//	refs/<recipe>.previous  the key it named before
//	pins/<holder>           store entries in use outside the store (pins.go)
//
// A build happens in a work directory beside the store, under the
// recipe's build lock; the finished directory is renamed into the store
// and the ref replaced by rename, both under the store lock, which also
// covers pruning, so pruning never sees an entry published but not yet
// named. Pruning keeps what a ref, a previous ref or a pin (pins.go: the
// root images VMs and images use) names and whatever those were built from
// (a minimal root's kernel), and removes the rest.

// Layout under the asset directory.
const (
	storeDir       = "store"
	refsDir        = "refs"
	locksDir       = "locks"
	storeLockFile  = ".store.lock"
	bootStatesDir  = "boot-states"
	workPrefix     = ".work-"
	previousSuffix = ".previous"
)

// EntryHeader is what every store entry's manifest says of itself,
// whatever its kind.
type EntryHeader struct {
	Kind   string `json:"kind"`
	Recipe string `json:"recipe"`
	Key    string `json:"key"`
	// Depends are the keys of the entries this one was built from (a
	// minimal root's kernel): pruning keeps them while it keeps this one.
	Depends []string `json:"depends,omitempty"`
	// Files are the entry's files by slash-separated path relative to
	// it: size and sha256, checked by every verification.
	Files        map[string]FileSum `json:"files"`
	BuiltAt      time.Time          `json:"built_at"`
	BuildSeconds float64            `json:"build_seconds"`
}

func (h *EntryHeader) header() *EntryHeader { return h }

// Size is the sum of the entry's file sizes.
func (h *EntryHeader) Size() int64 {
	var n int64
	for _, f := range h.Files {
		n += f.Size
	}
	return n
}

// manifest is any kind's manifest: each embeds an EntryHeader.
type manifest interface{ header() *EntryHeader }

var (
	keyRE        = regexp.MustCompile(`^[0-9a-f]{64}$`)
	storeEntryRE = regexp.MustCompile(`^[0-9a-f]{24}$`)
)

// storePath is the store entry of a key: 96 bits of it keep paths short
// and collisions out of reach.
func storePath(dir, key string) string {
	return filepath.Join(dir, storeDir, key[:24])
}

// ErrOlderBuilder marks a store entry written by a capsem from before the
// one store: out of date rather than damaged.
var ErrOlderBuilder = errors.New("an older capsem wrote it")

// readManifest reads entry's manifest.json into m and checks that it names
// the entry's own key and, unless kind is "", is of that kind.
func readManifest(entry, kind string, m manifest) error {
	file := filepath.Join(entry, FileManifest)
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading the manifest: %w", err)
	}
	if err := json.Unmarshal(data, m); err != nil {
		return fmt.Errorf("parsing %s: %w", file, err)
	}
	h := m.header()
	if !keyRE.MatchString(h.Key) || filepath.Base(entry) != h.Key[:24] {
		return fmt.Errorf("%s names key %q, not its directory's", file, h.Key)
	}
	switch {
	case h.Kind == "":
		return fmt.Errorf("%s names no kind: %w (capsem image build replaces it)", file, ErrOlderBuilder)
	case kind == "" || h.Kind == kind:
	default:
		return fmt.Errorf("%s is a %s, not a %s", file, h.Kind, kind)
	}
	return nil
}

// verifyFiles checks every file the header lists in entry; sums, when not
// nil, answers for files unchanged since they were last hashed.
func (h *EntryHeader) verifyFiles(entry string, sums *sumCache) error {
	if len(h.Files) == 0 {
		return fmt.Errorf("%s: the manifest lists no files", entry)
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range h.Files {
			if !yield(n) {
				return
			}
		}
	})
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, n := range names {
		if !validEntryFile(n) {
			errs[i] = fmt.Errorf("the manifest names an invalid file %q", n)
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = verifyFile(filepath.Join(entry, filepath.FromSlash(n)), h.Files[n], sums)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s in %s: %w", h.Kind, h.Recipe, entry, err)
	}
	return nil
}

// validEntryFile accepts a clean relative slash path inside the entry,
// other than the manifest and hidden names.
func validEntryFile(n string) bool {
	return n != "" && fs.ValidPath(n) && n != FileManifest && n != "." &&
		!slices.ContainsFunc(strings.Split(n, "/"), func(e string) bool { return strings.HasPrefix(e, ".") })
}

func verifyFile(p string, want FileSum, sums *sumCache) error {
	size, got, err := sums.sum(p)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(p), err)
	}
	if size != want.Size {
		sums.forget(p)
		return fmt.Errorf("%s: size %d, manifest says %d", filepath.Base(p), size, want.Size)
	}
	if got != want.SHA256 {
		sums.forget(p)
		return fmt.Errorf("%s: sha256 %s, manifest says %s (modified or corrupt)", filepath.Base(p), got, want.SHA256)
	}
	return nil
}

// writeManifest writes m as entry's manifest.json.
func writeManifest(dir string, m manifest) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileManifest), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the manifest: %w", err)
	}
	return nil
}

// store is the asset directory as builders use it.
type store struct {
	dir      string
	log      *slog.Logger
	out      io.Writer // progress lines; nil discards them
	sums     *sumCache // sha256 of files unchanged since hashed
	saveOnce sync.Once
}

func openStore(dir string, log *slog.Logger, progress io.Writer) (*store, error) {
	if dir == "" {
		return nil, errors.New("guestfs: the asset directory is empty")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("guestfs: asset directory: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: creating the asset directory: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &store{dir: abs, log: log, out: progress, sums: loadSumCache(abs)}, nil
}

func (s *store) progress(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Info(msg)
	if s.out != nil {
		fmt.Fprintln(s.out, msg)
	}
}

// saveSums keeps the sums hashed in this run for the next one.
func (s *store) saveSums() {
	if err := s.sums.save(); err != nil {
		s.log.Debug("saving the asset sum cache", "err", err)
	}
}

// lockBuild takes recipe name's build lock, so two processes never build
// one recipe at once, then removes the work directories its interrupted
// builds left (none is live while the lock is held).
func (s *store) lockBuild(ctx context.Context, name string) (func(), error) {
	if err := os.MkdirAll(filepath.Join(s.dir, locksDir), 0o755); err != nil {
		return nil, fmt.Errorf("guestfs: creating the lock directory: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(s.dir, locksDir, name+".lock"),
		"waiting for another capsem process building "+name+"…", s.progress)
	if err != nil {
		return nil, err
	}
	left, _ := filepath.Glob(filepath.Join(s.dir, workPrefix+name+"-*"))
	for _, w := range left {
		if isWorkDirOf(filepath.Base(w), name) {
			removeWorkDir(w, s.log)
		}
	}
	return unlock, nil
}

// isWorkDirOf says whether base is a work directory of recipe name:
// .work-<name>-<digits>, as workDir makes them, and not one of a recipe
// whose name only starts with name and a dash (full and full-dev).
func isWorkDirOf(base, name string) bool {
	rest, ok := strings.CutPrefix(base, workPrefix+name+"-")
	return ok && rest != "" && strings.Trim(rest, "0123456789") == ""
}

// lockStore takes the store lock: held briefly, to publish, move a ref or
// prune.
func (s *store) lockStore(ctx context.Context) (func(), error) {
	return lockFile(ctx, filepath.Join(s.dir, storeLockFile), "waiting for another capsem process updating the store…", s.progress)
}

// workDir makes a work directory for a build of recipe name (under its
// build lock), 0755 so that tools dropping privileges can reach it.
func (s *store) workDir(name string) (string, error) {
	work, err := os.MkdirTemp(s.dir, workPrefix+name+"-")
	if err != nil {
		return "", fmt.Errorf("guestfs: creating a build directory: %w", err)
	}
	if err := os.Chmod(work, 0o755); err != nil {
		os.RemoveAll(work)
		return "", fmt.Errorf("guestfs: %w", err)
	}
	return work, nil
}

// errEntryGone says a cached entry was pruned before its ref could name it.
var errEntryGone = errors.New("the store entry is gone")

// pointRef makes refs/<name> name key, an entry already in the store,
// taking the store lock only when the ref has to change. It fails with
// errEntryGone when the entry was pruned meanwhile (build it again).
func (s *store) pointRef(ctx context.Context, name, key string) error {
	if cur, err := readRef(s.dir, name); err == nil && cur == key {
		return nil
	}
	unlock, err := s.lockStore(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(storePath(s.dir, key), FileManifest)); err != nil {
		return fmt.Errorf("guestfs: %s %s: %w", name, key[:12], errEntryGone)
	}
	if err := writeRef(s.dir, name, key); err != nil {
		return err
	}
	pruneStore(s.dir, s.log)
	return nil
}

// publish renames a finished build (out, inside work, with manifest h
// written) into the store, replacing an entry of the same key, and points
// the recipe's ref at it, then prunes: all under the store lock. It
// returns the entry's path.
func (s *store) publish(ctx context.Context, h *EntryHeader, out, work string) (string, error) {
	unlock, err := s.lockStore(ctx)
	if err != nil {
		return "", err
	}
	defer unlock()
	final := storePath(s.dir, h.Key)
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return "", fmt.Errorf("guestfs: creating the store: %w", err)
	}
	if err := publishDir(out, final, work); err != nil {
		return "", fmt.Errorf("guestfs: %w", err)
	}
	for n := range h.Files {
		rel := filepath.FromSlash(n)
		s.sums.moved(filepath.Join(out, rel), filepath.Join(final, rel))
	}
	if err := writeRef(s.dir, h.Recipe, h.Key); err != nil {
		return "", err
	}
	pruneStore(s.dir, s.log)
	return final, nil
}

// publishDir renames the finished build into place. An entry already there
// (a forced rebuild) is moved aside into work first, then removed with it.
func publishDir(out, final, work string) error {
	err := os.Rename(out, final)
	if err == nil {
		return nil
	}
	if !errors.Is(err, os.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("publishing %s: %w", filepath.Base(final), err)
	}
	if err := os.Rename(final, filepath.Join(work, "previous")); err != nil {
		return fmt.Errorf("replacing %s: %w", filepath.Base(final), err)
	}
	if err := os.Rename(out, final); err != nil {
		return fmt.Errorf("publishing %s: %w", filepath.Base(final), err)
	}
	return nil
}

// readRef returns the key refs/<name> holds.
func readRef(dir, name string) (string, error) {
	if !recipeNameRE.MatchString(name) {
		return "", fmt.Errorf("guestfs: %q is not a recipe name", name)
	}
	data, err := os.ReadFile(filepath.Join(dir, refsDir, name))
	if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(data))
	if !keyRE.MatchString(key) {
		return "", fmt.Errorf("guestfs: %s holds %q, not a store key", filepath.Join(dir, refsDir, name), key)
	}
	return key, nil
}

// writeRef points refs/<name> at key, each file replaced atomically
// (temp file and rename); the key it named before goes to
// refs/<name>.previous first, so pruning keeps both entries.
func writeRef(dir, name, key string) error {
	refs := filepath.Join(dir, refsDir)
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

// keptEntries are the store entries (first 24 hex) some ref, previous ref
// or pin names, with what those depend on. It fails when a ref or a pin
// cannot be read, or a kept entry's manifest (naming its dependencies) is
// there but unreadable: then nothing may be pruned.
func keptEntries(dir string) (map[string]bool, error) {
	keep := map[string]bool{}
	ents, err := os.ReadDir(filepath.Join(dir, refsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var queue []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a temp file of writeFileAtomic
		}
		data, err := os.ReadFile(filepath.Join(dir, refsDir, e.Name()))
		if err != nil {
			return nil, err
		}
		if key := strings.TrimSpace(string(data)); keyRE.MatchString(key) {
			queue = append(queue, key)
		}
	}
	pinned, err := pinnedEntries(dir)
	if err != nil {
		return nil, err
	}
	queue = append(queue, pinned...)
	for len(queue) > 0 {
		key := queue[0]
		queue = queue[1:]
		if keep[key[:24]] {
			continue
		}
		keep[key[:24]] = true
		var h EntryHeader
		err := readManifest(storePath(dir, key), "", &h)
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, ErrOlderBuilder):
			continue // nothing to keep for it, or no dependencies to name
		case err != nil:
			return nil, err
		}
		for _, d := range h.Depends {
			if keyRE.MatchString(d) {
				queue = append(queue, d)
			}
		}
	}
	return keep, nil
}

// legacyBuildRE names the asset directories of the layout before the
// store (<hash24>/ holding vmlinux, vmlinuz and initramfs.cpio).
var legacyBuildRE = storeEntryRE

// legacyWorkAge is how old a work directory of the layout before the store
// must be before pruning removes it (an older capsem may be building).
const legacyWorkAge = time.Hour

// pruneStore removes store entries nothing keeps (see keptEntries), the
// saved boots of removed entries, and what the layout before the store
// left: its asset directories, its kernel stage cache and its work
// directories. The caller holds the store lock. When the refs cannot be
// read nothing is removed.
func pruneStore(dir string, log *slog.Logger) {
	keep, err := keptEntries(dir)
	if err != nil {
		log.Warn("cannot read the store's refs; not pruning", "err", err)
		return
	}
	store := filepath.Join(dir, storeDir)
	ents, _ := os.ReadDir(store)
	for _, e := range ents {
		if !storeEntryRE.MatchString(e.Name()) || keep[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(store, e.Name())); err == nil {
			log.Info("removed an unreferenced store entry", "dir", filepath.Join(store, e.Name()))
		}
	}
	states := filepath.Join(dir, bootStatesDir)
	ents, _ = os.ReadDir(states)
	for _, e := range ents {
		if !storeEntryRE.MatchString(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(store, e.Name())); errors.Is(err, fs.ErrNotExist) {
			_ = os.RemoveAll(filepath.Join(states, e.Name()))
		}
	}
	ents, _ = os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		switch {
		case !e.IsDir():
		case legacyBuildRE.MatchString(e.Name()), e.Name() == "kernels":
			if err := os.RemoveAll(p); err == nil {
				log.Info("removed assets of the layout before the store", "dir", p)
			}
		case strings.HasPrefix(e.Name(), ".build-"), strings.HasPrefix(e.Name(), ".root-build-"):
			if st, err := os.Stat(p); err == nil && time.Since(st.ModTime()) > legacyWorkAge {
				removeWorkDir(p, log)
			}
		}
	}
}

// storeEntries lists the store's entries (first 24 hex), sorted.
func storeEntries(dir string) []string {
	ents, _ := os.ReadDir(filepath.Join(dir, storeDir))
	var out []string
	for _, e := range ents {
		if storeEntryRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}

// StoreRef is one named reference of the store and what it names.
type StoreRef struct {
	// Name is the recipe's name.
	Name string
	// Key is the key the ref holds; Previous the one before ("" if none).
	Key, Previous string
	// Dir is the store entry Key names.
	Dir string
	// Entry is its manifest's header; nil when the entry is missing or
	// unreadable, and Err says which.
	Entry *EntryHeader
	Err   error
}

// StoreRefs reads every ref of the store in dir and the header of the
// entry each names, sorted by name, without verifying any file.
func StoreRefs(dir string) ([]StoreRef, error) {
	ents, err := os.ReadDir(filepath.Join(dir, refsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("guestfs: reading the refs: %w", err)
	}
	var out []StoreRef
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || strings.HasSuffix(name, previousSuffix) {
			continue
		}
		ref := StoreRef{Name: name}
		ref.Key, ref.Err = readRef(dir, name)
		if ref.Err != nil {
			out = append(out, ref)
			continue
		}
		if prev, err := os.ReadFile(filepath.Join(dir, refsDir, name+previousSuffix)); err == nil {
			ref.Previous = strings.TrimSpace(string(prev))
		}
		ref.Dir = storePath(dir, ref.Key)
		var h EntryHeader
		if err := readManifest(ref.Dir, "", &h); err != nil {
			ref.Err = err
		} else {
			ref.Entry = &h
		}
		out = append(out, ref)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
