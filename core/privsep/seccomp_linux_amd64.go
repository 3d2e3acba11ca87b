package privsep

import "golang.org/x/sys/unix"

// Syscall ABI facts for the seccomp filter on amd64.
const (
	seccompSupported = true
	seccompAuditArch = unix.AUDIT_ARCH_X86_64
	// seccompX32Bit marks x32 syscalls, which share AUDIT_ARCH_X86_64 and
	// would otherwise slip past the number checks.
	seccompX32Bit = 0x40000000

	sysSocket          = unix.SYS_SOCKET
	sysIOUringSetup    = unix.SYS_IO_URING_SETUP
	sysIOUringEnter    = unix.SYS_IO_URING_ENTER
	sysIOUringRegister = unix.SYS_IO_URING_REGISTER
)
