// Package image is `capsem image`: building and checking the guest boot
// assets (kernel, initramfs) that guestfs makes from Debian packages.
package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/guestfs"
)

// GuestBinaryName is the CGO-free capsem build looked for next to the
// running executable: the host binary links SQLite through cgo, so it cannot
// be the guest's /init itself.
const GuestBinaryName = "capsem-guest"

// Cmd is `capsem image`. It has no Run of its own: kong runs every Run
// method from the selected subcommand up to the root, so one here would
// run again after the subcommand's.
type Cmd struct {
	Build BuildCmd `cmd:"" help:"Build the guest boot assets from Debian packages (cached; rebuilt only when inputs change)."`
}

// BuildCmd is `capsem image build [--force]`.
type BuildCmd struct {
	Force       bool   `help:"Rebuild even when the cached assets are current."`
	GuestBinary string `name:"guest-binary" type:"path" env:"CAPSEM_GUEST_BINARY" help:"CGO-free capsem build to use as the guest's /init (default: capsem-guest next to this executable)."`
	Dir         string `name:"dir" type:"path" help:"Asset cache directory (default: $CAPSEM_HOME/assets)."`
}

// Run builds (or, without --force, checks and reuses) the assets, printing
// progress on stderr and the resulting paths on stdout.
func (c *BuildCmd) Run(ctx context.Context) error {
	return c.run(ctx, os.Stdout, os.Stderr, guestfs.Ensure, guestfs.Build)
}

type buildFunc func(context.Context, guestfs.Options) (*guestfs.Assets, error)

// run is Run with its outputs and the guestfs entry points passed in, so
// tests can check the wiring without building a kernel.
func (c *BuildCmd) run(ctx context.Context, stdout, progress io.Writer, ensure, rebuild buildFunc) error {
	opts, err := DefaultOptions(progress)
	if err != nil {
		return err
	}
	opts.Logger = logs.From(ctx)
	if c.GuestBinary != "" {
		opts.GuestBinary = c.GuestBinary
	}
	if c.Dir != "" {
		opts.Dir = c.Dir
	}
	if _, err := os.Stat(opts.GuestBinary); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image build: guest binary %s not found: build one with CGO_ENABLED=0 go build -tags capsem_guest -o %s . (make build does) or pass --guest-binary", opts.GuestBinary, opts.GuestBinary)
	}
	build := ensure
	if c.Force {
		build = rebuild
	}
	a, err := build(ctx, opts)
	if err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	PrintAssets(stdout, a)
	return nil
}

// PrintAssets writes the asset paths and facts, one "key: value" a line.
func PrintAssets(w io.Writer, a *guestfs.Assets) {
	fmt.Fprintf(w, "dir:               %s\n", a.Dir)
	fmt.Fprintf(w, "kernel:            %s\n", a.Kernel)
	fmt.Fprintf(w, "kernel_compressed: %s\n", a.KernelCompressed)
	fmt.Fprintf(w, "initramfs:         %s\n", a.Initramfs)
	fmt.Fprintf(w, "kernel_version:    %s\n", a.KernelVersion)
	fmt.Fprintf(w, "pvh:               %v\n", a.PVH)
	fmt.Fprintf(w, "modules:           %d\n", len(a.Modules))
}

// DefaultOptions are the production asset options: the cache in
// $CAPSEM_HOME/assets and capsem-guest next to the running executable.
// Callers that build assets on first use (capsem run) start from these.
func DefaultOptions(progress io.Writer) (guestfs.Options, error) {
	home, err := paths.Home()
	if err != nil {
		return guestfs.Options{}, err
	}
	guest, err := DefaultGuestBinary()
	if err != nil {
		return guestfs.Options{}, err
	}
	return guestfs.Options{
		Dir:         filepath.Join(home, "assets"),
		GuestBinary: guest,
		Progress:    progress,
	}, nil
}

// DefaultGuestBinary is capsem-guest in the running executable's directory
// (symlinks resolved, so bin/capsem-mcp-server finds bin/capsem-guest).
func DefaultGuestBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("locating the capsem executable: %w", err)
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	return filepath.Join(filepath.Dir(exe), GuestBinaryName), nil
}
