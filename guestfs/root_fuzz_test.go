package guestfs

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// FuzzParseRecipe: a recipe of any kind is accepted only whole and valid:
// its kind's keys alone; every path it writes clean, absolute and
// distinct (outside what the VM mounts over, for a root image); an
// environment file of one line per variable; module names and device
// numbers in range; a refusal names the file.
func FuzzParseRecipe(f *testing.F) {
	for _, n := range []string{"full", "kernel", "minimal"} {
		data, err := embeddedRecipes.ReadFile("recipes/" + n + ".toml")
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data))
	}
	f.Add(tinyRootRecipe)
	f.Add(strings.Replace(tinyRootRecipe, `to = "/usr/local/lib/tool"`, `to = "/usr/local/bin/tool"`, 1))
	f.Add("name = \"x\"\nkind = \"root\"\narch = \"amd64\"\nsuite = \"bookworm\"\n[env]\nPATH = \"/bin\"\n[[files]]\npath = \"/a\"\ncontent = '''\n{\n'''\n")
	f.Add("name = \"k\"\nkind = \"kernel\"\narch = \"amd64\"\n[kernel]\npackage = \"p1\"\nmodules = [\"a-b\", \"a_b\"]\n")
	f.Add("name = \"m\"\nkind = \"initramfs\"\narch = \"amd64\"\n[initramfs]\nkernel = \"k\"\nbusybox = \"b1\"\ninit = \"/bin/busybox\"\n")
	f.Add("name = \"m\"\nkind = \"initramfs\"\narch = \"amd64\"\n[initramfs]\nkernel = \"k\"\nbusybox = \"b1\"\ninit = \"/init\"\ndevices = [{path = \"/dev/x\", mode = \"0600\", major = 4095, minor = 1048575}]\n")
	f.Add("name = 1")
	f.Add("")
	f.Fuzz(func(t *testing.T, src string) {
		r, err := ParseRecipe("fuzz.toml", []byte(src))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.toml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := r.validate(); err != nil {
			t.Fatalf("accepted, then invalid: %v", err)
		}
		if _, ok := supportedArchs[r.Arch]; !ok {
			t.Fatalf("accepted arch %q", r.Arch)
		}
		seen := map[string]bool{}
		var paths []string
		for _, file := range r.Files {
			paths = append(paths, file.Path)
		}
		switch r.Kind {
		case KindKernel:
			if r.Kernel == nil || r.Initramfs != nil || r.Files != nil || r.Suite != "" || r.NPM != nil || len(r.Kernel.Modules) == 0 {
				t.Fatalf("a kernel recipe with %+v", r)
			}
			names := map[string]bool{}
			for _, m := range r.Kernel.Modules {
				if !isModuleName(modName(m)) || names[modName(m)] {
					t.Fatalf("module %q accepted (seen: %v)", m, names[modName(m)])
				}
				names[modName(m)] = true
			}
		case KindInitramfs:
			in := r.Initramfs
			if in == nil || r.Kernel != nil || r.Suite != "" || r.Env != nil || r.NPM != nil || r.Checks != nil {
				t.Fatalf("an initramfs recipe with %+v", r)
			}
			paths = append(paths, busyboxPath, in.Init)
			paths = append(paths, in.InitLinks...)
			for _, d := range in.Dirs {
				paths = append(paths, d.Path)
			}
			for _, d := range in.Devices {
				paths = append(paths, d.Path)
				if d.Major < 0 || d.Major > 4095 || d.Minor < 0 || d.Minor > 1<<20-1 {
					t.Fatalf("device %+v accepted", d)
				}
			}
			// Whatever it says, it lays out, with nothing under a file.
			tree := newFSTree()
			if _, err := layoutInitramfs(tree, r, nil, nil, in.FallbackApplets); err != nil {
				t.Fatalf("accepted, then its layout fails: %v", err)
			}
			for name := range tree.entries {
				if tree.underNonDir(name) {
					t.Fatalf("%s lies under a file", name)
				}
			}
		case KindRoot:
			if r.Kernel != nil || r.Initramfs != nil {
				t.Fatalf("a root recipe with %+v", r)
			}
			seen[GuestEnvironmentFile] = true
			for _, n := range r.NPM {
				if _, err := decodeIntegrity(n.Integrity); err != nil {
					t.Fatal(err)
				}
				for _, c := range n.Copy {
					paths = append(paths, c.To)
					if !fs.ValidPath(c.From) {
						t.Fatalf("copy from %q", c.From)
					}
				}
			}
			for _, p := range paths {
				if checkGuestPath(p) != nil {
					t.Fatalf("accepted path %q", p)
				}
			}
			lines := strings.Split(strings.TrimSuffix(string(r.EnvironmentFile()), "\n"), "\n")
			if len(lines) != len(r.Env) {
				t.Fatalf("%d variables make %d lines", len(r.Env), len(lines))
			}
		default:
			t.Fatalf("accepted kind %q", r.Kind)
		}
		for _, p := range paths {
			if !path.IsAbs(p) || path.Clean(p) != p || seen[p] {
				t.Fatalf("accepted path %q (seen before: %v)", p, seen[p])
			}
			seen[p] = true
		}
	})
}

