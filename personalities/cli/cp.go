package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/capsem/capsem/core/api"
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

// Run copies one file in or out of a VM (binary-safe).
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
		data, err := os.ReadFile(c.Src)
		if err != nil {
			return err
		}
		mode := uint32(0o644)
		if st, err := os.Stat(c.Src); err == nil {
			mode = uint32(st.Mode().Perm())
		}
		return cl.WriteFile(ctx, dstVM, api.WriteFileRequest{Path: dstPath, Content: base64.StdEncoding.EncodeToString(data), Encoding: "base64", Mode: mode})
	}
	r, err := cl.ReadFile(ctx, srcVM, api.ReadFileRequest{Path: srcPath, Encoding: "base64"})
	if err != nil {
		return err
	}
	data, err := base64.StdEncoding.DecodeString(r.Content)
	if err != nil {
		return fmt.Errorf("cp: the service sent bad base64: %w", err)
	}
	dst := c.Dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(srcPath))
	}
	return os.WriteFile(dst, data, fs.FileMode(0o644))
}
