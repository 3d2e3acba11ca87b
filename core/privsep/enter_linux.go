package privsep

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/envvars"
)

// selfExe is what the first stage executes: the very file this process was
// started from, even if the path has since been replaced on disk.
const selfExe = "/proc/self/exe"

// Enter applies the sandbox when this process is the first stage of a
// [Command] child, and does nothing otherwise. Call it first thing in main,
// before anything that opens files or starts goroutines of its own.
//
// In the first stage it does not return on success: it execs the same
// executable with the same argv, or Spec.Run when the parent set it. On error the caller must exit non-zero at
// once and never carry on, because the process is not (fully) restricted;
// [ErrParentGone] means the parent exited first, and exiting quietly is
// fine.
func Enter() error {
	stage, ok := envvars.PrivsepStage.Lookup()
	if !ok {
		return nil
	}
	// Every restriction below is applied to this OS thread only (with cgo
	// linked, there is no way to apply it to all threads at once); the exec
	// at the end keeps just this thread, so the goroutine must stay on it.
	// It is never unlocked: on success the thread is replaced by exec.
	runtime.LockOSThread()
	if err := enterSandbox(stage); err != nil {
		return fmt.Errorf("privsep: %w", err)
	}
	return nil
}

// enterSandbox is the first stage; it returns only on error.
func enterSandbox(stage string) error {
	if stage != stageSandbox {
		return fmt.Errorf("unknown sandbox stage %q", stage)
	}
	pol, err := decodePolicy(envvars.PrivsepPolicy.Get())
	if err != nil {
		return err
	}
	want, err := envvars.ParentPID.Parse(envvars.ParentPID.Get())
	if err != nil {
		return err
	}
	// The parent armed SIGKILL-on-parent-death for the thread it forked,
	// but the kernel does not copy it to new threads, and the exec below
	// may run on one of them; arm it for this thread so the second stage
	// keeps it.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("set parent-death signal: %w", err)
	}
	if err := checkParent(want); err != nil {
		return err
	}
	// no_new_privs first: Landlock and seccomp require it of an
	// unprivileged thread, and it keeps set-uid and file-capability binaries
	// from handing back what dropCaps removes.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	mech := []string{"nnp"}
	if err := dropCaps(); err != nil {
		return err
	}
	mech = append(mech, "caps")
	abi, err := applyLandlock(pol, landlockABI)
	if err != nil {
		return err
	}
	if abi > 0 {
		mech = append(mech, "landlock-v"+strconv.Itoa(abi))
	}
	if err := applySeccomp(!landlockHandlesUnix(abi)); err != nil {
		if !pol.BestEffort {
			return err
		}
		slog.Warn("privsep: running without the seccomp filter (best effort)", "err", err)
	} else {
		mech = append(mech, "seccomp")
	}
	env := stage2Env(os.Environ(), strings.Join(mech, ","))
	// Check again right before exec: the parent may have died while the
	// ruleset was built, before this thread's signal was armed.
	if err := checkParent(want); err != nil {
		return err
	}
	if len(pol.Run) > 0 {
		err = syscall.Exec(pol.Run[0], pol.Run, env)
		return fmt.Errorf("execute %s: %w", pol.Run[0], err)
	}
	err = syscall.Exec(selfExe, os.Args, env)
	return fmt.Errorf("re-execute %s: %w", selfExe, err)
}

func checkParent(want int) error {
	if got := unix.Getppid(); got != want {
		return fmt.Errorf("%w: started by pid %d, parent is now %d", ErrParentGone, want, got)
	}
	return nil
}

// stage2Env removes the private stage variables from environ and records
// the applied mechanisms in envvars.Sandbox.
func stage2Env(environ []string, mech string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if reserved(name) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, envvars.Sandbox.Pair(mech))
}
