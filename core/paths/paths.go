// Package paths resolves Capsem's directories on the host.
package paths

import (
	"fmt"
	"os"
	"path/filepath"
)

// Home is $CAPSEM_HOME, else ~/.capsem.
func Home() (string, error) {
	if h := os.Getenv("CAPSEM_HOME"); h != "" {
		return filepath.Abs(h)
	}
	u, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("locating the home directory (set CAPSEM_HOME): %w", err)
	}
	return filepath.Join(u, ".capsem"), nil
}

// CacheDir is the package cache shared by sandboxed MCP servers:
// $CAPSEM_CACHE_DIR, else $CAPSEM_HOME/cache.
func CacheDir() (string, error) {
	if c := os.Getenv("CAPSEM_CACHE_DIR"); c != "" {
		return filepath.Abs(c)
	}
	h, err := Home()
	if err != nil {
		return "", err
	}
	return filepath.Join(h, "cache"), nil
}

// ScratchRoot holds per-child scratch directories (HOME, TMPDIR).
func ScratchRoot() (string, error) {
	h, err := Home()
	if err != nil {
		return "", err
	}
	return filepath.Join(h, "run", "scratch"), nil
}

// AccelVerdict is the cached proof of whether KVM runs the guest on this
// host (vmm/qemu.Verdict), under $CAPSEM_HOME/run.
func AccelVerdict() (string, error) {
	h, err := Home()
	if err != nil {
		return "", err
	}
	return filepath.Join(h, "run", "accel.json"), nil
}
