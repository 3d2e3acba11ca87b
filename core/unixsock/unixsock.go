// Package unixsock creates the Unix sockets Capsem serves its local APIs
// on (the service, each per-VM process, a gateway, the policy-reload
// endpoints): only the owner may connect, and an old path is replaced only
// when it is a socket, never a file someone put there. Its clients connect
// with Dial, which talks only to a server of the same user, and the
// directories that hold the sockets are made private with SecureDir.
package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Listen listens on path with mode 0600. A socket left at path by a process
// that died is removed first; anything else there is an error that names
// it. The parent directory is created 0700 when missing. Closing the
// listener removes the socket.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating the directory of %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// The directories these sockets live in are the owner's (0700); the
	// mode closes the socket itself to anyone else the directory admits.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("securing %s: %w", path, err)
	}
	return ln, nil
}

// removeStale removes path when it is a socket and does nothing when it is
// missing.
func removeStale(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	if st.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("refusing to replace %s: it is a %s, not a socket", path, describe(st.Mode()))
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the old socket %s: %w", path, err)
	}
	return nil
}

func describe(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	}
	return "special file"
}

// Live reports whether something accepts connections on path: one whose
// queue of connections is full (busy, or under a flood of them) counts.
func Live(path string) bool {
	c, err := net.Dial("unix", path)
	if errors.Is(err, syscall.EAGAIN) {
		return true
	}
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// dialWaiting connects to the socket at path. A listener whose queue of
// connections is full refuses at once (EAGAIN) rather than making the
// caller wait in it: dialWaiting tries again, a little later each time,
// until ctx ends, so that a server slow to accept (under a flood of
// connections) is waited for, not taken for none.
func dialWaiting(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	backoff := 5 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "unix", path)
		if !errors.Is(err, syscall.EAGAIN) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (its queue of connections stayed full)", err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
}