// FuzzUnpackNPM: whatever the tarball, nothing is written outside the
// tree or outside the directory being copied, and no symlink it makes
// leaves the tree.
func FuzzUnpackNPM(f *testing.F) {
	f.Add(makeTar(f, []tarEntry{
		{name: "package/a", body: "x"},
		{name: "package/d/", typ: tar.TypeDir},
		{name: "package/d/l", typ: tar.TypeSymlink, link: "../a"},
	}))
	f.Add(makeTar(f, []tarEntry{{name: "package/../../outside/x", body: "x"}}))
	f.Add(makeTar(f, []tarEntry{{name: "package/l", typ: tar.TypeSymlink, link: "/etc"}, {name: "package/l/x", body: "x"}}))
	f.Add(makeTar(f, []tarEntry{{name: "package/self", typ: tar.TypeSymlink, link: "."}, {name: "package/esc", typ: tar.TypeSymlink, link: "self/.."}}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, tarData []byte) {
		tree, outside, root := unpackSandbox(t)
		pkg := NPMPackage{Spec: "x@1.0.0", Copy: []NPMCopy{{From: "package", To: "/opt/x"}}}
		unpackNPM(bytes.NewReader(gzipBytes(t, tarData)), pkg, root)
		assertEmpty(t, outside)
		filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(tree, p)
			if rel != "." && rel != "opt" && rel != "opt/x" && !strings.HasPrefix(rel, "opt/x/") {
				t.Fatalf("wrote %s, outside /opt/x", rel)
			}
			return nil
		})
		assertConfined(t, tree)
	})
}

// FuzzParseAptSimulation: every line kept is name=version, sorted.
func FuzzParseAptSimulation(f *testing.F) {
	f.Add(aptSimOutput)
	f.Add("Inst a (1 x)\nInst a (1 x)\n")
	f.Add("Inst (\n")
	f.Fuzz(func(t *testing.T, out string) {
		closure, err := parseAptSimulation([]byte(out))
		if err != nil {
			return
		}
		for i, c := range closure {
			name, version, ok := strings.Cut(c, "=")
			if !ok || name == "" || version == "" || strings.ContainsAny(c, "\n") {
				t.Fatalf("entry %q", c)
			}
			if i > 0 && closure[i-1] >= c {
				t.Fatalf("not sorted and unique: %v", closure)
			}
		}
	})
}

// FuzzDebianSources: whatever the host's sources files say, the sources
// given to the image are the suite's, with Debian's components and
// keyrings, and read back as they were written.
func FuzzDebianSources(f *testing.F) {
	f.Add("Types: deb\nURIs: http://a/debian\nSuites: bookworm bookworm-security\nComponents: main\n", "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://b/debian bookworm-updates main contrib\n")
	f.Add("Types: deb\n# c\nURIs: u\nSuites: bookworm\nComponents: stable\nSigned-By: /etc/x.gpg\n", "deb [ http://x bookworm main\n")
	f.Add("Types: deb\nURIs: u\nSuites: bookworm\nComponents: main\nSigned-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n", "")
	f.Fuzz(func(t *testing.T, deb822, oneLine string) {
		a, err1 := parseDeb822Sources([]byte(deb822))
		b, err2 := parseOneLineSources([]byte(oneLine))
		if err1 != nil || err2 != nil {
			return
		}
		kept := filterDebianSources(append(a, b...), "bookworm")
		if len(kept) == 0 {
			return
		}
		out := formatDeb822(kept)
		srcs, err := parseDeb822Sources(out)
		if err != nil {
			t.Fatalf("the output does not read back (%v):\n%s", err, out)
		}
		if again := formatDeb822(srcs); !bytes.Equal(again, out) {
			t.Fatalf("round trip:\n%s\nvs\n%s", out, again)
		}
		for _, s := range srcs {
			for _, su := range s.Suites {
				if su != "bookworm" && su != "bookworm-updates" && su != "bookworm-security" && su != "bookworm/updates" {
					t.Fatalf("suite %q kept", su)
				}
			}
			if s.SignedBy != "" && !isDebianKeyring(s.SignedBy) {
				t.Fatalf("keyring %q kept", s.SignedBy)
			}
			for _, c := range s.Components {
				if !slices.Contains(debianComponents, c) {
					t.Fatalf("component %q kept", c)
				}
			}
		}
	})
}

// FuzzParseMountsUnder: only mount points strictly below the directory,
// deepest first.
func FuzzParseMountsUnder(f *testing.F) {
	f.Add("40 22 0:21 / /w/.root-build-1/tree/proc rw - proc proc rw\n41 22 0:5 / /w/.root-build-1/tree/dev/pts rw - devpts d rw\n45 22 0:25 / /w/.root-build-1 rw - tmpfs t rw\n")
	f.Add("1 2 3 4 /w/.root-build-1/a\\040b\\\n")
	f.Fuzz(func(t *testing.T, info string) {
		got := parseMountsUnder([]byte(info), "/w/.root-build-1")
		for i, p := range got {
			if !strings.HasPrefix(p, "/w/.root-build-1/") {
				t.Fatalf("%q is not below the directory", p)
			}
			if i > 0 && len(got[i-1]) < len(p) {
				t.Fatalf("not deepest first: %v", got)
			}
		}
	})
}
