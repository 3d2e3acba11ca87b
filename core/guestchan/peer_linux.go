package guestchan

import (
	"os"

	"golang.org/x/sys/unix"
)

// portPeerConnected reports whether the host side of a virtio-serial port
// is open: the virtio_console driver flags POLLHUP while it is not (and a
// read then returns 0 bytes). The poll does not block, and goes through
// the raw descriptor so f keeps its non-blocking, poller-driven mode.
func portPeerConnected(f *os.File) (bool, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, err
	}
	var revents int16
	var perr error
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
		for {
			_, perr = unix.Poll(fds, 0)
			if perr != unix.EINTR {
				break
			}
		}
		revents = fds[0].Revents
	}); err != nil {
		return false, err
	}
	if perr != nil {
		return false, perr
	}
	return revents&unix.POLLHUP == 0, nil
}
