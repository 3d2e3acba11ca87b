package privsep

import (
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KernelSupport probes Support.
func KernelSupport() Support {
	var s Support
	s.LandlockABI, s.LandlockErr = landlockABI()
	if s.LandlockErr == nil && s.LandlockABI < 1 {
		s.LandlockABI, s.LandlockErr = 0, unix.ENOSYS
	}
	s.ScopesSignals = s.LandlockABI >= 6
	// PR_GET_SECCOMP fails with EINVAL when the kernel has no seccomp; the
	// filter mode also needs the "errno" action, which the filter returns.
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		s.SeccompErr = err
	} else if b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail"); err != nil {
		s.SeccompErr = err
	} else if !strings.Contains(string(b), "errno") {
		s.SeccompErr = unix.EOPNOTSUPP
	} else {
		s.SeccompFilter = true
	}
	if _, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil {
		s.NoNewPrivsErr = err
	} else {
		s.NoNewPrivs = true
	}
	var sig int32
	if err := unix.Prctl(unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0, 0, 0); err != nil {
		s.PdeathsigErr = err
	} else {
		s.Pdeathsig = true
	}
	return s
}
