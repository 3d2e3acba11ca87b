package guestfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tarEntry is one entry of a test tarball.
type tarEntry struct {
	name, body, link string
	typ              byte
	mode             int64
}

func makeTar(t testing.TB, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Typeflag: typ, Mode: mode, Linkname: e.link, Size: int64(len(e.body)), Format: tar.FormatPAX}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipBytes(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// unpackSandbox is a tree (what the builder unpacks into) beside a
// sibling directory that nothing may ever write into.
func unpackSandbox(t testing.TB) (tree, outside string, root *os.Root) {
	t.Helper()
	base := t.TempDir()
	tree, outside = filepath.Join(base, "tree"), filepath.Join(base, "outside")
	for _, d := range []string{tree, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	root, err := os.OpenRoot(tree)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return tree, outside, root
}

func assertEmpty(t testing.TB, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("%s was written into: %v", dir, ents)
	}
}

func TestUnpackNPM(t *testing.T) {
	tgz := gzipBytes(t, makeTar(t, []tarEntry{
		{name: "package/package.json", body: `{"name":"x"}`},
		{name: "./package/bin/cli.js", body: "#!/usr/bin/env node\n", mode: 0o775},
		{name: "package/lib/", typ: tar.TypeDir, mode: 0o700},
		{name: "package/lib/a.js", body: "a", mode: 0o600},
		{name: "package/lib/alias.js", typ: tar.TypeSymlink, link: "a.js"},
		{name: "package/lib/up.js", typ: tar.TypeSymlink, link: "../bin/cli.js"},
		{name: "package/native/tool", body: "ELF", mode: 0o755},
		{name: "package/README.md", body: "not copied by the file copy"},
	}))
	tree, outside, root := unpackSandbox(t)
	pkg := NPMPackage{Spec: "x@1.0.0", Copy: []NPMCopy{
		{From: "package", To: "/usr/local/lib/node_modules/x"},
		{From: "package/native/tool", To: "/usr/local/bin/tool", Mode: "0750"},
	}}
	st, err := unpackNPM(bytes.NewReader(tgz), pkg, root)
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 6 || st.Dirs != 1 || st.Symlinks != 2 { // native/tool twice: in the directory and on its own
		t.Fatalf("stats %+v", st)
	}
	mod := filepath.Join(tree, "usr/local/lib/node_modules/x")
	for p, want := range map[string]fs.FileMode{
		"package.json": 0o644, "bin/cli.js": 0o755, "lib": fs.ModeDir | 0o755, "lib/a.js": 0o644, "native/tool": 0o755,
	} {
		info, err := os.Lstat(filepath.Join(mod, p))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode() != want {
			t.Errorf("%s: mode %v, want %v (npm's own 0644/0755)", p, info.Mode(), want)
		}
	}
	if info, err := os.Stat(filepath.Join(tree, "usr/local/bin/tool")); err != nil || info.Mode() != 0o750 {
		t.Fatalf("file copy with a mode: %v %v", info, err)
	}
	for link, want := range map[string]string{"lib/alias.js": "a.js", "lib/up.js": "../bin/cli.js"} {
		if got, err := os.Readlink(filepath.Join(mod, link)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", link, got, err, want)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(mod, "lib/up.js")); string(data) != "#!/usr/bin/env node\n" {
		t.Errorf("lib/up.js reads %q", data)
	}
	for _, p := range []string{"usr/local/lib", "usr/local/lib/node_modules", "usr/local/bin"} {
		if info, _ := os.Stat(filepath.Join(tree, p)); info == nil || info.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, want a 0755 directory", p, info)
		}
	}
	assertEmpty(t, outside)
}

// TestUnpackNPMRefuses: entries that would land outside the copied
// directory, or that are not plain files, directories or symlinks, fail
// the unpack with an error naming them; nothing lands outside the tree.
func TestUnpackNPMRefuses(t *testing.T) {
	copyAll := []NPMCopy{{From: "package", To: "/opt/x"}}
	cases := []struct {
		name    string
		entries []tarEntry
		copies  []NPMCopy
		want    string
	}{
		{"parent path", []tarEntry{{name: "package/../../outside/evil", body: "x"}}, copyAll, "names a parent directory"},
		{"leading parent", []tarEntry{{name: "../outside/evil", body: "x"}}, copyAll, "names a parent directory"},
		{"absolute path", []tarEntry{{name: "/outside/evil", body: "x"}}, copyAll, "absolute path"},
		{"absolute symlink", []tarEntry{{name: "package/l", typ: tar.TypeSymlink, link: "/etc/passwd"}}, copyAll, `absolute target "/etc/passwd"`},
		{"escaping symlink", []tarEntry{{name: "package/a/l", typ: tar.TypeSymlink, link: "../../../outside"}}, copyAll, "points outside the unpacked directory"},
		{"symlink to the copy's parent", []tarEntry{{name: "package/l", typ: tar.TypeSymlink, link: ".."}}, copyAll, "points outside"},
		{"hard link", []tarEntry{{name: "package/a", body: "x"}, {name: "package/h", typ: tar.TypeLink, link: "package/a"}}, copyAll, "is a hard link"},
		{"device", []tarEntry{{name: "package/null", typ: tar.TypeChar}}, copyAll, "is a character device"},
		{"fifo", []tarEntry{{name: "package/p", typ: tar.TypeFifo}}, copyAll, "is a FIFO"},
		{"missing from", []tarEntry{{name: "package/a", body: "x"}}, []NPMCopy{{From: "package/claude", To: "/usr/local/bin/claude"}}, `copy from "package/claude": no such path`},
		{"mode on a directory", []tarEntry{{name: "package/a", body: "x"}}, []NPMCopy{{From: "package", To: "/opt/x", Mode: "0755"}}, "mode is for a single file"},
		{"copying a symlink", []tarEntry{{name: "package/claude", typ: tar.TypeSymlink, link: "x"}}, []NPMCopy{{From: "package/claude", To: "/usr/local/bin/claude"}}, "names a symlink"},
		{
			// A link to the copy itself, then one through it to its
			// parent: lexically inside, physically outside. A file
			// written "through" it becomes a real directory instead, and
			// the link then cannot be made.
			"link chain",
			[]tarEntry{
				{name: "package/self", typ: tar.TypeSymlink, link: "."},
				{name: "package/esc", typ: tar.TypeSymlink, link: "self/.."},
				{name: "package/esc/evil", body: "x"},
			}, copyAll, "is a directory",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tree, outside, root := unpackSandbox(t)
			_, err := unpackNPM(bytes.NewReader(gzipBytes(t, makeTar(t, c.entries))), NPMPackage{Spec: "x@1.0.0", Copy: c.copies}, root)
			if err == nil {
				t.Fatal("unpacked")
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "npm x@1.0.0") {
				t.Fatalf("error %q does not say %q (and name the package)", err, c.want)
			}
			assertEmpty(t, outside)
			assertConfined(t, tree)
		})
	}
}

