package privsep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/envvars"
)

// Command builds (does not start) the command for a sandboxed child
// described by spec. The child must call [Enter] first thing in main; that
// is where the restrictions are applied, before the child's own code runs.
//
// The command runs in Spec.Scratch, in its own process group, and receives
// SIGKILL when the parent dies. The kernel ties that signal to the parent
// thread that forked the child, so do not start it from a goroutine that
// holds runtime.LockOSThread and may return without unlocking (that would
// end the thread and kill the child). Cancelling ctx kills the whole process
// group, which includes what the child started itself (npx, node).
// Stdin, Stdout and Stderr are left for the caller to connect.
func Command(ctx context.Context, spec Spec) (*exec.Cmd, error) {
	if err := checkPath(spec.Executable); err != nil {
		return nil, fmt.Errorf("sandbox executable: %w", err)
	}
	if st, err := os.Stat(spec.Executable); err != nil {
		return nil, fmt.Errorf("sandbox executable: %w", err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("sandbox executable %s is not a regular file", spec.Executable)
	}
	if spec.Scratch == "" {
		return nil, errors.New("sandbox needs a scratch directory (Spec.Scratch)")
	}
	for _, d := range []struct{ what, dir string }{{"scratch directory", spec.Scratch}, {"cache directory", spec.CacheDir}} {
		if d.dir == "" {
			continue
		}
		if err := checkPath(d.dir); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", d.what, err)
		}
		if err := os.MkdirAll(d.dir, 0o700); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", d.what, err)
		}
	}
	env, err := buildEnv(spec, os.Environ())
	if err != nil {
		return nil, fmt.Errorf("sandbox environment: %w", err)
	}
	pol, err := buildPolicy(spec)
	if err != nil {
		return nil, err
	}
	enc, err := encodePolicy(pol)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, spec.Executable, spec.Args...)
	cmd.Env = append(envList(env),
		envvars.PrivsepStage.Pair(stageSandbox),
		envvars.PrivsepPolicy.Pair(enc),
		envvars.ParentPID.Pair(strconv.Itoa(os.Getpid())),
	)
	cmd.Dir = spec.Scratch
	cmd.SysProcAttr = childSysProcAttr()
	cmd.Cancel = killGroup(cmd)
	slog.Debug("privsep: sandboxed command", "exe", spec.Executable, "args", spec.Args,
		"rules", len(pol.Rules), "env", len(env), "best_effort", spec.LandlockBestEffort)
	return cmd, nil
}

func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup returns a Cancel function that kills the child's process group
// (the child leads it, so its pgid is its pid).
func killGroup(cmd *exec.Cmd) func() error {
	return func() error {
		if cmd.Process == nil {
			return nil
		}
		err := unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		if errors.Is(err, unix.ESRCH) {
			return os.ErrProcessDone
		}
		if err != nil {
			return fmt.Errorf("kill process group %d: %w", cmd.Process.Pid, err)
		}
		return nil
	}
}
