package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/capsem/capsem/guestfs"
)

func TestDefaultGuestBinary(t *testing.T) {
	got, err := DefaultGuestBinary()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	exe, _ = filepath.EvalSymlinks(exe)
	if want := filepath.Join(filepath.Dir(exe), "capsem-guest"); got != want {
		t.Fatalf("DefaultGuestBinary = %s, want %s", got, want)
	}
}

func TestDefaultOptions(t *testing.T) {
	t.Setenv("CAPSEM_HOME", "/tmp/capsem-home-test")
	var progress bytes.Buffer
	opts, err := DefaultOptions(&progress)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Dir != "/tmp/capsem-home-test/assets" || opts.Progress != &progress || filepath.Base(opts.GuestBinary) != GuestBinaryName {
		t.Fatalf("options %+v", opts)
	}
}

// fakeBuilders records what run calls and with which options.
type fakeBuilders struct {
	assets  *guestfs.Assets
	calls   []string
	opts    []guestfs.Options
	roots   []guestfs.RootOptions
	rootErr error
}

func (f *fakeBuilders) builders() builders {
	boot := func(name string) buildFunc {
		return func(_ context.Context, o guestfs.Options) (*guestfs.Assets, error) {
			f.calls, f.opts = append(f.calls, name), append(f.opts, o)
			return f.assets, nil
		}
	}
	root := func(name string) rootFunc {
		return func(_ context.Context, o guestfs.RootOptions) (*guestfs.Root, error) {
			f.calls, f.roots = append(f.calls, name+" "+o.Recipe.Name), append(f.roots, o)
			if f.rootErr != nil {
				return nil, f.rootErr
			}
			r := &guestfs.Root{Dir: o.Dir + "/store/abc", Image: o.Dir + "/store/abc/root.erofs"}
			r.Recipe, r.Key = o.Recipe.Name, strings.Repeat("ab", 32)
			r.Files = map[string]guestfs.FileSum{guestfs.FileRootImage: {Size: 739971072}}
			return r, nil
		}
	}
	return builders{ensure: boot("ensure"), rebuild: boot("build"), ensureRoot: root("ensureRoot"), rebuildRoot: root("buildRoot")}
}

func TestBuildCmd(t *testing.T) {
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	assets := &guestfs.Assets{
		Dir: dir + "/store/m", Kernel: dir + "/store/k/vmlinux", KernelCompressed: dir + "/store/k/vmlinuz",
		Initramfs: dir + "/store/m/initramfs.cpio", KernelVersion: "6.1.0-99-amd64",
	}
	assets.KernelManifest.Key, assets.InitramfsManifest.Key = strings.Repeat("1", 64), strings.Repeat("2", 64)
	// --base all builds every root image recipe, and only those: the
	// kernel and the minimal root are what ensure builds.
	roots := guestfs.RecipeNamesOfKind(guestfs.KindRoot)
	if len(roots) == 0 || slices.Contains(roots, guestfs.KernelRecipe) || slices.Contains(roots, guestfs.MinimalRecipe) {
		t.Fatalf("root recipes %v", roots)
	}
	allRoots := func(verb string) []string {
		var out []string
		for _, n := range roots {
			out = append(out, verb+" "+n)
		}
		return out
	}
	cases := []struct {
		force bool
		base  string
		want  []string
	}{
		{false, "", append([]string{"ensure"}, allRoots("ensureRoot")...)},
		{false, "all", append([]string{"ensure"}, allRoots("ensureRoot")...)},
		{true, "all", append([]string{"build"}, allRoots("buildRoot")...)},
		{false, "full", []string{"ensure", "ensureRoot full"}},
		{true, "full", []string{"build", "buildRoot full"}},
		{false, "minimal", []string{"ensure"}},
		{true, "minimal", []string{"build"}},
	}
	for _, c := range cases {
		f := &fakeBuilders{assets: assets}
		var stdout, progress bytes.Buffer
		cmd := &BuildCmd{Force: c.force, Base: c.base, GuestBinary: guest, Dir: dir}
		if err := cmd.run(context.Background(), &stdout, &progress, f.builders()); err != nil {
			t.Fatal(err)
		}
		if strings.Join(f.calls, ",") != strings.Join(c.want, ",") {
			t.Fatalf("--force=%v --base=%q called %v, want %v", c.force, c.base, f.calls, c.want)
		}
		got := f.opts[0]
		if got.Dir != dir || got.GuestBinary != guest || got.Progress != &progress || got.Logger == nil {
			t.Fatalf("options %+v", got)
		}
		for _, o := range f.roots {
			if o.Dir != dir || o.Progress != &progress || o.Logger == nil || o.Recipe == nil {
				t.Fatalf("root options %+v", o)
			}
		}
		lines := []string{"kernel:            " + dir + "/store/k/vmlinux", "initramfs:         " + dir + "/store/m/initramfs.cpio", "kernel_version:    6.1.0-99-amd64",
			"kernel_key:        " + strings.Repeat("1", 64), "minimal_key:       " + strings.Repeat("2", 64)}
		if len(f.roots) > 0 {
			lines = append(lines, "root_full:         "+dir+"/store/abc/root.erofs", "root_full_key:     "+strings.Repeat("ab", 32), "root_full_size:    739971072")
		} else if strings.Contains(stdout.String(), "root_") {
			t.Fatalf("--base=minimal printed a root image:\n%s", stdout.String())
		}
		for _, line := range lines {
			if !strings.Contains(stdout.String(), line+"\n") {
				t.Fatalf("output lacks %q:\n%s", line, stdout.String())
			}
		}
	}
}

func TestBuildCmdRootFails(t *testing.T) {
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	f := &fakeBuilders{assets: &guestfs.Assets{}, rootErr: errors.New("smoke check `claude --version` failed")}
	cmd := &BuildCmd{Base: "full", GuestBinary: guest, Dir: t.TempDir()}
	err := cmd.run(context.Background(), &bytes.Buffer{}, &bytes.Buffer{}, f.builders())
	if err == nil || !strings.Contains(err.Error(), "image build: smoke check") {
		t.Fatalf("err = %v", err)
	}
}

func TestBuildCmdMissingGuestBinary(t *testing.T) {
	cmd := &BuildCmd{GuestBinary: filepath.Join(t.TempDir(), "capsem-guest"), Dir: t.TempDir()}
	f := &fakeBuilders{}
	err := cmd.run(context.Background(), &bytes.Buffer{}, &bytes.Buffer{}, f.builders())
	if len(f.calls) > 0 {
		t.Fatalf("built without a guest binary: %v", f.calls)
	}
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("error %v, want a hint to build the guest binary", err)
	}
}
