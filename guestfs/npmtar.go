package guestfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// errIntegrity marks a tarball whose sha512 is not the pinned one.
var errIntegrity = errors.New("integrity mismatch")

// checkIntegrity hashes the file at p and compares it with an npm
// integrity string ("sha512-<base64>").
func checkIntegrity(p, integrity string) error {
	want, err := decodeIntegrity(integrity)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha512.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("hashing %s: %w", p, err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		return fmt.Errorf("%w: %s has sha512-%s, the recipe pins %s", errIntegrity, p, base64.StdEncoding.EncodeToString(got), integrity)
	}
	return nil
}

// unpackStats counts what an unpack wrote.
type unpackStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
}

// unpackNPM writes the paths pkg.Copy names from an npm tarball (gzip'd
// tar) into the tree. npm is not involved and no package script runs.
// Entries that are absolute, name "..", or are symlinks pointing outside
// the directory being copied are refused, as are hard links and devices;
// symlinks are made only after every file, so no write goes through one
// the tarball made. All writes go through root, which confines them to the
// tree whatever the tarball holds.
func unpackNPM(r io.Reader, pkg NPMPackage, root *os.Root) (unpackStats, error) {
	var st unpackStats
	fail := func(format string, args ...any) (unpackStats, error) {
		return st, fmt.Errorf("npm %s: %s", pkg.Spec, fmt.Sprintf(format, args...))
	}
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fail("not a gzip'd tarball: %v", err)
	}
	tr := tar.NewReader(gz)
	matched := make([]bool, len(pkg.Copy))
	type link struct{ dest, target string }
	var links []link
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail("reading the tarball: %v", err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		name, err := tarEntryName(h.Name)
		if err != nil {
			return fail("tar entry %q: %v", h.Name, err)
		}
		for i, c := range pkg.Copy {
			rel, ok := underCopy(c.From, name)
			if !ok {
				continue
			}
			matched[i] = true
			dest := strings.TrimPrefix(path.Join(c.To, rel), "/")
			if c.Mode != "" && rel != "" {
				return fail("copy from %q sets a mode, but %s is a directory (mode is for a single file)", c.From, c.From)
			}
			switch h.Typeflag {
			case tar.TypeReg:
				mode := npmFileMode(h.Mode)
				if c.Mode != "" {
					if mode, err = parseMode(c.Mode); err != nil {
						return fail("%v", err)
					}
				}
				n, err := writeTreeFile(root, dest, tr, mode)
				if err != nil {
					return fail("writing %s: %v", "/"+dest, err)
				}
				st.Files++
				st.Bytes += n
			case tar.TypeDir:
				if err := mkdirAllMode(root, dest); err != nil {
					return fail("creating %s: %v", "/"+dest, err)
				}
				st.Dirs++
			case tar.TypeSymlink:
				if rel == "" {
					return fail("copy from %q names a symlink; name what it points to", c.From)
				}
				if err := checkLinkTarget(rel, h.Linkname); err != nil {
					return fail("symlink %q: %v", h.Name, err)
				}
				links = append(links, link{dest, h.Linkname})
			default:
				return fail("tar entry %q is a %s; only files, directories and symlinks are unpacked", h.Name, tarTypeName(h.Typeflag))
			}
		}
	}
	for i, ok := range matched {
		if !ok {
			return fail("copy from %q: no such path in the tarball", pkg.Copy[i].From)
		}
	}
	for _, l := range links {
		if err := mkdirAllMode(root, path.Dir(l.dest)); err != nil {
			return fail("creating %s: %v", "/"+path.Dir(l.dest), err)
		}
		if err := replaceSymlink(root, l.dest, l.target); err != nil {
			return fail("symlink %s: %v", "/"+l.dest, err)
		}
		st.Symlinks++
	}
	return st, nil
}

// tarEntryName is the cleaned, slash-separated relative name of an entry.
func tarEntryName(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", errors.New("holds a NUL")
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("absolute path")
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", errors.New("names a parent directory (..)")
		}
	}
	return path.Clean(name), nil
}

// underCopy says whether name is from or beneath it, and the rest of the
// path ("" for from itself).
func underCopy(from, name string) (string, bool) {
	if name == from {
		return "", true
	}
	if rest, ok := strings.CutPrefix(name, from+"/"); ok {
		return rest, true
	}
	return "", false
}

// checkLinkTarget accepts a relative target that stays inside the copied
// directory, rel being the link's path in it.
func checkLinkTarget(rel, target string) error {
	if target == "" || strings.ContainsRune(target, 0) {
		return errors.New("empty or NUL target")
	}
	if path.IsAbs(target) {
		return fmt.Errorf("absolute target %q", target)
	}
	if !fs.ValidPath(path.Join(path.Dir(rel), target)) {
		return fmt.Errorf("target %q points outside the unpacked directory", target)
	}
	return nil
}

// npmFileMode is what npm itself installs: 0755 for anything executable,
// else 0644.
func npmFileMode(m int64) fs.FileMode {
	if m&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

func tarTypeName(t byte) string {
	switch t {
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("entry of type %q", t)
}

// mkdirAllMode creates rel and its missing parents as 0755 directories,
// whatever the process umask.
func mkdirAllMode(root *os.Root, rel string) error {
	rel = path.Clean(rel)
	if rel == "." || rel == "" {
		return nil
	}
	if st, err := root.Stat(rel); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("/%s exists and is not a directory", rel)
		}
		return nil
	}
	if err := mkdirAllMode(root, path.Dir(rel)); err != nil {
		return err
	}
	if err := root.Mkdir(rel, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return root.Chmod(rel, 0o755)
}

// writeTreeFile writes r to rel with exactly mode, replacing a symlink or
// file already there (never writing through the symlink).
func writeTreeFile(root *os.Root, rel string, r io.Reader, mode fs.FileMode) (int64, error) {
	if err := mkdirAllMode(root, path.Dir(rel)); err != nil {
		return 0, err
	}
	if st, err := root.Lstat(rel); err == nil {
		if st.IsDir() {
			return 0, fmt.Errorf("/%s is a directory", rel)
		}
		if err := root.Remove(rel); err != nil {
			return 0, err
		}
	}
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	return n, root.Chmod(rel, mode)
}

// replaceSymlink makes rel a symlink to target, replacing a file or link
// already there.
func replaceSymlink(root *os.Root, rel, target string) error {
	if st, err := root.Lstat(rel); err == nil {
		if st.IsDir() {
			return fmt.Errorf("/%s is a directory", rel)
		}
		if err := root.Remove(rel); err != nil {
			return err
		}
	}
	return root.Symlink(target, rel)
}
