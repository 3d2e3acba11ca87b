// Package testkit builds and locates the real programs end-to-end tests run:
// the capsem binary, the small Go MCP echo server, and the MCP reference
// server from npm. A missing dependency fails the test; it never skips.
package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// ModuleRoot is the repository root: the nearest directory above the test's
// working directory that holds go.mod (found without running the go tool,
// whose environment a test may have changed).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("working directory: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// build compiles a package of this module once per test process.
func build(t testing.TB, pkg, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	dir, err := os.MkdirTemp("", "capsem-testbin-")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = ModuleRoot(t)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}

// CapsemBinary returns $CAPSEM_TEST_BIN (set by make test) or builds capsem.
// A capsem-mcp-server symlink sits next to it.
func CapsemBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CAPSEM_TEST_BIN"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p := build(t, ".", "capsem")
	link := filepath.Join(filepath.Dir(p), "capsem-mcp-server")
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink("capsem", link); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// RelayBinary is the capsem-mcp-server symlink next to CapsemBinary.
func RelayBinary(t testing.TB) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(CapsemBinary(t)), "capsem-mcp-server")
	if _, err := os.Lstat(p); err != nil {
		t.Fatalf("relay symlink missing: %v (run make build)", err)
	}
	return p
}

// EchoServer builds testdata/mcpecho, a small Go stdio MCP server.
func EchoServer(t testing.TB) string {
	t.Helper()
	return build(t, "./testdata/mcpecho", "mcpecho")
}

// EverythingPackage is the npm spec of @modelcontextprotocol/server-everything.
func EverythingPackage() string {
	if p := os.Getenv("CAPSEM_EVERYTHING_PKG"); p != "" {
		return p
	}
	return "@modelcontextprotocol/server-everything@2026.8.31"
}

// EverythingServer returns the npx command line of the MCP reference server.
func EverythingServer(t testing.TB) (string, []string) {
	t.Helper()
	if _, err := exec.LookPath("npx"); err != nil {
		t.Fatalf("npx is required for the MCP reference server (make deps installs node): %v", err)
	}
	return "npx", []string{"-y", EverythingPackage(), "stdio"}
}

// CacheDir is the shared package cache (CAPSEM_CACHE_DIR, set by make test),
// else <repo>/.tools/cache.
func CacheDir(t testing.TB) string {
	if c := os.Getenv("CAPSEM_CACHE_DIR"); c != "" {
		return c
	}
	return filepath.Join(ModuleRoot(t), ".tools", "cache")
}

// GuestBinary returns the CGO-free capsem build that runs inside the guest:
// bin/capsem-guest next to CapsemBinary, else a fresh CGO_ENABLED=0 build.
func GuestBinary(t testing.TB) string {
	t.Helper()
	next := filepath.Join(filepath.Dir(CapsemBinary(t)), "capsem-guest")
	if _, err := os.Stat(next); err == nil {
		return next
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built["guest"]; ok {
		return p
	}
	cmd := exec.Command("go", "build", "-tags", "capsem_guest", "-o", next, ".")
	cmd.Dir = ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the guest binary: %v\n%s", err, b)
	}
	built["guest"] = next
	return next
}
