package privsep

import "golang.org/x/sys/unix"

// Syscall ABI facts for the seccomp filter on arm64.
const (
	seccompSupported = true
	seccompAuditArch = unix.AUDIT_ARCH_AARCH64
	seccompX32Bit    = 0 // no x32-like ABI on arm64

	sysSocket          = unix.SYS_SOCKET
	sysIOUringSetup    = unix.SYS_IO_URING_SETUP
	sysIOUringEnter    = unix.SYS_IO_URING_ENTER
	sysIOUringRegister = unix.SYS_IO_URING_REGISTER
)
