package privsep

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Offsets into struct seccomp_data.
const (
	seccompDataNr   = 0
	seccompDataArch = 4
	// seccompDataArg0Low is the low 32 bits of args[0] on little-endian
	// machines (amd64, arm64). socket's domain is an int, so the kernel
	// ignores the high half too.
	seccompDataArg0Low = 16
)

// seccompProgram builds the classic-BPF filter described in the package
// documentation: kill on a foreign syscall ABI, ENOSYS for io_uring (its
// operations bypass seccomp and, before Landlock ABI 9, Landlock's socket
// checks), and when denyUnix EACCES for socket(AF_UNIX, ...), because the
// kernel's Landlock cannot keep such a socket from connecting to a
// path-named socket outside the sandbox, such as the service socket.
func seccompProgram(denyUnix bool) []unix.SockFilter {
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: k, Jt: jt, Jf: jf}
	}
	const (
		ld    = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		ret   = unix.BPF_RET | unix.BPF_K
		kill  = unix.SECCOMP_RET_KILL_PROCESS
		allow = unix.SECCOMP_RET_ALLOW
	)
	errno := func(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e)&unix.SECCOMP_RET_DATA }

	prog := []unix.SockFilter{
		stmt(ld, seccompDataArch),
		jeq(seccompAuditArch, 1, 0),
		stmt(ret, kill),
		stmt(ld, seccompDataNr),
	}
	if seccompX32Bit != 0 {
		prog = append(prog,
			unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, K: seccompX32Bit, Jt: 0, Jf: 1},
			stmt(ret, kill),
		)
	}
	prog = append(prog,
		jeq(sysIOUringSetup, 2, 0),
		jeq(sysIOUringEnter, 1, 0),
		jeq(sysIOUringRegister, 0, 1),
		stmt(ret, errno(unix.ENOSYS)),
	)
	if denyUnix {
		prog = append(prog,
			jeq(sysSocket, 0, 3),
			stmt(ld, seccompDataArg0Low),
			jeq(unix.AF_UNIX, 0, 1),
			stmt(ret, errno(unix.EACCES)),
		)
	}
	return append(prog, stmt(ret, allow))
}

// applySeccomp installs the filter on the calling thread; execve and every
// child inherit it. no_new_privs must already be set.
func applySeccomp(denyUnix bool) error {
	if !seccompSupported {
		return fmt.Errorf("seccomp filter not implemented for this architecture")
	}
	prog := seccompProgram(denyUnix)
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return fmt.Errorf("install seccomp filter: %w", err)
	}
	return nil
}
