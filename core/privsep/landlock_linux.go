package privsep

import (
	"errors"
	"fmt"
	"log/slog"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Landlock calls are made with golang.org/x/sys/unix directly. go-landlock's
// landlock/syscall package has the same thin wrappers, but it imports libpsx
// (for its all-threads calls), which with cgo wraps pthread_create for the
// whole binary and is not in this module's go.sum; the single-thread design
// here needs none of it.

// Filesystem rights by Landlock ABI version. Each version adds rights; the
// ruleset must only name rights the running kernel knows.
const (
	llExecute     = unix.LANDLOCK_ACCESS_FS_EXECUTE
	llWriteFile   = unix.LANDLOCK_ACCESS_FS_WRITE_FILE
	llReadFile    = unix.LANDLOCK_ACCESS_FS_READ_FILE
	llReadDir     = unix.LANDLOCK_ACCESS_FS_READ_DIR
	llRemoveDir   = unix.LANDLOCK_ACCESS_FS_REMOVE_DIR
	llRemoveFile  = unix.LANDLOCK_ACCESS_FS_REMOVE_FILE
	llMakeChar    = unix.LANDLOCK_ACCESS_FS_MAKE_CHAR
	llMakeDir     = unix.LANDLOCK_ACCESS_FS_MAKE_DIR
	llMakeReg     = unix.LANDLOCK_ACCESS_FS_MAKE_REG
	llMakeSock    = unix.LANDLOCK_ACCESS_FS_MAKE_SOCK
	llMakeFifo    = unix.LANDLOCK_ACCESS_FS_MAKE_FIFO
	llMakeBlock   = unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK
	llMakeSym     = unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	llRefer       = unix.LANDLOCK_ACCESS_FS_REFER        // ABI 2
	llTruncate    = unix.LANDLOCK_ACCESS_FS_TRUNCATE     // ABI 3
	llIoctlDev    = unix.LANDLOCK_ACCESS_FS_IOCTL_DEV    // ABI 5
	llResolveUnix = unix.LANDLOCK_ACCESS_FS_RESOLVE_UNIX // ABI 9

	// llFileRights are the rights that apply to a non-directory; the kernel
	// refuses a rule on a file that names any other.
	llFileRights = llExecute | llWriteFile | llReadFile | llTruncate | llIoctlDev

	// Scopes (ABI 6).
	llScopeAbstractUnix = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
	llScopeSignal       = unix.LANDLOCK_SCOPE_SIGNAL

	// maxKnownABI is the newest ABI whose filesystem rights this file knows;
	// a newer kernel is treated as this one (its new rights stay unhandled,
	// that is allowed, until this table grows).
	maxKnownABI = 9
)

// fsRightsForABI returns every filesystem right the given ABI supports. All
// of them are handled by the ruleset, so anything not granted is denied.
func fsRightsForABI(abi int) uint64 {
	if abi > maxKnownABI {
		abi = maxKnownABI
	}
	var r uint64
	if abi >= 1 {
		r = llExecute | llWriteFile | llReadFile | llReadDir | llRemoveDir | llRemoveFile |
			llMakeChar | llMakeDir | llMakeReg | llMakeSock | llMakeFifo | llMakeBlock | llMakeSym
	}
	if abi >= 2 {
		r |= llRefer
	}
	if abi >= 3 {
		r |= llTruncate
	}
	if abi >= 5 {
		r |= llIoctlDev
	}
	if abi >= 9 {
		r |= llResolveUnix
	}
	return r
}

// landlockHandlesUnix reports whether the ABI mediates connect() to
// path-named Unix sockets; below it the seccomp filter refuses AF_UNIX.
func landlockHandlesUnix(abi int) bool { return abi >= 9 }

// rightsFor maps a named access to Landlock bits (before ABI masking).
// MakeChar and MakeBlock are never granted (creating device nodes is not
// something a tool server does), and neither is IoctlDev: isatty on
// /dev/null then fails with EACCES instead of ENOTTY, which callers treat
// the same.
func rightsFor(a access) uint64 {
	const read = llReadFile | llReadDir
	const write = llWriteFile | llRemoveDir | llRemoveFile | llMakeDir | llMakeReg | llMakeSock |
		llMakeFifo | llMakeSym | llRefer | llTruncate | llResolveUnix
	switch a {
	case accessRead:
		return read
	case accessReadExec:
		return read | llExecute
	case accessReadWrite:
		return read | write
	case accessRWExec:
		return read | write | llExecute
	case accessDevice:
		return llReadFile | llWriteFile | llTruncate
	}
	return 0
}

// landlockABI asks the kernel for its Landlock ABI version.
func landlockABI() (int, error) {
	r, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// applyLandlock enforces p on the calling thread and returns the ABI used
// (0 when Landlock was skipped under best effort). abiFn is landlockABI
// outside tests. no_new_privs must already be set.
func applyLandlock(p policy, abiFn func() (int, error)) (int, error) {
	abi, err := abiFn()
	if err == nil && abi < 1 {
		err = fmt.Errorf("kernel reports landlock ABI %d", abi)
	}
	if err != nil {
		if p.BestEffort {
			slog.Warn("privsep: running without landlock (best effort)", "err", err)
			return 0, nil
		}
		// ENOSYS: not built in; EOPNOTSUPP: built in but not enabled at boot
		// (missing from lsm=).
		return 0, fmt.Errorf("%w: %w", ErrLandlockUnavailable, err)
	}
	handled := fsRightsForABI(abi)
	attr := unix.LandlockRulesetAttr{Handled_access_fs: handled}
	if abi >= 6 {
		// Keep a root child from signalling root processes outside the
		// sandbox (same uid passes the DAC check) and from reaching abstract
		// Unix sockets, which no filesystem rule can cover.
		attr.Scoped = llScopeAbstractUnix | llScopeSignal
	}
	// The struct may be larger than an old kernel's; the kernel accepts that
	// as long as the extra fields are zero, which they are below the ABI
	// that introduced them.
	r, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return 0, fmt.Errorf("create landlock ruleset (ABI %d): %w", abi, e)
	}
	rulesetFD := int(r)
	defer unix.Close(rulesetFD)
	for _, ru := range p.Rules {
		if err := addRule(rulesetFD, ru, handled); err != nil {
			return 0, err
		}
	}
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, uintptr(rulesetFD), 0, 0); e != 0 {
		return 0, fmt.Errorf("enforce landlock ruleset: %w", e)
	}
	return abi, nil
}

// addRule adds one path-beneath rule. The path is opened O_PATH, which
// follows symlinks: the rule binds to what the path reaches now.
func addRule(rulesetFD int, r rule, handled uint64) error {
	fd, err := unix.Open(r.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		if r.Optional && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)) {
			return nil
		}
		return fmt.Errorf("landlock rule for %s: open: %w", r.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("landlock rule for %s: stat: %w", r.Path, err)
	}
	allowed := rightsFor(r.Access) & handled
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		allowed &= llFileRights
	}
	if allowed == 0 {
		return nil
	}
	attr := unix.LandlockPathBeneathAttr{Allowed_access: allowed, Parent_fd: int32(fd)}
	_, _, e := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rulesetFD), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&attr)), 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("landlock rule for %s (%s): %w", r.Path, r.Access, e)
	}
	return nil
}
