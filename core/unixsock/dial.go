package unixsock

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
)

// Dial connects to the socket at path only if the server is this user's,
// and before anything is sent: the socket's directory is private to this
// user (CheckPrivateDir), the socket belongs to this user, and the
// process that listens on it runs as this user (its credentials, from the
// kernel). Otherwise the connection is closed unused and the error is a
// NotPrivateError that names the path and the reason. A missing directory
// or socket is an ordinary error: no server is there yet.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	if err := CheckPrivateDir(filepath.Dir(path)); err != nil {
		if IsNotPrivate(err) {
			return nil, fmt.Errorf("refusing to connect to %s: %w", path, err)
		}
		return nil, fmt.Errorf("connecting to %s: %w", path, err)
	}
	st, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", path, err)
	}
	if st.Mode().Type() != fs.ModeSocket {
		return nil, fmt.Errorf("refusing to connect to %s: %w", path,
			&NotPrivateError{Path: path, Reason: "it is a " + describe(st.Mode()) + ", not a socket"})
	}
	if uid, me := ownerOf(st), os.Geteuid(); uid != me {
		return nil, fmt.Errorf("refusing to connect to %s: %w", path,
			&NotPrivateError{Path: path, Reason: fmt.Sprintf("the socket belongs to uid %d, not to you (uid %d)", uid, me)})
	}
	c, err := dialWaiting(ctx, path)
	if err != nil {
		return nil, err
	}
	// The checks above can be raced (a socket replaced after them); the
	// kernel's record of who listens cannot.
	uid, pid, err := peerCredentials(c.(*net.UnixConn))
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("refusing to connect to %s: %w", path,
			&NotPrivateError{Path: path, Reason: fmt.Sprintf("the credentials of the process serving it are unknown: %v", err)})
	}
	if me := os.Geteuid(); uid != me {
		c.Close()
		return nil, fmt.Errorf("refusing to connect to %s: %w", path,
			&NotPrivateError{Path: path, Reason: fmt.Sprintf("the process serving it (pid %d) runs as uid %d, not as you (uid %d)", pid, uid, me)})
	}
	return c, nil
}
