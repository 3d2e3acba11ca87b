package vmhost_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/guestfs"
)

// copyFile copies src to dst (a real copy: dst is changed below).
// A boot file whose bytes changed with no trace in its identity (as a disk
// error leaves it) is handed out by the asset cache, but the per-VM process
// re-hashes every byte the VM boots from and never reports that VM ready:
// the boot fails with an error naming the file, and QEMU is gone.
func TestBootRefusesCorruptedBootFiles(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu-system-x86_64 not installed (make deps installs qemu-system-x86)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A private CAPSEM_HOME holding a copy of the shared build, so the
	// shared assets stay intact.
	home, a := testkit.PrivateAssets(t)
	assets := filepath.Join(home, "assets")

	// Corrupt the initramfs, then have the sum cache vouch for it: its
	// identity now, the manifest's sha256.
	initramfs := a.Initramfs
	data, err := os.ReadFile(initramfs)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(initramfs, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(initramfs, &st); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(initramfs)
	cache := map[string]any{initramfs: map[string]any{
		"dev": st.Dev, "ino": st.Ino, "size": st.Size, "mtime_ns": fi.ModTime().UnixNano(),
		"ctime_ns": st.Ctim.Sec*1e9 + st.Ctim.Nsec, "sha256": a.Files[guestfs.FileInitramfs].SHA256,
	}}
	b, _ := json.Marshal(cache)
	if err := os.WriteFile(filepath.Join(assets, ".sums.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	work := t.TempDir()
	cmd := exec.CommandContext(ctx, testkit.CapsemBinary(t), "process", "--session-dir", filepath.Join(work, "session"),
		"--socket", filepath.Join(work, "p.sock"), "--name", "corrupt", "--guest-binary", testkit.GuestBinary(t), "--no-autodetect")
	cmd.Env = append(os.Environ(), "CAPSEM_HOME="+home, "CAPSEM_CACHE_DIR="+testkit.CacheDir(t), testkit.NoCorpConfig(t))
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a VM booted from a corrupted initramfs:\n%s", out)
	}
	if !strings.Contains(string(out), "failed verification") || !strings.Contains(string(out), "initramfs.cpio") {
		t.Fatalf("the boot failed, but not on the verification:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(work, "p.sock")); err == nil {
		t.Fatal("the API socket exists: the VM was served")
	}
	// No QEMU of this VM is left.
	session := filepath.Join(work, "session")
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := ""
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if c, err := os.ReadFile(p); err == nil && strings.Contains(string(c), "qemu") && strings.Contains(string(c), session) {
				left = p
			}
		}
		if left == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU outlived the failed boot: %s", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The cache no longer vouches: the next Ensure re-hashes and rebuilds.
	b, _ = os.ReadFile(filepath.Join(assets, ".sums.json"))
	if strings.Contains(string(b), initramfs) {
		t.Fatalf("the sum cache still vouches for the corrupted file: %s", b)
	}
}
