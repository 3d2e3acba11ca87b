package privsep

import "errors"

var (
	// ErrLandlockUnavailable is returned (wrapped) by [Enter] when the kernel
	// has no usable Landlock and the policy does not allow best effort.
	ErrLandlockUnavailable = errors.New("landlock is not available on this kernel")
	// ErrParentGone is returned (wrapped) by [Enter] when the process that
	// started the child has already exited; the caller should exit quietly.
	ErrParentGone = errors.New("parent process is gone")
)
