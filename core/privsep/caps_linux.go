package privsep

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Securebits (linux/securebits.h); x/sys/unix does not define them.
const (
	secbitNoroot                   = 1 << 0
	secbitNorootLocked             = 1 << 1
	secbitNoSetuidFixup            = 1 << 2
	secbitNoSetuidFixupLocked      = 1 << 3
	secbitKeepCapsLocked           = 1 << 5
	secbitNoCapAmbientRaise        = 1 << 6
	secbitNoCapAmbientRaiseLocked  = 1 << 7
	lockedNoRootBits               = secbitNoroot | secbitNorootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLocked | secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLocked
	maxCapabilities                = 64 // two 32-bit words in capability ABI v3
	capWords                       = 2
	capabilityHeaderVersionCurrent = unix.LINUX_CAPABILITY_VERSION_3
)

// dropCaps removes every capability from the calling thread, which the
// following execve turns into the capabilities of the whole process.
//
// Order matters: securebits and the bounding set can only be changed while
// CAP_SETPCAP is still effective, so capset comes last. With SECBIT_NOROOT
// (locked) uid 0 no longer gains capabilities on execve, and with an empty
// bounding set nothing can put them back; no_new_privs covers set-uid and
// file-capability binaries. A non-root caller without CAP_SETPCAP cannot
// shrink its bounding set, and does not need to: it has nothing to regain.
func dropCaps() error {
	hdr := unix.CapUserHeader{Version: capabilityHeaderVersionCurrent}
	var data [capWords]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	if data[unix.CAP_SETPCAP/32].Effective&(1<<(unix.CAP_SETPCAP%32)) != 0 {
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, lockedNoRootBits, 0, 0, 0); err != nil {
			return fmt.Errorf("lock securebits: %w", err)
		}
		for c := 0; c < maxCapabilities; c++ {
			err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
			if errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			if err != nil {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	// EINVAL: a kernel without ambient capabilities has none to clear.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	data = [capWords]unix.CapUserData{}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clear capability sets: %w", err)
	}
	// Check rather than trust: Landlock only covers the filesystem and a few
	// scopes, while a kept CAP_SYS_ADMIN, CAP_NET_ADMIN or CAP_SYS_MODULE
	// reaches the rest of the kernel.
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("re-read capabilities: %w", err)
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return fmt.Errorf("capabilities still present after capset: %+v", data)
		}
	}
	return nil
}
