package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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

func TestBuildCmd(t *testing.T) {
	guest := filepath.Join(t.TempDir(), "guest")
	if err := os.WriteFile(guest, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	assets := &guestfs.Assets{
		Dir: dir, Kernel: dir + "/vmlinux", KernelCompressed: dir + "/vmlinuz",
		Initramfs: dir + "/initramfs.cpio", KernelVersion: "6.1.0-99-amd64",
	}
	for _, force := range []bool{false, true} {
		var called string
		var got guestfs.Options
		fake := func(name string) buildFunc {
			return func(_ context.Context, o guestfs.Options) (*guestfs.Assets, error) {
				called, got = name, o
				return assets, nil
			}
		}
		var stdout, progress bytes.Buffer
		cmd := &BuildCmd{Force: force, GuestBinary: guest, Dir: dir}
		if err := cmd.run(context.Background(), &stdout, &progress, fake("ensure"), fake("build")); err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{false: "ensure", true: "build"}[force]
		if called != want {
			t.Fatalf("--force=%v called %s, want %s", force, called, want)
		}
		if got.Dir != dir || got.GuestBinary != guest || got.Progress != &progress || got.Logger == nil {
			t.Fatalf("options %+v", got)
		}
		for _, line := range []string{"kernel:            " + dir + "/vmlinux", "initramfs:         " + dir + "/initramfs.cpio", "kernel_version:    6.1.0-99-amd64"} {
			if !strings.Contains(stdout.String(), line) {
				t.Fatalf("output lacks %q:\n%s", line, stdout.String())
			}
		}
	}
}

func TestBuildCmdMissingGuestBinary(t *testing.T) {
	cmd := &BuildCmd{GuestBinary: filepath.Join(t.TempDir(), "capsem-guest"), Dir: t.TempDir()}
	never := func(context.Context, guestfs.Options) (*guestfs.Assets, error) {
		t.Fatal("built without a guest binary")
		return nil, nil
	}
	err := cmd.run(context.Background(), &bytes.Buffer{}, &bytes.Buffer{}, never, never)
	if err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Fatalf("error %v, want a hint to build the guest binary", err)
	}
}
