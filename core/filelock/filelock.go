// Package filelock is the advisory lock on a file that Capsem's processes
// coordinate with (one accelerator probe at a time, one service, one boot
// saved per configuration). The kernel drops a flock when its holder dies,
// so a crashed holder never leaves a lock behind.
package filelock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// pollInterval is how often Lock tries again while another holds the lock.
const pollInterval = 20 * time.Millisecond

// Lock takes the exclusive lock on path (created 0600, its directory 0700,
// when missing), waiting while another holds it, until ctx ends. The
// returned function releases it.
func Lock(ctx context.Context, path string) (func(), error) {
	for {
		unlock, ok, err := TryLock(path)
		if err != nil || ok {
			return unlock, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the lock %s: %w", path, context.Cause(ctx))
		case <-time.After(pollInterval):
		}
	}
}

// TryLock takes the lock on path if no one holds it; ok says whether it did.
func TryLock(path string) (unlock func(), ok bool, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("lock directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("lock: %w", err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == nil:
		return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		return nil, false, nil
	}
	f.Close()
	return nil, false, fmt.Errorf("lock %s: %w", path, err)
}
