//go:build !linux

package privsep

import "errors"

// KernelSupport: none of it outside Linux.
func KernelSupport() Support {
	no := errors.New("not Linux")
	return Support{LandlockErr: no, SeccompErr: no, NoNewPrivsErr: no, PdeathsigErr: no}
}
