//go:build !linux

package privsep

import (
	"context"
	"errors"
	"fmt"
	"os/exec"

	"github.com/capsem/capsem/core/envvars"
)

// Command is not implemented off Linux: the restrictions it promises
// (Landlock, no_new_privs, parent-death signal) are Linux interfaces, and a
// child without them must not pass for a sandboxed one.
func Command(ctx context.Context, spec Spec) (*exec.Cmd, error) {
	return nil, fmt.Errorf("privsep: sandboxed children need Linux: %w", errors.ErrUnsupported)
}

// Enter fails when a sandbox stage is requested, since none can be applied
// here, and does nothing otherwise.
func Enter() error {
	if _, ok := envvars.PrivsepStage.Lookup(); ok {
		return fmt.Errorf("privsep: sandbox requested but not supported on this system: %w", errors.ErrUnsupported)
	}
	return nil
}
