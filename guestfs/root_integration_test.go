package guestfs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// rootTestDir is where the real root image is built: the shared test
// home's assets when CAPSEM_TEST_HOME is set (so later runs, and the VM
// tests, hit the cache), else the repository's .tools.
func rootTestDir(t *testing.T) string {
	t.Helper()
	if home := os.Getenv("CAPSEM_TEST_HOME"); home != "" {
		dir := filepath.Join(home, "assets")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return assetTestDir(t)
}

// TestRealRootImage builds the full recipe's image for real (slow once:
// mmdebstrap, ~430 MB of npm tarballs, mkfs.erofs; cached after), then
// checks the smoke checks' recorded output names the pinned versions and
// that the image holds the CLIs, the capsem links and the settings.
func TestRealRootImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Debian root image")
	}
	ci := os.Getenv("CI") == "true"
	for _, tool := range []string{"mmdebstrap", "mkfs.erofs", "dump.erofs", "npm", "apt-get", "unshare", "chroot"} {
		if _, err := exec.LookPath(tool); err != nil {
			if ci {
				t.Fatalf("%s not found: make deps installs what the root image build needs", tool)
			}
			t.Skipf("%s not found", tool)
		}
	}
	if os.Geteuid() != 0 {
		if ci {
			t.Fatal("building the root image needs root")
		}
		t.Skip("building the root image needs root")
	}
	recipe, err := LoadRecipe(DefaultRecipe)
	if err != nil {
		t.Fatal(err)
	}
	dir := rootTestDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	opts := RootOptions{Dir: dir, Recipe: recipe, Progress: &progress}

	start := time.Now()
	root, err := EnsureRoot(ctx, opts)
	if err != nil {
		t.Fatalf("EnsureRoot: %v\nprogress:\n%s", err, progress.String())
	}
	t.Logf("first EnsureRoot: %v, image %s (%d bytes)\n%s", time.Since(start), root.Image, root.ImageSize(), progress.String())
	for _, s := range root.Steps {
		t.Logf("step %-16s %6.1f s  %s", s.Name, s.Seconds, s.Detail)
	}

	// The smoke checks ran and their outputs name every pinned version.
	var outputs strings.Builder
	for _, c := range root.Checks {
		outputs.WriteString(c.Output + "\n")
	}
	if len(root.Checks) != len(recipe.Checks) {
		t.Fatalf("%d smoke checks recorded, the recipe has %d", len(root.Checks), len(recipe.Checks))
	}
	for _, n := range recipe.NPM {
		_, version, _ := npmSpecParts(n.Spec)
		version, _, _ = strings.Cut(version, "-") // codex's 0.171.0-linux-x64 says 0.171.0
		if !strings.Contains(outputs.String(), version) {
			t.Errorf("no smoke check output names %s (%s):\n%s", version, n.Spec, outputs.String())
		}
	}
	if len(root.Inputs.Closure) < 100 || root.Mode == "" {
		t.Errorf("manifest: %d Debian packages, mode %q", len(root.Inputs.Closure), root.Mode)
	}

	// What the guest relies on is in the image.
	dump := func(p string) string {
		out, err := exec.CommandContext(ctx, "dump.erofs", "--path="+p, root.Image).CombinedOutput()
		if err != nil {
			t.Fatalf("dump.erofs --path=%s: %v\n%s", p, err, out)
		}
		return string(out)
	}
	for p, want := range map[string][]string{
		"/usr/local/bin/claude":      {"regular file", "Access: 0755"},
		"/usr/local/bin/node":        {"regular file", "Access: 0755"},
		"/usr/bin/capsem-mcp-server": {"symlink file"},
		"/usr/bin/capsem":            {"symlink file"},
		"/root/.claude.json":         {"regular file", "Access: 0600"},
		"/root/.gemini/settings.json": {
			"regular file",
		},
		"/etc/capsem/environment": {"Size: " + strconv.Itoa(len(recipe.EnvironmentFile())) + " "},
		"/etc/hostname":           {"Size: 0 "},
	} {
		out := dump(p)
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: dump.erofs does not say %q:\n%s", p, w, out)
			}
		}
	}
	// The smoke checks' first-run files are not baked in.
	ls, err := exec.CommandContext(ctx, "dump.erofs", "--ls", "--path=/root/.gemini", root.Image).CombinedOutput()
	if err != nil {
		t.Fatalf("dump.erofs --ls: %v\n%s", err, ls)
	}
	if strings.Contains(string(ls), "projects.json") || strings.Contains(string(ls), "tmp") {
		t.Errorf("/root/.gemini holds what a smoke check left:\n%s", ls)
	}

	// Warm: nothing changed, so the same image comes back without a build.
	progress.Reset()
	start = time.Now()
	again, err := EnsureRoot(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached EnsureRoot: %v", time.Since(start))
	if again.Key != root.Key || !again.BuiltAt.Equal(root.BuiltAt) || progress.Len() != 0 {
		t.Fatalf("a cached EnsureRoot rebuilt: %s vs %s; progress %q", again.Key, root.Key, progress.String())
	}
	resolved, err := ResolveRoot(dir, recipe.Name)
	if err != nil || resolved.Image != root.Image {
		t.Fatalf("ResolveRoot = %v, %v", resolved, err)
	}
	st, err := RootStatus(ctx, dir, recipe)
	if err != nil || !st.Current {
		t.Fatalf("RootStatus = %+v, %v", st, err)
	}
}
