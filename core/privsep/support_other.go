//go:build !linux

package privsep

import "errors"

// Support is what this kernel gives a privilege-separated child.
type Support struct {
	LandlockABI   int
	LandlockErr   error
	SeccompFilter bool
	SeccompErr    error
	NoNewPrivs    bool
	NoNewPrivsErr error
	Pdeathsig     bool
	PdeathsigErr  error
	ScopesSignals bool
}

// KernelSupport: none of it outside Linux.
func KernelSupport() Support {
	no := errors.New("not Linux")
	return Support{LandlockErr: no, SeccompErr: no, NoNewPrivsErr: no, PdeathsigErr: no}
}
