package guestfs

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPinsKeepWhatVMsUse: a root image no ref names any more stays while a
// pin names it, with the kernel it was built from, and goes once no pin
// does; pins name only store entries of their own asset directory.
func TestPinsKeepWhatVMsUse(t *testing.T) {
	dir := t.TempDir()
	kernel, oldFull, newFull, other := key("1"), key("2"), key("3"), key("4")
	writeEntry(t, dir, EntryHeader{Kind: KindKernel, Recipe: "kernel", Key: kernel})
	writeEntry(t, dir, EntryHeader{Kind: KindRoot, Recipe: "full", Key: oldFull, Depends: []string{kernel}})
	writeEntry(t, dir, EntryHeader{Kind: KindRoot, Recipe: "full", Key: newFull})
	writeEntry(t, dir, EntryHeader{Kind: KindRoot, Recipe: "full", Key: other})
	writeFiles(t, dir, map[string]string{"refs/full": newFull + "\n"})
	rootOf := func(k string) string { return filepath.Join(storePath(dir, k), "root.erofs") }
	prune := func() []string {
		pruneStore(dir, slog.New(slog.DiscardHandler))
		return storeEntries(dir)
	}

	if err := SetPins(dir, "service", []string{rootOf(oldFull), rootOf(oldFull), rootOf(newFull)}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "pins", "service")); string(b) != oldFull[:24]+"\n"+newFull[:24]+"\n" {
		t.Errorf("pin file %q", b)
	}
	if got, want := prune(), []string{kernel[:24], oldFull[:24], newFull[:24]}; !slices.Equal(got, want) {
		t.Fatalf("with the old root pinned the store holds %v, want %v", got, want)
	}
	// The VM that used it is gone: so is the entry, and its kernel.
	if err := SetPins(dir, "service", []string{rootOf(newFull)}); err != nil {
		t.Fatal(err)
	}
	if got, want := prune(), []string{newFull[:24]}; !slices.Equal(got, want) {
		t.Fatalf("unpinned, the store holds %v, want %v", got, want)
	}
	if err := SetPins(dir, "service", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pins", "service")); !os.IsNotExist(err) {
		t.Errorf("no pins left a pin file: %v", err)
	}

	for name, paths := range map[string][]string{
		"a path outside any store":   {"/etc/passwd"},
		"another asset directory":    {filepath.Join(t.TempDir(), "store", other[:24], "root.erofs")},
		"a relative path":            {filepath.Join("store", other[:24], "root.erofs")},
		"the store directory":        {filepath.Join(dir, "store")},
		"an entry that is not a key": {filepath.Join(dir, "store", "notakey", "root.erofs")},
	} {
		if err := SetPins(dir, "service", paths); err == nil || !strings.Contains(err.Error(), "not in the store") {
			t.Errorf("%s pinned: %v", name, err)
		}
	}
	for _, holder := range []string{"", "../refs/full", "a/b", "Service", ".hidden"} {
		if err := SetPins(dir, holder, []string{rootOf(newFull)}); err == nil {
			t.Errorf("holder %q accepted", holder)
		}
	}
}

// TestUnreadablePinPrunesNothing: a pin that cannot be read may name
// anything, so nothing goes.
func TestUnreadablePinPrunesNothing(t *testing.T) {
	dir := t.TempDir()
	orphan := key("5")
	writeEntry(t, dir, EntryHeader{Kind: KindRoot, Recipe: "full", Key: orphan})
	os.MkdirAll(filepath.Join(dir, "pins", "service"), 0o755) // a directory: unreadable as a file
	pruneStore(dir, slog.New(slog.DiscardHandler))
	if got := storeEntries(dir); !slices.Equal(got, []string{orphan[:24]}) {
		t.Fatalf("pruned with an unreadable pin: %v", got)
	}
}

func TestStoreEntryOf(t *testing.T) {
	k := key("6")[:24]
	assets, entry, ok := StoreEntryOf("/home/u/.capsem/assets/store/" + k + "/root.erofs")
	if !ok || assets != "/home/u/.capsem/assets" || entry != k {
		t.Fatalf("StoreEntryOf = %q %q %v", assets, entry, ok)
	}
	for _, p := range []string{"", "/", "root.erofs", "/a/store/" + k, "/a/stor/" + k + "/f", "/a/store/" + k + "/../x/f"} {
		if _, _, ok := StoreEntryOf(p); ok {
			t.Errorf("%q taken as a store file", p)
		}
	}
}

// key is a store key of one repeated hex digit.
func key(c string) string { return strings.Repeat(c, 64) }
