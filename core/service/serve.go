package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/filelock"
	"github.com/capsem/capsem/core/httpserve"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/unixsock"
)

// ErrAlreadyServing: another service answers on the socket.
var ErrAlreadyServing = errors.New("a capsem service is already serving")

// Serve runs the service on its socket until ctx ends or a client asks it
// to stop. Its VMs keep running when it exits, to be re-adopted by the
// next. A second service returns ErrAlreadyServing; a socket left by one
// that died is replaced.
func Serve(ctx context.Context, o Options) error {
	if _, err := SecureRunDir(); err != nil {
		return err
	}
	sock, err := paths.ServiceSocket()
	if err != nil {
		return err
	}
	// Clients refuse a socket that another user could have put in place
	// (unixsock.Dial): serving on one would help no one.
	if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
		return fmt.Errorf("creating the directory of %s: %w", sock, err)
	}
	if err := unixsock.CheckPrivateDir(filepath.Dir(sock)); err != nil {
		return fmt.Errorf("refusing to serve on %s: %w", sock, err)
	}
	unlock, err := lockService(ctx, sock)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := New(ctx, o)
	if err != nil {
		return err
	}
	ln, err := unixsock.Listen(sock)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	srv := httpserve.New(s.Handler(stop), httpserve.Options{Log: s.log, Answered: s.answered})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	s.log.Info("capsem service serving", "socket", sock, "pid", os.Getpid(), "vms", len(s.List()))
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serving %s: %w", sock, err)
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout+5*time.Second)
	s.EndRuns(rctx)
	rcancel()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	s.log.Info("capsem service stopped; its VMs keep running")
	return nil
}

// lockService takes the service lock. While another holds it, that one
// either serves (ErrAlreadyServing) or is starting: wait for it a little.
func lockService(ctx context.Context, sock string) (func(), error) {
	path, err := paths.ServiceLock()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		unlock, ok, err := filelock.TryLock(path)
		if err != nil || ok {
			return unlock, err
		}
		if unixsock.Live(sock) || time.Now().After(deadline) {
			return nil, ErrAlreadyServing
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SecureRunDir returns the run directory (paths.RunDir) once it is private
// to this user: it holds the sockets and the VMs' sessions. One missing is
// created 0700; one of another user's, or shared (as /tmp is), is refused
// and left as it is (unixsock.SecureDir).
func SecureRunDir() (string, error) {
	dir, err := paths.RunDir()
	if err != nil {
		return "", err
	}
	if err := unixsock.SecureDir(dir); err != nil {
		if unixsock.IsNotPrivate(err) {
			return "", fmt.Errorf("refusing the run directory: %w; it is left as it is (set CAPSEM_RUN_DIR to a directory of your own)", err)
		}
		return "", fmt.Errorf("the run directory: %w", err)
	}
	return dir, nil
}

// Ensuring returns a client of the service that starts one (detached,
// logging to paths.ServiceLog) whenever it finds none answering. exe is
// capsem ("": this executable) and env the service's environment (nil:
// this process's).
func Ensuring(exe string, env []string) (*apiclient.ServiceClient, error) {
	sock, err := paths.ServiceSocket()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	start := func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if unixsock.Live(sock) {
			return nil // another call started it meanwhile
		}
		if err := StartDetached(exe, env); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for !unixsock.Live(sock) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("the capsem service did not start: %w (see %s)", ctx.Err(), logPathOrEmpty())
			case <-time.After(20 * time.Millisecond):
			}
		}
		return nil
	}
	return apiclient.NewServiceClient(sock, start), nil
}

// StartDetached starts `capsem service` in a session of its own, its
// output appended to the service log, and does not wait for it.
func StartDetached(exe string, env []string) error {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return fmt.Errorf("locating the capsem executable: %w", err)
		}
	}
	if _, err := SecureRunDir(); err != nil {
		return err
	}
	logPath, err := paths.ServiceLog()
	if err != nil {
		return err
	}
	logFile, err := logs.OpenRotated(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(exe, "service")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the capsem service: %w", err)
	}
	// It outlives this process; should it exit first, it is reaped here.
	go cmd.Wait()
	return nil
}

func logPathOrEmpty() string {
	p, _ := paths.ServiceLog()
	return p
}
