// Package testkit builds and locates the real programs end-to-end tests run:
// the capsem binary, the small Go MCP echo server, and the MCP reference
// server from npm. A missing dependency fails the test; it never skips.
package testkit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/guestfs"
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

// build compiles a package of this module once per test process, into
// CacheDir/testbin/<name>: a fixed place, so test runs do not each leave a
// temporary directory of binaries behind.
func build(t testing.TB, pkg, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	dir := filepath.Join(CacheDir(t), "testbin", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	goBuild(t, out, nil, pkg)
	built[pkg] = out
	return out
}

// GuestProgram builds a package of this module without cgo, to run inside
// a guest (as root, from a test), once per test process.
func GuestProgram(t testing.TB, pkg, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	key := "guest:" + pkg
	if p, ok := built[key]; ok {
		return p
	}
	dir := filepath.Join(CacheDir(t), "testbin", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	goBuild(t, out, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, "-ldflags", "-s -w", pkg)
	built[key] = out
	return out
}

// goBuild runs go build with args into out, under a temporary name renamed
// over out at the end, so test processes building the same binary at the
// same time never run a half-written file (one still running the old
// binary keeps its inode).
func goBuild(t testing.TB, out string, env []string, args ...string) {
	t.Helper()
	tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".*.tmp")
	if err != nil {
		t.Fatal(err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // a no-op once renamed
	cmd := exec.Command("go", append([]string{"build", "-o", tmp.Name()}, args...)...)
	cmd.Dir = ModuleRoot(t)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", out, err, b)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		t.Fatal(err)
	}
}

// CapsemBinary returns $CAPSEM_TEST_BIN (set by make test) or builds capsem.
// A capsem-mcp-server symlink sits next to it.
func CapsemBinary(t testing.TB) string {
	t.Helper()
	if p := envvars.TestBin.Get(); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p := build(t, ".", "capsem")
	link := filepath.Join(filepath.Dir(p), "capsem-mcp-server")
	// Another test process may make the same link at the same moment.
	if err := os.Symlink("capsem", link); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
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

// ConformanceClient builds testdata/conformance/client, the MCP
// aggregator's client as the conformance suite's client under test.
func ConformanceClient(t testing.TB) string {
	t.Helper()
	return build(t, "./testdata/conformance/client", "conformance-client")
}

// EverythingPackage is the npm spec of @modelcontextprotocol/server-everything.
func EverythingPackage() string {
	if p := envvars.EverythingPkg.Get(); p != "" {
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
	if c := envvars.CacheDir.Get(); c != "" {
		return c
	}
	return filepath.Join(ModuleRoot(t), ".tools", "cache")
}

// GuestBinary returns the CGO-free capsem build that runs inside the guest:
// make build's bin/capsem-guest next to $CAPSEM_TEST_BIN, else a build made
// once per test process next to CapsemBinary (where the image builder looks
// for it).
func GuestBinary(t testing.TB) string {
	t.Helper()
	capsem := CapsemBinary(t)
	next := filepath.Join(filepath.Dir(capsem), "capsem-guest")
	if envvars.TestBin.Get() == capsem {
		if _, err := os.Stat(next); err == nil {
			return next
		}
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built["guest"]; ok {
		return p
	}
	goBuild(t, next, []string{"CGO_ENABLED=0"}, "-tags", "capsem_guest", ".")
	built["guest"] = next
	return next
}

// CapsemHome is the CAPSEM_HOME the VM tests share (CAPSEM_TEST_HOME, set by
// make test, else <repo>/.tools/capsem-home): guest assets, saved boots and
// the accelerator verdict are made there once.
func CapsemHome(t testing.TB) string {
	if h := envvars.TestHome.Get(); h != "" {
		return h
	}
	return filepath.Join(ModuleRoot(t), ".tools", "capsem-home")
}

// AccelVerdict is the accelerator verdict cache of CapsemHome, for tests
// that start QEMU themselves: every start goes through the one decision
// (vmm/qemu.Backend.ChooseAccel), proven once per host boot.
func AccelVerdict(t testing.TB) string {
	return filepath.Join(CapsemHome(t), "run", "accel.json")
}

// SharedAssets is CapsemHome's guest asset build for GuestBinary, built
// when missing (as the first VM start would).
func SharedAssets(t testing.TB) *guestfs.Assets {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a, err := guestfs.Ensure(ctx, guestfs.Options{Dir: filepath.Join(CapsemHome(t), "assets"), GuestBinary: GuestBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// SharedRootImage is CapsemHome's full root image, built when missing
// (minutes, the first time on a machine), as the first VM with base full
// would.
func SharedRootImage(t testing.TB) *guestfs.Root {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	r, err := guestfs.EnsureRoot(ctx, guestfs.RootOptions{Dir: filepath.Join(CapsemHome(t), "assets")})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// PrivateAssets returns a fresh CAPSEM_HOME holding a copy of the shared
// guest assets (CapsemHome's kernel and minimal root for GuestBinary,
// built first when missing: their store entries, refs and apt's memo), so
// a test can damage them without touching the shared ones; a is the copy,
// as the private home resolves it.
func PrivateAssets(t testing.TB) (home string, a *guestfs.Assets) {
	t.Helper()
	shared := SharedAssets(t)
	sharedDir := filepath.Dir(filepath.Dir(shared.Dir))
	home = t.TempDir()
	assets := filepath.Join(home, "assets")
	copyTree(t, shared.KernelDir, filepath.Join(assets, "store", filepath.Base(shared.KernelDir)))
	copyTree(t, shared.Dir, filepath.Join(assets, "store", filepath.Base(shared.Dir)))
	if err := os.MkdirAll(filepath.Join(assets, "refs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for ref, key := range map[string]string{guestfs.KernelRecipe: shared.KernelManifest.Key, guestfs.MinimalRecipe: shared.InitramfsManifest.Key} {
		if err := os.WriteFile(filepath.Join(assets, "refs", ref), []byte(key+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(t, filepath.Join(sharedDir, "apt-resolution.json"), filepath.Join(assets, "apt-resolution.json"))
	a, err := guestfs.Load(assets)
	if err != nil {
		t.Fatal(err)
	}
	return home, a
}

// copyTree copies the regular files under src to dst.
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		case d.Type().IsRegular():
			copyFile(t, p, filepath.Join(dst, rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// CapsemRun runs `capsem run --no-autodetect ARGS...` (a real VM) through
// a service of this test's own (ServiceEnv), and returns its output and
// exit status.
func CapsemRun(t testing.TB, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	env, _ := ServiceEnv(t)
	return CapsemRunIn(t, env, args...)
}

// CapsemRunIn is CapsemRun with the environment of a ServiceEnv given.
func CapsemRunIn(t testing.TB, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	GuestBinary(t) // the service's, next to capsem
	cmd := exec.Command(CapsemBinary(t), append([]string{"run", "--no-autodetect"}, args...)...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("capsem run: %v", err)
	}
	return out.String(), errb.String(), code
}

// NoCorpConfig is the CAPSEM_CORP_CONFIG=... entry that gives a test no
// corp policy (an empty file; a host's /etc/capsem/corp.toml stays out).
func NoCorpConfig(t testing.TB) string {
	return envvars.CorpConfig.Pair(filepath.Join(ModuleRoot(t), "testdata", "corp-none.toml"))
}

// ServiceEnv is the environment for a capsem service (or a `capsem mcp`
// that starts one) of its own for this test: the shared home (assets,
// accelerator verdict) and cache, no corp configuration, no AI CLI
// settings, and a fresh run directory (socket, registry, sessions), which
// is returned too. The directory's path is short: Unix socket paths are
// bounded. When the test ends, every VM of it is removed and its service
// stopped, and a VM process left running fails the test.
func ServiceEnv(t testing.TB) (env []string, runDir string) {
	t.Helper()
	runDir, err := os.MkdirTemp("", "csr-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// The VMs' consoles and logs, for the failure's cause.
			t.Logf("kept the run directory %s", runDir)
			return
		}
		os.RemoveAll(runDir)
	})
	env = append(os.Environ(), envvars.Home.Pair(CapsemHome(t)), envvars.CacheDir.Pair(CacheDir(t)), NoCorpConfig(t),
		envvars.RunDir.Pair(runDir), envvars.NoAutodetect.Pair("1"))
	capsem := CapsemBinary(t)
	t.Cleanup(func() {
		for _, args := range [][]string{{"purge", "--all"}, {"service", "stop"}} {
			cmd := exec.Command(capsem, args...)
			cmd.Env = env
			cmd.Run()
		}
		if left := VMProcesses(runDir); len(left) > 0 {
			t.Errorf("VM processes left running: %v", left)
		}
	})
	return env, runDir
}

// VMProcesses lists the pids of the per-VM processes whose session lies in
// runDir.
func VMProcesses(runDir string) []string {
	out, _ := exec.Command("pgrep", "-f", "capsem process --session-dir "+runDir).Output()
	return strings.Fields(string(out))
}
