package guestfs

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestSumCacheRemembersUnchangedFiles(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "vmlinux")
	data := []byte("kernel bytes")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c := loadSumCache(dir)
	for i := 0; i < 3; i++ {
		size, sum, err := c.sum(p)
		if err != nil || size != int64(len(data)) || sum != sha256Hex(data) {
			t.Fatalf("sum: %d %s %v", size, sum, err)
		}
	}
	if c.hashed != 1 {
		t.Fatalf("hashed %d times, want once", c.hashed)
	}
	if err := c.save(); err != nil {
		t.Fatal(err)
	}
	// A new process reads the saved cache and hashes nothing.
	c2 := loadSumCache(dir)
	if _, sum, err := c2.sum(p); err != nil || sum != sha256Hex(data) || c2.hashed != 0 {
		t.Fatalf("after reload: sum %s err %v hashed %d", sum, err, c2.hashed)
	}
}

// Any change of the bytes is seen, even one that keeps the size and puts
// the modification time back: the change time moves regardless.
func TestSumCacheSeesChanges(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "initramfs.cpio")
	if err := os.WriteFile(p, []byte("AAAA"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	c := loadSumCache(dir)
	if _, _, err := c.sum(p); err != nil {
		t.Fatal(err)
	}
	c.save()

	cases := []struct {
		name   string
		change func(t *testing.T)
		want   []byte
	}{
		{"same size, mtime restored", func(t *testing.T) {
			time.Sleep(10 * time.Millisecond) // a distinct ctime on coarse clocks
			if err := os.WriteFile(p, []byte("BBBB"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
		}, []byte("BBBB")},
		{"replaced by rename", func(t *testing.T) {
			tmp := filepath.Join(dir, "new")
			if err := os.WriteFile(tmp, []byte("CCCC"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, p); err != nil {
				t.Fatal(err)
			}
		}, []byte("CCCC")},
		{"truncated", func(t *testing.T) {
			if err := os.Truncate(p, 2); err != nil {
				t.Fatal(err)
			}
		}, []byte("CC")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.change(t)
			c := loadSumCache(dir)
			size, sum, err := c.sum(p)
			if err != nil || sum != sha256Hex(tc.want) || size != int64(len(tc.want)) {
				t.Fatalf("sum %s size %d err %v, want the new bytes' sum", sum, size, err)
			}
			if c.hashed != 1 {
				t.Fatalf("hashed %d times, want 1", c.hashed)
			}
			c.save()
		})
	}
}

// Verification through the cache still refuses a modified asset, and
// forgets it so the rebuild is hashed afresh.
func TestVerifyWithSumCache(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, FileInitramfs)
	data := []byte("initramfs")
	os.WriteFile(p, data, 0o644)
	want := FileSum{Size: int64(len(data)), SHA256: sha256Hex(data)}
	c := loadSumCache(dir)
	if err := verifyFile(p, want, c); err != nil {
		t.Fatal(err)
	}
	if err := verifyFile(p, want, c); err != nil || c.hashed != 1 {
		t.Fatalf("second verify: %v, hashed %d", err, c.hashed)
	}
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(p, []byte("initramfX"), 0o644)
	if err := verifyFile(p, want, c); err == nil {
		t.Fatal("a modified asset verified")
	}
	if _, ok := c.entries[p]; ok {
		t.Fatal("a file that failed verification is still remembered")
	}
	// A corrupt cache file is ignored, not fatal.
	os.WriteFile(filepath.Join(dir, sumsFile), []byte("{not json"), 0o644)
	c = loadSumCache(dir)
	if len(c.entries) != 0 {
		t.Fatalf("corrupt cache loaded %d entries", len(c.entries))
	}
}