func TestUnpackNPMNotGzip(t *testing.T) {
	_, _, root := unpackSandbox(t)
	_, err := unpackNPM(strings.NewReader("plain text"), NPMPackage{Spec: "x@1.0.0", Copy: []NPMCopy{{From: "package", To: "/opt/x"}}}, root)
	if err == nil || !strings.Contains(err.Error(), "not a gzip'd tarball") {
		t.Fatalf("err = %v", err)
	}
}

// assertConfined fails if any symlink in the tree resolves outside it.
func assertConfined(t testing.TB, tree string) {
	t.Helper()
	filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		target, _ := os.Readlink(p)
		if filepath.IsAbs(target) {
			t.Errorf("%s is an absolute symlink to %s", p, target)
			return nil
		}
		rel, err := filepath.Rel(tree, filepath.Join(filepath.Dir(p), target))
		if err != nil || !filepath.IsLocal(rel) {
			t.Errorf("%s -> %s leaves the tree", p, target)
		}
		return nil
	})
}

func TestCheckIntegrity(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.tgz")
	data := []byte("tarball bytes")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha512.Sum512(data)
	good := "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
	if err := checkIntegrity(p, good); err != nil {
		t.Fatalf("matching tarball: %v", err)
	}
	sum[0] ^= 1
	bad := "sha512-" + base64.StdEncoding.EncodeToString(sum[:])
	err := checkIntegrity(p, bad)
	if !errors.Is(err, errIntegrity) || !strings.Contains(err.Error(), "the recipe pins "+bad) {
		t.Fatalf("mismatch: %v", err)
	}
	if err := checkIntegrity(p, "sha1-abc"); err == nil || errors.Is(err, errIntegrity) {
		t.Fatalf("a malformed pin: %v", err)
	}
}

// TestUnpackTarballRefusesTampered: a cached tarball that is not the
// pinned one is neither unpacked nor kept.
func TestUnpackTarballRefusesTampered(t *testing.T) {
	tgz := gzipBytes(t, makeTar(t, []tarEntry{{name: "package/a", body: "x"}}))
	sum := sha512.Sum512(tgz)
	pkg := NPMPackage{Spec: "x@1.0.0", Integrity: "sha512-" + base64.StdEncoding.EncodeToString(sum[:]), Copy: []NPMCopy{{From: "package", To: "/opt/x"}}}
	p := filepath.Join(t.TempDir(), "x-1.0.0.tgz")
	if err := os.WriteFile(p, tgz, 0o644); err != nil {
		t.Fatal(err)
	}
	tree, _, root := unpackSandbox(t)
	if _, err := unpackTarball(p, pkg, root); err != nil {
		t.Fatal(err)
	}
	tampered := gzipBytes(t, makeTar(t, []tarEntry{{name: "package/a", body: "evil"}}))
	if err := os.WriteFile(p, tampered, 0o644); err != nil {
		t.Fatal(err)
	}
	tree2, _, root2 := unpackSandbox(t)
	_, err := unpackTarball(p, pkg, root2)
	if !errors.Is(err, errIntegrity) || !strings.Contains(err.Error(), "npm x@1.0.0") {
		t.Fatalf("err = %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("the tampered tarball was kept in the cache")
	}
	if _, err := os.Stat(filepath.Join(tree2, "opt/x/a")); err == nil {
		t.Fatal("the tampered tarball was unpacked")
	}
	if data, _ := os.ReadFile(filepath.Join(tree, "opt/x/a")); string(data) != "x" {
		t.Fatalf("first unpack wrote %q", data)
	}
}

func TestParseNPMPack(t *testing.T) {
	out := []byte(`[{"id":"npm@10.9.9","name":"npm","filename":"npm-10.9.9.tgz","integrity":"sha512-x"},
	{"id":"@openai/codex@0.171.0-linux-x64","filename":"openai-codex-0.171.0-linux-x64.tgz"}]`)
	m, err := parseNPMPack(out)
	if err != nil {
		t.Fatal(err)
	}
	if m["npm@10.9.9"] != "npm-10.9.9.tgz" || m["@openai/codex@0.171.0-linux-x64"] != "openai-codex-0.171.0-linux-x64.tgz" {
		t.Fatalf("%v", m)
	}
	for _, bad := range []string{`not json`, `[{"id":"x@1.0.0","filename":"../x.tgz"}]`, `[{"id":"x@1.0.0","filename":""}]`, `[{"id":"x@1.0.0","filename":".hidden"}]`} {
		if _, err := parseNPMPack([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}
