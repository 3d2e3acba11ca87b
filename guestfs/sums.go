package guestfs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// sumsFile (in the asset directory) remembers the sha256 of files the
// builder hashed, by file identity. Every boot checks ~100 MB of assets and
// the guest binary against their recorded sums; hashing it all took ~75 ms
// of each boot here, while a stat proves the same thing for a file that did
// not change since it was hashed.
const sumsFile = ".sums.json"

// fileIdentity is what changes whenever a file's bytes can have changed:
// a rename or copy gives a new inode, and any write (or chmod, or touch)
// moves ctime, which no system call can set back.
type fileIdentity struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	CtimeNS int64  `json:"ctime_ns"`
}

type sumEntry struct {
	fileIdentity
	SHA256 string `json:"sha256"`
}

// identityOf is false where the platform gives no inode and ctime: such a
// file is always hashed.
func identityOf(st os.FileInfo) (fileIdentity, bool) {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fileIdentity{}, false
	}
	ctime, ok := changeTimeNS(sys)
	if !ok {
		return fileIdentity{}, false
	}
	return fileIdentity{
		Dev:     uint64(sys.Dev),
		Ino:     uint64(sys.Ino),
		Size:    st.Size(),
		MtimeNS: st.ModTime().UnixNano(),
		CtimeNS: ctime,
	}, true
}

// sumCache is the sha256 of files keyed by absolute path and identity.
// It is advisory: a missing, unreadable or stale cache only means hashing.
type sumCache struct {
	path string

	mu      sync.Mutex
	entries map[string]sumEntry
	dirty   bool
	hashed  int // files actually read and hashed (for tests)
}

func loadSumCache(dir string) *sumCache {
	c := &sumCache{path: filepath.Join(dir, sumsFile), entries: map[string]sumEntry{}}
	if data, err := os.ReadFile(c.path); err == nil {
		// A corrupt cache is dropped, not an error: it is rebuilt by hashing.
		if json.Unmarshal(data, &c.entries) != nil {
			c.entries = map[string]sumEntry{}
		}
	}
	return c
}

// sum returns the file's size and sha256, from the cache when the file's
// identity is the one recorded, else by reading it. A file that changed
// while it was read is hashed but not remembered. A nil cache just hashes.
func (c *sumCache) sum(p string) (size int64, sha string, err error) {
	if c == nil {
		c = &sumCache{entries: map[string]sumEntry{}}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return 0, "", err
	}
	f, err := os.Open(abs)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, "", err
	}
	before, known := identityOf(st)
	if known {
		c.mu.Lock()
		e, ok := c.entries[abs]
		c.mu.Unlock()
		if ok && e.fileIdentity == before && len(e.SHA256) == 2*sha256.Size {
			return st.Size(), e.SHA256, nil
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return 0, "", fmt.Errorf("hashing: %w", err)
	}
	sha = hex.EncodeToString(h.Sum(nil))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hashed++
	if st2, err := f.Stat(); err == nil && known {
		if after, ok := identityOf(st2); ok && after == before {
			c.entries[abs] = sumEntry{fileIdentity: before, SHA256: sha}
			c.dirty = true
		}
	}
	return st.Size(), sha, nil
}

// record remembers sha as the sum of p, a file the builder has just
// written from bytes it hashed itself, so its first verification need not
// read it back.
func (c *sumCache) record(p, sha string) {
	if c == nil {
		return
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return
	}
	st, err := os.Stat(abs)
	if err != nil {
		return
	}
	id, ok := identityOf(st)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[abs] = sumEntry{fileIdentity: id, SHA256: sha}
	c.dirty = true
}

// forget drops what the cache knows of p (a file that failed verification
// is hashed again next time, whatever its identity).
func (c *sumCache) forget(p string) {
	if c == nil {
		return
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[abs]; ok {
		delete(c.entries, abs)
		c.dirty = true
	}
}

// moved records that the file hashed at from was renamed to to: a rename
// keeps its identity, so the sum still holds under the new path.
func (c *sumCache) moved(from, to string) {
	if c == nil {
		return
	}
	af, err1 := filepath.Abs(from)
	at, err2 := filepath.Abs(to)
	if err1 != nil || err2 != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[af]; ok {
		delete(c.entries, af)
		c.entries[at] = e
		c.dirty = true
	}
}

// save writes the cache when it changed, dropping entries for files that no
// longer exist. Failing to save costs only a hash next time.
func (c *sumCache) save() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.dirty {
		return nil
	}
	for p := range c.entries {
		if _, err := os.Lstat(p); err != nil {
			delete(c.entries, p)
		}
	}
	data, err := json.Marshal(c.entries)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(c.path, data, 0o644); err != nil {
		return err
	}
	c.dirty = false
	return nil
}
