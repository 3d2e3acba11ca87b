package procs

import "golang.org/x/sys/unix"

// NotDumpable makes this process not dumpable: processes of the same user
// (its own children included) can then no longer read its memory, open its
// file descriptors or read its environment through /proc/<pid>, nor trace
// it; only a holder of CAP_SYS_PTRACE can. The aggregator holds every
// server's pipes, credentials and headers, and runs third-party servers as
// its children, which must not reach any of it.
func NotDumpable() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }
