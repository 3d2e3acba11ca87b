// Package image is `capsem image`: building the artefacts of guestfs's
// store from their recipes: the kernel, the minimal root (the initramfs
// every VM boots) and the root images, from Debian and npm packages.
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

// BuildCmd is `capsem image build [--force] [--base full|minimal|all]`.
type BuildCmd struct {
	Force       bool   `help:"Rebuild even when the cached assets are current."`
	Base        string `name:"base" enum:"full,minimal,all" default:"all" help:"What to build besides the kernel and the minimal root: minimal = nothing more; full = the full root image (Debian, Node, the AI CLIs); all = every root image recipe."`
	GuestBinary string `name:"guest-binary" type:"path" env:"CAPSEM_GUEST_BINARY" help:"CGO-free capsem build to use as the guest's /init (default: capsem-guest next to this executable)."`
	Dir         string `name:"dir" type:"path" help:"Asset cache directory (default: $CAPSEM_HOME/assets)."`
}

// Run builds (or, without --force, checks and reuses) the kernel and the
// minimal root, then the root images --base asks for, printing progress on
// stderr and each artefact's paths and key on stdout.
func (c *BuildCmd) Run(ctx context.Context) error {
	return c.run(ctx, os.Stdout, os.Stderr, builders{
		ensure: guestfs.Ensure, rebuild: guestfs.Build,
		ensureRoot: guestfs.EnsureRoot, rebuildRoot: guestfs.BuildRoot,
	})
}

type (
	buildFunc func(context.Context, guestfs.Options) (*guestfs.Assets, error)
	rootFunc  func(context.Context, guestfs.RootOptions) (*guestfs.Root, error)
)

// builders are the guestfs entry points run uses: cached ones, and forced
// ones for --force.
type builders struct {
	ensure, rebuild         buildFunc
	ensureRoot, rebuildRoot rootFunc
}

// baseRecipes are the root image recipes a --base value builds (the
// kernel and the minimal root are always built first).
func baseRecipes(base string) []string {
	switch base {
	case "minimal":
		return nil
	case "all":
		return guestfs.RecipeNamesOfKind(guestfs.KindRoot)
	}
	return []string{base}
}

// run is Run with its outputs and the guestfs entry points passed in, so
// tests can check the wiring without building a kernel.
func (c *BuildCmd) run(ctx context.Context, stdout, progress io.Writer, b builders) error {
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
	build, buildRoot := b.ensure, b.ensureRoot
	if c.Force {
		build, buildRoot = b.rebuild, b.rebuildRoot
	}
	a, err := build(ctx, opts)
	if err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	PrintAssets(stdout, a)
	base := c.Base
	if base == "" {
		base = "all"
	}
	for _, name := range baseRecipes(base) {
		recipe, err := guestfs.LoadRecipe(name)
		if err != nil {
			return fmt.Errorf("image build: %w", err)
		}
		r, err := buildRoot(ctx, guestfs.RootOptions{Dir: opts.Dir, Recipe: recipe, Progress: progress, Logger: opts.Logger})
		if err != nil {
			return fmt.Errorf("image build: %w", err)
		}
		PrintRoot(stdout, r)
	}
	return nil
}

// PrintRoot writes a root image's path, key and size, one "key: value" a
// line, the keys prefixed root_<recipe>.
func PrintRoot(w io.Writer, r *guestfs.Root) {
	p := "root_" + r.Recipe
	fmt.Fprintf(w, "%-19s%s\n", p+":", r.Image)
	fmt.Fprintf(w, "%-19s%s\n", p+"_key:", r.Key)
	fmt.Fprintf(w, "%-19s%d\n", p+"_size:", r.ImageSize())
}

// PrintAssets writes the kernel's and the minimal root's paths, keys and
// facts, one "key: value" a line.
func PrintAssets(w io.Writer, a *guestfs.Assets) {
	fmt.Fprintf(w, "kernel:            %s\n", a.Kernel)
	fmt.Fprintf(w, "kernel_compressed: %s\n", a.KernelCompressed)
	fmt.Fprintf(w, "kernel_key:        %s\n", a.KernelManifest.Key)
	fmt.Fprintf(w, "kernel_version:    %s\n", a.KernelVersion)
	fmt.Fprintf(w, "pvh:               %v\n", a.PVH)
	fmt.Fprintf(w, "modules:           %d\n", len(a.Modules))
	fmt.Fprintf(w, "initramfs:         %s\n", a.Initramfs)
	fmt.Fprintf(w, "minimal_key:       %s\n", a.InitramfsManifest.Key)
	fmt.Fprintf(w, "dir:               %s\n", a.Dir)
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
