package guestfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Pins keep store entries that something outside the store still uses: a
// VM's root image, or an image's (a persistent VM boots from the root image
// it was made with, whatever the refs name since). Each file in pins/ is one
// holder's whole list, the store entries (first 24 hex) one per line,
// replaced at once (SetPins); pruning keeps every entry a pin names, and
// what it was built from, as it keeps what a ref names.
const pinsDir = "pins"

// pinHolderRE is what a pin file may be called: one per holder.
var pinHolderRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,40}$`)

// StoreEntryOf returns the asset directory and the store entry (first 24
// hex) that hold path, a file of a store entry; ok is false for a path
// outside any store.
func StoreEntryOf(path string) (assetsDir, entry string, ok bool) {
	dir := filepath.Dir(filepath.Clean(path))
	entry = filepath.Base(dir)
	store := filepath.Dir(dir)
	if !storeEntryRE.MatchString(entry) || filepath.Base(store) != storeDir || !filepath.IsAbs(path) {
		return "", "", false
	}
	return filepath.Dir(store), entry, true
}

// SetPins makes holder's pins in the asset directory dir exactly the store
// entries that hold paths (files of entries, as StoreEntryOf takes them;
// paths of another asset directory are an error). No paths removes the
// holder's pins.
func SetPins(dir, holder string, paths []string) error {
	if !pinHolderRE.MatchString(holder) {
		return fmt.Errorf("guestfs: pin holder %q: want lower-case letters, digits and '-'", holder)
	}
	var entries []string
	for _, p := range paths {
		assets, entry, ok := StoreEntryOf(p)
		if !ok || filepath.Clean(assets) != filepath.Clean(dir) {
			return fmt.Errorf("guestfs: %s is not in the store of %s", p, dir)
		}
		entries = append(entries, entry)
	}
	slices.Sort(entries)
	entries = slices.Compact(entries)
	file := filepath.Join(dir, pinsDir, holder)
	if len(entries) == 0 {
		if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("guestfs: removing the pins of %s: %w", holder, err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return fmt.Errorf("guestfs: %w", err)
	}
	if err := writeFileAtomic(file, []byte(strings.Join(entries, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("guestfs: writing the pins of %s: %w", holder, err)
	}
	return nil
}

// pinnedEntries are the store entries the pins in dir name. A pin file that
// cannot be read is an error: then nothing may be pruned.
func pinnedEntries(dir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(dir, pinsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue // a temp file of writeFileAtomic
		}
		data, err := os.ReadFile(filepath.Join(dir, pinsDir, e.Name()))
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			if storeEntryRE.MatchString(line) {
				out = append(out, line)
			}
		}
	}
	return out, nil
}
