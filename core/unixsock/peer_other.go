//go:build !linux && !darwin

package unixsock

import (
	"errors"
	"net"
)

// peerCredentials: only Linux and macOS have them read; elsewhere Dial refuses.
func peerCredentials(*net.UnixConn) (uid, pid int, err error) {
	return 0, 0, errors.New("reading a peer's credentials is implemented only on Linux and macOS")
}
