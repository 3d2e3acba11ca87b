package guestfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeHost stands in for mmdebstrap, apt and mkfs.erofs: its answers are
// fields, and its "image" is a few bytes naming the inputs.
type fakeHost struct {
	mu         sync.Mutex
	mmdebstrap string
	mkfs       string
	srcs       string
	closures   []string // closure answered; changed by tests
	builds     int
	fail       error
	// buildGate, when set, is waited on inside makeImage.
	buildGate chan struct{}
}

func newFakeHost() *fakeHost {
	return &fakeHost{mmdebstrap: "mmdebstrap 1.3.5", mkfs: "mkfs.erofs 1.5", srcs: "Types: deb\n", closures: []string{"apt=2.6.1", "bash=5.2"}}
}

func (h *fakeHost) toolVersions(context.Context, *rootBuilder) (string, string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mmdebstrap, h.mkfs, nil
}

func (h *fakeHost) sources(string) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return []byte(h.srcs), nil
}

func (h *fakeHost) closure(context.Context, *rootBuilder, bool) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.closures), nil
}

func (h *fakeHost) makeImage(_ context.Context, b *rootBuilder, in RootInputs, work, out string) (RootInputs, error) {
	h.mu.Lock()
	h.builds++
	gate, fail := h.buildGate, h.fail
	h.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if fail != nil {
		return in, fail
	}
	// Something in the work directory, as a real build leaves a tree.
	if err := os.WriteFile(filepath.Join(work, "tree-file"), []byte("x"), 0o644); err != nil {
		return in, err
	}
	b.step("fake", time.Now(), "")
	b.manifest.Checks = append(b.manifest.Checks, RootCheck{Run: []string{"true"}, Output: "ok"})
	return in, os.WriteFile(out, []byte("erofs image for "+in.Key()), 0o644)
}

func (h *fakeHost) buildCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.builds
}

