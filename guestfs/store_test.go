package guestfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeEntry writes a store entry's manifest with the header's fields.
func writeEntry(t testing.TB, dir string, h EntryHeader) {
	t.Helper()
	entry := storePath(dir, h.Key)
	if err := os.MkdirAll(entry, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeManifest(entry, &h); err != nil {
		t.Fatal(err)
	}
}

// TestPruneStore: what no ref names goes, unless a kept entry depends on
// it; saved boots go with their entry; the layout before the store goes;
// this build's work directories and foreign names stay; an unreadable ref
// or a kept entry's unreadable manifest stop pruning altogether.
func TestPruneStore(t *testing.T) {
	dir := t.TempDir()
	key := func(c string) string { return strings.Repeat(c, 64) }
	kernelOld, kernelNew, minimalOld, minimalNew, orphan := key("1"), key("2"), key("3"), key("4"), key("5")
	writeEntry(t, dir, EntryHeader{Kind: KindKernel, Recipe: "kernel", Key: kernelOld})
	writeEntry(t, dir, EntryHeader{Kind: KindKernel, Recipe: "kernel", Key: kernelNew})
	// The previous minimal root was built on a kernel no kernel ref names.
	writeEntry(t, dir, EntryHeader{Kind: KindInitramfs, Recipe: "minimal", Key: minimalOld, Depends: []string{kernelOld}})
	writeEntry(t, dir, EntryHeader{Kind: KindInitramfs, Recipe: "minimal", Key: minimalNew, Depends: []string{kernelNew}})
	writeEntry(t, dir, EntryHeader{Kind: KindRoot, Recipe: "full", Key: orphan})
	// A root image of the builder before the store: no kind, still named.
	legacyFull := key("6")
	writeFiles(t, storePath(dir, legacyFull), map[string]string{FileManifest: fmt.Sprintf(`{"recipe":"full","key":%q,"image":{"size":1}}`, legacyFull)})
	writeFiles(t, dir, map[string]string{
		"refs/full":                             legacyFull + "\n",
		"refs/kernel":                           kernelNew + "\n",
		"refs/minimal":                          minimalNew + "\n",
		"refs/minimal.previous":                 minimalOld + "\n",
		"refs/.minimal.tmp-1":                   orphan + "\n", // a temp file of an atomic write: not a ref
		"store/notakey/keep":                    "x",
		"boot-states/" + orphan[:24] + "/a":     "saved boot of a pruned entry",
		"boot-states/" + minimalNew[:24] + "/a": "saved boot of a kept one",
		// The layout before the store: asset directories, the kernel stage
		// cache, work directories.
		"0123456789abcdef01234567/initramfs.cpio":  "old",
		"kernels/94bd0fe1667c94e06f95bb32/vmlinuz": "old",
		".build-123/x":        "old",
		".work-full-1/tree/x": "a live build (its lock is held)",
	})
	old := time.Now().Add(-2 * legacyWorkAge)
	os.Chtimes(filepath.Join(dir, ".build-123"), old, old)
	pruneStore(dir, slog.New(slog.DiscardHandler))
	want := []string{kernelOld[:24], kernelNew[:24], minimalOld[:24], minimalNew[:24], legacyFull[:24]}
	if got := storeEntries(dir); !slices.Equal(got, want) {
		t.Fatalf("store holds %v, want %v", got, want)
	}
	for p, kept := range map[string]bool{
		"store/notakey/keep":                    true,
		"boot-states/" + minimalNew[:24] + "/a": true,
		"boot-states/" + orphan[:24]:            false,
		"0123456789abcdef01234567":              false,
		"kernels":                               false,
		".build-123":                            false,
		".work-full-1/tree/x":                   true,
	} {
		_, err := os.Stat(filepath.Join(dir, p))
		if kept != (err == nil) {
			t.Errorf("%s: kept %v, stat %v", p, kept, err)
		}
	}

	// The previous ref moves on: the old minimal root and the kernel only it
	// needed go.
	writeFiles(t, dir, map[string]string{"refs/minimal.previous": minimalNew + "\n"})
	pruneStore(dir, slog.New(slog.DiscardHandler))
	if got := storeEntries(dir); !slices.Equal(got, []string{kernelNew[:24], minimalNew[:24], legacyFull[:24]}) {
		t.Fatalf("store holds %v", got)
	}

	// Unreadable: nothing may go, since it may name or need anything.
	for name, breakIt := range map[string]func(){
		"a ref":                   func() { os.Mkdir(filepath.Join(dir, "refs/b"), 0o755) },
		"a kept entry's manifest": func() { os.WriteFile(filepath.Join(storePath(dir, minimalNew), FileManifest), []byte("{"), 0o644) },
	} {
		writeEntry(t, dir, EntryHeader{Kind: KindRoot, Recipe: "full", Key: orphan})
		writeEntry(t, dir, EntryHeader{Kind: KindInitramfs, Recipe: "minimal", Key: minimalNew, Depends: []string{kernelNew}})
		os.RemoveAll(filepath.Join(dir, "refs/b"))
		breakIt()
		pruneStore(dir, slog.New(slog.DiscardHandler))
		if got := storeEntries(dir); len(got) != 4 {
			t.Errorf("pruned with %s unreadable: %v", name, got)
		}
	}
}

// TestPublishReplacesAndPoints: publishing renames the build into the
// store (replacing an entry of the same key) and moves the ref; pointRef
// refuses an entry pruned meanwhile.
func TestPublishReplacesAndPoints(t *testing.T) {
	s, err := openStore(t.TempDir(), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k := strings.Repeat("e", 64)
	publish := func(content string) string {
		work, err := s.workDir("x")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(work)
		out := filepath.Join(work, "out")
		writeFiles(t, out, map[string]string{"f": content})
		h := &EntryHeader{Kind: KindRoot, Recipe: "x", Key: k, Files: map[string]FileSum{"f": {Size: int64(len(content))}}}
		if err := writeManifest(out, h); err != nil {
			t.Fatal(err)
		}
		final, err := s.publish(ctx, h, out, work)
		if err != nil {
			t.Fatal(err)
		}
		return final
	}
	first := publish("one")
	second := publish("two")
	if first != second || first != storePath(s.dir, k) {
		t.Fatalf("same key, entries %s and %s", first, second)
	}
	if data, _ := os.ReadFile(filepath.Join(second, "f")); string(data) != "two" {
		t.Fatalf("the second publish did not replace the first: %q", data)
	}
	if readRefFile(t, s.dir, "x") != k {
		t.Fatal("publish did not point the ref")
	}
	gone := strings.Repeat("f", 64)
	if err := s.pointRef(ctx, "x", gone); !errors.Is(err, errEntryGone) {
		t.Fatalf("pointRef at a missing entry: %v", err)
	}
	if readRefFile(t, s.dir, "x") != k {
		t.Fatal("a failed pointRef moved the ref")
	}
}

func TestLockBuildExcludes(t *testing.T) {
	s, err := openStore(t.TempDir(), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(s.dir, ".work-x-1")
	writeFiles(t, stale, map[string]string{"tree/a": "left by a killed build"})
	other := filepath.Join(s.dir, ".work-y-1")
	writeFiles(t, other, map[string]string{"a": "another recipe's live build"})
	// A recipe whose name starts with this one's and a dash.
	longer := filepath.Join(s.dir, ".work-x-dev-2")
	writeFiles(t, longer, map[string]string{"a": "recipe x-dev's live build"})
	unlock, err := s.lockBuild(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("the recipe's stale work directory survived its lock")
	}
	for _, w := range []string{other, longer} {
		if _, err := os.Stat(w); err != nil {
			t.Fatalf("another recipe's work directory %s was removed", filepath.Base(w))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.lockBuild(ctx, "x"); err == nil {
		t.Fatal("a second lock was granted while the first is held")
	}
	if u, err := s.lockBuild(ctx, "y"); err != nil {
		t.Fatalf("another recipe's lock: %v", err)
	} else {
		u()
	}
	got := make(chan error, 1)
	go func() {
		u, err := s.lockBuild(context.Background(), "x")
		if err == nil {
			u()
		}
		got <- err
	}()
	time.Sleep(150 * time.Millisecond)
	unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting locker never got the lock")
	}
}

func TestStoreRefs(t *testing.T) {
	dir := t.TempDir()
	if refs, err := StoreRefs(dir); err != nil || len(refs) != 0 {
		t.Fatalf("an empty store: %v, %v", refs, err)
	}
	a := mustEnsure(t, bootOpts(dir, writeGuest(t, t.TempDir(), "echo g"), newFakeBoot(t)))
	missing := strings.Repeat("9", 64)
	older := strings.Repeat("8", 64)
	writeFiles(t, storePath(dir, older), map[string]string{FileManifest: fmt.Sprintf(`{"key":%q}`, older)})
	writeFiles(t, dir, map[string]string{"refs/full": missing + "\n", "refs/bad": "x\n", "refs/old": older + "\n"})
	refs, err := StoreRefs(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range refs {
		got = append(got, fmt.Sprintf("%s %v %v", r.Name, r.Entry != nil, r.Err != nil))
	}
	if want := []string{"bad false true", "full false true", "kernel true false", "minimal true false", "old false true"}; !slices.Equal(got, want) {
		t.Fatalf("refs %v, want %v", got, want)
	}
	if !errors.Is(refs[4].Err, ErrOlderBuilder) || errors.Is(refs[1].Err, ErrOlderBuilder) {
		t.Fatalf("the older builder's entry: %v; a missing one: %v", refs[4].Err, refs[1].Err)
	}
	if refs[3].Key != a.InitramfsManifest.Key || refs[3].Entry.Kind != KindInitramfs || refs[3].Entry.Size() != a.Files[FileInitramfs].Size || refs[3].Dir != a.Dir {
		t.Fatalf("minimal ref %+v", refs[3])
	}
}

// FuzzReadManifest: whatever a store entry's manifest.json holds, an
// accepted one names a key of the entry's directory and a kind, and verifying it
// reads nothing outside the entry.
func FuzzReadManifest(f *testing.F) {
	key := strings.Repeat("a", 64)
	f.Add(fmt.Sprintf(`{"kind":"kernel","recipe":"kernel","key":%q,"files":{"vmlinuz":{"size":3,"sha256":"x"}}}`, key))
	f.Add(fmt.Sprintf(`{"kind":"initramfs","key":%q,"depends":["%s"],"files":{"../secret":{"size":6}}}`, key, key))
	f.Add(fmt.Sprintf(`{"kind":"root","key":%q,"files":{"lib/../../secret":{},"/etc/passwd":{}}}`, key))
	f.Add(fmt.Sprintf(`{"key":%q,"image":{"size":1}}`, key))
	f.Add(`{"kind":"root","key":"../../x"}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, data string) {
		dir := t.TempDir()
		entry := storePath(dir, key)
		writeFiles(t, dir, map[string]string{"store/secret": "secret", "secret": "secret"})
		writeFiles(t, entry, map[string]string{FileManifest: data, "vmlinuz": "abc"})
		var h EntryHeader
		if err := readManifest(entry, "", &h); err != nil {
			return
		}
		// The directory holds the key's first 24 hex; callers compare the
		// whole key with the one they asked for.
		if !keyRE.MatchString(h.Key) || h.Key[:24] != key[:24] || h.Kind == "" {
			t.Fatalf("accepted key %q, kind %q", h.Key, h.Kind)
		}
		if err := h.verifyFiles(entry, nil); err != nil {
			return
		}
		for n := range h.Files {
			p := filepath.Join(entry, filepath.FromSlash(n))
			if rel, err := filepath.Rel(entry, p); err != nil || !filepath.IsLocal(rel) || n == FileManifest {
				t.Fatalf("verified a file outside the entry: %q", n)
			}
		}
	})
}
