package unixsock

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerCredentials is the uid of the process at the other end of c
// (LOCAL_PEERCRED); macOS gives no pid with it, so pid is 0.
func peerCredentials(c *net.UnixConn) (uid, pid int, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Xucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptXucred(int(fd), unix.SOL_LOCAL, unix.LOCAL_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if cerr != nil {
		return 0, 0, cerr
	}
	return int(cred.Uid), 0, nil
}