func testRecipe(t testing.TB, name, extra string) *Recipe {
	t.Helper()
	src := strings.Replace(tinyRootRecipe, `name = "tiny"`, fmt.Sprintf("name = %q", name), 1) + extra
	r, err := ParseRecipe(name+".toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func fakeOpts(t testing.TB, dir string, h *fakeHost, r *Recipe) RootOptions {
	return RootOptions{Dir: dir, Recipe: r, host: h, Logger: slog.New(slog.DiscardHandler)}
}

func TestRootInputsKey(t *testing.T) {
	base := RootInputs{Builder: "1", Recipe: "full", RecipeSHA256: "aa", Closure: []string{"a=1", "b=2"}, Sources: "s", Mmdebstrap: "m 1", MkfsErofs: "k 1"}
	if base.Key() != base.Key() || !keyRE.MatchString(base.Key()) {
		t.Fatal("the key is not a stable sha256")
	}
	same := base
	same.Closure = []string{"a=1", "b=2"}
	if same.Key() != base.Key() {
		t.Fatal("equal inputs give different keys")
	}
	changes := map[string]func(*RootInputs){
		"builder":     func(in *RootInputs) { in.Builder = "2" },
		"recipe name": func(in *RootInputs) { in.Recipe = "other" },
		"recipe file": func(in *RootInputs) { in.RecipeSHA256 = "ab" },
		"a package":   func(in *RootInputs) { in.Closure = []string{"a=1", "b=3"} },
		"one more":    func(in *RootInputs) { in.Closure = []string{"a=1", "b=2", "c=1"} },
		"sources":     func(in *RootInputs) { in.Sources = "t" },
		"mmdebstrap":  func(in *RootInputs) { in.Mmdebstrap = "m 2" },
		"mkfs.erofs":  func(in *RootInputs) { in.MkfsErofs = "k 2" },
	}
	for name, change := range changes {
		in := base
		in.Closure = slices.Clone(base.Closure)
		change(&in)
		if in.Key() == base.Key() {
			t.Errorf("changing the %s keeps the key", name)
		}
	}
}

// TestRootKeyFromInputs: the builder's key follows the recipe's bytes and
// every host answer, and nothing else.
func TestRootKeyFromInputs(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost()
	keyOf := func(r *Recipe) string {
		b, err := newRootBuilder(fakeOpts(t, dir, h, r))
		if err != nil {
			t.Fatal(err)
		}
		in, err := b.inputs(context.Background(), false)
		if err != nil {
			t.Fatal(err)
		}
		return in.Key()
	}
	r := testRecipe(t, "tiny", "")
	k := keyOf(r)
	if keyOf(testRecipe(t, "tiny", "")) != k {
		t.Fatal("the same recipe and host give another key")
	}
	if keyOf(testRecipe(t, "tiny", "\n# a comment is a change too\n")) == k {
		t.Fatal("a changed recipe file keeps the key")
	}
	for name, change := range map[string]func(){
		"closure":    func() { h.closures = []string{"apt=2.6.2", "bash=5.2"} },
		"sources":    func() { h.srcs = "Types: deb\nURIs: x\n" },
		"mmdebstrap": func() { h.mmdebstrap = "mmdebstrap 1.4" },
		"mkfs":       func() { h.mkfs = "mkfs.erofs 1.6" },
	} {
		saved := newFakeHost()
		change()
		if keyOf(r) == k {
			t.Errorf("a changed %s keeps the key", name)
		}
		h.mmdebstrap, h.mkfs, h.srcs, h.closures = saved.mmdebstrap, saved.mkfs, saved.srcs, saved.closures
		if keyOf(r) != k {
			t.Fatalf("restoring the %s does not restore the key", name)
		}
	}
}

func readRefFile(t testing.TB, dir, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "refs", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func TestEnsureRootBuildsOnceAndRefs(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost()
	r := testRecipe(t, "tiny", "")
	ctx := context.Background()
	var progress bytes.Buffer
	opts := fakeOpts(t, dir, h, r)
	opts.Progress = &progress
	root, err := EnsureRoot(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if h.buildCount() != 1 {
		t.Fatalf("%d builds", h.buildCount())
	}
	if root.Image != filepath.Join(dir, "store", root.Key[:24], "root.erofs") || root.Recipe != "tiny" {
		t.Fatalf("root %+v", root)
	}
	if got := readRefFile(t, dir, "tiny"); got != root.Key {
		t.Fatalf("ref holds %q, want %s", got, root.Key)
	}
	if root.ImageSize() == 0 || len(root.NPM) != 1 || root.NPM[0].Integrity != r.NPM[0].Integrity || len(root.Checks) != 1 || len(root.Steps) != 1 {
		t.Fatalf("manifest %+v", root.RootManifest)
	}
	if !strings.Contains(progress.String(), "root image tiny: fake") || !strings.Contains(progress.String(), "root image tiny ready") {
		t.Fatalf("progress:\n%s", progress.String())
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".work-*")); len(ents) != 0 {
		t.Fatalf("work directories left: %v", ents)
	}

	again, err := EnsureRoot(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if h.buildCount() != 1 || again.Key != root.Key || !again.BuiltAt.Equal(root.BuiltAt) {
		t.Fatal("a second EnsureRoot with unchanged inputs built again")
	}
	resolved, err := ResolveRoot(dir, "tiny")
	if err != nil || resolved.Image != root.Image {
		t.Fatalf("ResolveRoot = %+v, %v", resolved, err)
	}
	st, err := rootStatusWith(ctx, dir, r, h)
	if err != nil || !st.Current || st.RefKey != root.Key || st.Key != root.Key || st.Root == nil {
		t.Fatalf("status %+v, %v", st, err)
	}
}

// rootStatusWith is RootStatus with a fake host.
func rootStatusWith(ctx context.Context, dir string, r *Recipe, h rootHost) (*RootState, error) {
	return rootStatus(ctx, RootOptions{Dir: dir, Recipe: r, host: h, Logger: slog.New(slog.DiscardHandler)})
}

// TestEnsureRootRebuildsAndPrunes: a changed input builds a new entry and
// moves the ref; the ref's current and previous entries survive pruning,
// older ones go, and another recipe's entry is never touched.
func TestEnsureRootRebuildsAndPrunes(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	other := newFakeHost()
	otherRoot, err := EnsureRoot(ctx, fakeOpts(t, dir, other, testRecipe(t, "other", "")))
	if err != nil {
		t.Fatal(err)
	}
	h := newFakeHost()
	r := testRecipe(t, "tiny", "")
	var keys []string
	for i, c := range []string{"bash=5.2", "bash=5.3", "bash=5.4"} {
		h.closures = []string{"apt=2.6.1", c}
		root, err := EnsureRoot(ctx, fakeOpts(t, dir, h, r))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, root.Key)
		if h.buildCount() != i+1 {
			t.Fatalf("build %d: %d builds", i, h.buildCount())
		}
		if got := readRefFile(t, dir, "tiny"); got != root.Key {
			t.Fatalf("ref = %s, want %s", got, root.Key)
		}
		if i > 0 {
			if got := readRefFile(t, dir, "tiny.previous"); got != keys[i-1] {
				t.Fatalf("previous = %s, want %s", got, keys[i-1])
			}
		}
	}
	want := []string{keys[1][:24], keys[2][:24], otherRoot.Key[:24]}
	slices.Sort(want)
	if got := storeEntries(dir); !slices.Equal(got, want) {
		t.Fatalf("store holds %v, want the current, the previous and the other recipe's: %v", got, want)
	}
	// Going back to an input whose entry still exists reuses it without a
	// build; the ref moves and the previous follows.
	h.closures = []string{"apt=2.6.1", "bash=5.3"}
	back, err := EnsureRoot(ctx, fakeOpts(t, dir, h, r))
	if err != nil {
		t.Fatal(err)
	}
	if h.buildCount() != 3 || back.Key != keys[1] {
		t.Fatalf("going back built (%d builds) or gave %s", h.buildCount(), back.Key)
	}
	if readRefFile(t, dir, "tiny") != keys[1] || readRefFile(t, dir, "tiny.previous") != keys[2] {
		t.Fatal("the ref did not move back")
	}
}

// TestWriteRef: the ref is replaced by rename (readers see the old or the
// new key, never a torn file), the key it named before is kept, and
// rewriting the same key keeps the previous one.
func TestWriteRef(t *testing.T) {
	dir := t.TempDir()
	k1, k2 := strings.Repeat("a", 64), strings.Repeat("b", 64)
	if err := writeRef(dir, "x", k1); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "refs/x.previous")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a first ref has a previous")
	}
	st1, _ := os.Stat(filepath.Join(dir, "refs/x"))
	if err := writeRef(dir, "x", k2); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(filepath.Join(dir, "refs/x"))
	if os.SameFile(st1, st2) {
		t.Fatal("the ref was rewritten in place, not replaced")
	}
	if err := writeRef(dir, "x", k2); err != nil {
		t.Fatal(err)
	}
	if readRefFile(t, dir, "x") != k2 || readRefFile(t, dir, "x.previous") != k1 {
		t.Fatal("rewriting the same key lost the previous one")
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "refs"))
	if len(ents) != 2 {
		t.Fatalf("refs/ holds %v (temp files left?)", ents)
	}
	writeFiles(t, dir, map[string]string{"refs/y": "not a key\n"})
	if _, err := readRef(dir, "y"); err == nil || !strings.Contains(err.Error(), "not a store key") {
		t.Fatalf("readRef of garbage: %v", err)
	}
	if _, err := readRef(dir, "../x"); err == nil {
		t.Fatal("readRef accepted a path")
	}

	// Readers racing a writer always see a whole key.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			writeRef(dir, "x", []string{k1, k2}[i%2])
		}
	})
	for range 2000 {
		if k, err := readRef(dir, "x"); err != nil || (k != k1 && k != k2) {
			close(stop)
			wg.Wait()
			t.Fatalf("a reader saw %q, %v", k, err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestEnsureRootRebuildsCorruptImage: an image changed in place fails
// verification and is rebuilt; ResolveRoot refuses it meanwhile.
func TestEnsureRootRebuildsCorruptImage(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost()
	opts := fakeOpts(t, dir, h, testRecipe(t, "tiny", ""))
	root, err := EnsureRoot(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(root.Image)
	data[0] ^= 0xff
	if err := os.WriteFile(root.Image, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ResolveRoot(dir, "tiny"); err == nil || !strings.Contains(err.Error(), "modified or corrupt") {
		t.Fatalf("ResolveRoot of a corrupt image: %v", err)
	}
	again, err := EnsureRoot(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if h.buildCount() != 2 || again.Key != root.Key {
		t.Fatalf("%d builds, key %s", h.buildCount(), again.Key)
	}
	if err := again.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestBuildRootForces(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost()
	opts := fakeOpts(t, dir, h, testRecipe(t, "tiny", ""))
	first, err := EnsureRoot(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	forced, err := BuildRoot(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if h.buildCount() != 2 || forced.Key != first.Key || !forced.BuiltAt.After(first.BuiltAt) {
		t.Fatalf("BuildRoot: %d builds", h.buildCount())
	}
	if _, err := ResolveRoot(dir, "tiny"); err != nil {
		t.Fatal(err)
	}
	if got := storeEntries(dir); len(got) != 1 {
		t.Fatalf("store %v", got)
	}
}

// TestEnsureRootFailedBuild: a failed build leaves the store, the ref and
// the asset directory as they were.
func TestEnsureRootFailedBuild(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost()
	opts := fakeOpts(t, dir, h, testRecipe(t, "tiny", ""))
	good, err := EnsureRoot(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	h.closures = []string{"apt=9"}
	h.fail = errors.New("smoke check `claude --version` failed")
	_, err = EnsureRoot(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "root image tiny: smoke check") {
		t.Fatalf("err = %v", err)
	}
	if readRefFile(t, dir, "tiny") != good.Key || !slices.Equal(storeEntries(dir), []string{good.Key[:24]}) {
		t.Fatal("a failed build changed the ref or the store")
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".work-*")); len(ents) != 0 {
		t.Fatalf("work directories left: %v", ents)
	}
	st, err := rootStatusWith(context.Background(), dir, opts.Recipe, h)
	if err != nil || st.Current || st.RefKey != good.Key || st.Key == good.Key {
		t.Fatalf("status after a failed build: %+v, %v", st, err)
	}
}

// TestEnsureRootConcurrent: two builders at once build once; the second
// waits for the lock and finds the first one's image.
func TestEnsureRootConcurrent(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost()
	h.buildGate = make(chan struct{})
	r := testRecipe(t, "tiny", "")
	var wg sync.WaitGroup
	results := make([]*Root, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { results[i], errs[i] = EnsureRoot(context.Background(), fakeOpts(t, dir, h, r)) })
	}
	// Let both reach the lock before the first build finishes.
	time.Sleep(300 * time.Millisecond)
	close(h.buildGate)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if h.buildCount() != 1 || results[0].Key != results[1].Key {
		t.Fatalf("%d builds", h.buildCount())
	}
}

func TestResolveRootMissing(t *testing.T) {
	if _, err := ResolveRoot(t.TempDir(), "full"); !errors.Is(err, ErrNoRoot) {
		t.Fatalf("err = %v", err)
	}
}

func TestLoadRootChecksKey(t *testing.T) {
	dir := t.TempDir()
	k := strings.Repeat("c", 64)
	entry := storePath(dir, k)
	writeFiles(t, entry, map[string]string{"manifest.json": fmt.Sprintf(`{"key":%q}`, strings.Repeat("d", 64))})
	if _, err := LoadRoot(entry); err == nil || !strings.Contains(err.Error(), "not its directory's") {
		t.Fatalf("a manifest naming another key: %v", err)
	}
	for manifest, want := range map[string]string{
		fmt.Sprintf(`{"key":%q,"kind":"kernel","files":{"root.erofs":{}}}`, k): "is a kernel, not a root",
		// What the builder before the one store wrote: no kind.
		fmt.Sprintf(`{"key":%q,"image":{"size":1}}`, k):       "names no kind: an older capsem wrote it",
		fmt.Sprintf(`{"key":%q,"kind":"root","files":{}}`, k): "lists no root.erofs",
	} {
		writeFiles(t, entry, map[string]string{"manifest.json": manifest})
		if _, err := LoadRoot(entry); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadRoot of %s: %v, want an error saying %q", manifest, err, want)
		}
	}
}

func TestUUIDFromKey(t *testing.T) {
	k := strings.Repeat("f", 64)
	if got := uuidFromKey(k); got != "ffffffff-ffff-4fff-bfff-ffffffffffff" {
		t.Fatalf("uuidFromKey = %s", got)
	}
	if uuidFromKey(strings.Repeat("0", 64)) == uuidFromKey(strings.Repeat("1", 64)) {
		t.Fatal("two keys give one UUID")
	}
}

// TestRestoreTree: what a smoke check leaves is undone (new paths removed,
// recipe files written again); any other change fails the build.
func TestRestoreTree(t *testing.T) {
	tree, _, root := unpackSandbox(t)
	claude := RecipeFile{Path: "/root/.claude.json", Mode: "0600", Content: `{"hasCompletedOnboarding": true}`}
	writeFiles(t, tree, map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/bash\n", "root/.gemini/settings.json": "{}"})
	os.MkdirAll(filepath.Join(tree, "proc/1"), 0o755)
	if err := writeRecipeFile(root, claude); err != nil {
		t.Fatal(err)
	}
	recipeFiles := map[string]RecipeFile{"root/.claude.json": claude}
	log := slog.New(slog.DiscardHandler)

	before, err := snapshotTree(tree)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := before["proc/1"]; ok {
		t.Fatal("the snapshot walked /proc")
	}
	// What the CLIs do on a first start.
	time.Sleep(10 * time.Millisecond)
	writeFiles(t, tree, map[string]string{
		"root/.gemini/projects.json": "{}",
		"root/.gemini/tmp/x/.root":   "",
		"root/.claude.json":          `{"hasCompletedOnboarding": true, "userID": "build-host"}`,
		"proc/1/status":              "not walked",
	})
	after, _ := snapshotTree(tree)
	if err := restoreTree(root, before, after, recipeFiles, log); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"root/.gemini/projects.json", "root/.gemini/tmp"} {
		if _, err := os.Lstat(filepath.Join(tree, gone)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s survived", gone)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(tree, "root/.claude.json")); string(data) != claude.Content {
		t.Errorf(".claude.json = %s", data)
	}
	if info, _ := os.Stat(filepath.Join(tree, "root/.claude.json")); info.Mode().Perm() != 0o600 {
		t.Errorf(".claude.json mode %v", info.Mode())
	}
	if _, err := os.Stat(filepath.Join(tree, "root/.gemini/settings.json")); err != nil {
		t.Error("a file that was there before is gone")
	}

	// A removed recipe file comes back; a changed system file is an error.
	before, _ = snapshotTree(tree)
	os.Remove(filepath.Join(tree, "root/.claude.json"))
	writeFiles(t, tree, map[string]string{"etc/passwd": "root:x:0:0::/root:/bin/sh\nextra\n"})
	after, _ = snapshotTree(tree)
	err = restoreTree(root, before, after, recipeFiles, log)
	if err == nil || !strings.Contains(err.Error(), "it changed /etc/passwd") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(filepath.Join(tree, "root/.claude.json")); err != nil {
		t.Error("a removed recipe file was not written again")
	}
}

// TestMountForChecksAndRemoveWorkDir: the fallback's mounts in the host's
// namespace (proc, and /dev bound in) are all undone, and removing a work
// directory first detaches whatever is still mounted under it, so the
// removal can never reach into the host's /dev.
func TestMountForChecksAndRemoveWorkDir(t *testing.T) {
	// Under CI nothing skips: it runs as root with mount(8).
	skip := t.Skip
	if os.Getenv("CI") == "true" {
		skip = t.Fatal
	}
	if os.Geteuid() != 0 {
		skip("mounting needs root")
	}
	mount, err := lookTool("mount")
	if err != nil {
		skip(err)
	}
	log := slog.New(slog.DiscardHandler)
	// Not t.TempDir: its cleanup would remove through a mount left behind.
	work, err := os.MkdirTemp("", workPrefix+"full-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if len(mountsUnder(work)) == 0 {
			os.RemoveAll(work)
		}
	})
	tree := filepath.Join(work, "tree")
	for _, d := range []string{"proc", "dev"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	undo, err := mountForChecks(context.Background(), log, mount, tree)
	if err != nil {
		skip("cannot mount here: ", err)
	}
	if _, err := os.Stat(filepath.Join(tree, "dev/null")); err != nil {
		undo()
		t.Fatalf("/dev is not bound in: %v", err)
	}
	if got := mountsUnder(work); len(got) < 2 {
		undo()
		t.Fatalf("mounts under the tree: %v", got)
	}
	undo()
	if got := mountsUnder(work); len(got) != 0 {
		t.Fatalf("left mounted: %v", got)
	}

	// A build killed with its mounts in place: removal detaches them first.
	if _, err := mountForChecks(context.Background(), log, mount, tree); err != nil {
		t.Fatal(err)
	}
	removeWorkDir(work, log)
	if _, err := os.Stat(work); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the work directory survived: %v (mounts %v)", err, mountsUnder(work))
	}
	if _, err := os.Stat("/dev/null"); err != nil {
		t.Fatalf("the host's /dev/null is gone: %v", err)
	}
}

func TestStripSetID(t *testing.T) {
	tree := t.TempDir()
	files := map[string]os.FileMode{"su": os.ModeSetuid | 0o755, "wall": os.ModeSetgid | 0o755, "ls": 0o755, "tmpdir": os.ModeSticky | os.ModeDir | 0o777}
	for name, mode := range files {
		p := filepath.Join(tree, name)
		if mode.IsDir() {
			os.MkdirAll(p, 0o755)
		} else {
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, nil, 0o644)
		}
		if err := os.Chmod(p, mode.Perm()|mode&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := stripSetID(tree)
	if err != nil || n != 2 {
		t.Fatalf("%d stripped, %v", n, err)
	}
	for name, want := range map[string]os.FileMode{"su": 0o755, "wall": 0o755, "ls": 0o755} {
		if st, _ := os.Stat(filepath.Join(tree, name)); st.Mode() != want {
			t.Errorf("%s: %v, want %v", name, st.Mode(), want)
		}
	}
	if st, _ := os.Stat(filepath.Join(tree, "tmpdir")); st.Mode()&os.ModeSticky == 0 {
		t.Errorf("a directory's sticky bit went: %v", st.Mode())
	}
}
