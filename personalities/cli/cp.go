package cli

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// CpCmd is `capsem cp SRC DST`, one side VM:PATH.
type CpCmd struct {
	Src string `arg:"" help:"A host file, or VM:PATH in a guest."`
	Dst string `arg:"" help:"A host file, or VM:PATH in a guest."`
}

// guestPath splits VM:PATH; a host path has no colon before its first slash.
func guestPath(s string) (vm, path string, ok bool) {
	vm, path, ok = strings.Cut(s, ":")
	if !ok || vm == "" || strings.Contains(vm, "/") {
		return "", "", false
	}
	return vm, path, true
}

// Run copies one file in or out of a VM (binary-safe, any size: the bytes
// stream, and neither this process nor the service holds the file). The
// destination is replaced only once the whole file has arrived, in the
// guest and on the host alike.
func (c *CpCmd) Run(ctx context.Context) error {
	srcVM, srcPath, fromGuest := guestPath(c.Src)
	dstVM, dstPath, toGuest := guestPath(c.Dst)
	if fromGuest == toGuest {
		return fmt.Errorf("cp: exactly one of %q and %q must be VM:PATH", c.Src, c.Dst)
	}
	cl, err := client()
	if err != nil {
		return err
	}
	if toGuest {
		// A destination that names a directory gets the source's name.
		if strings.HasSuffix(dstPath, "/") {
			dstPath += filepath.Base(c.Src)
		}
		f, err := os.Open(c.Src)
		if err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("cp: %w", err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("cp: %s is not a regular file", c.Src)
		}
		return cl.WriteFileFrom(ctx, dstVM, dstPath, uint32(st.Mode().Perm()), f)
	}
	dst := c.Dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(srcPath))
	}
	// A link at the destination is written through, as cp does; an
	// existing file keeps its mode.
	if real, err := filepath.EvalSymlinks(dst); err == nil {
		dst = real
	}
	mode := fs.FileMode(0o644)
	if st, err := os.Stat(dst); err == nil {
		if !st.Mode().IsRegular() {
			return fmt.Errorf("cp: %s exists and is not a regular file", dst)
		}
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".capsem-cp-*")
	if err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, _, err := cl.ReadFileTo(ctx, srcVM, srcPath, true, tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	// Synced before the rename: after a crash the new name must not point
	// at bytes that never reached the disk.
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	done = true
	return nil
}
