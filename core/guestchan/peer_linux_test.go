package guestchan

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// portPeerConnected reads POLLHUP, the flag virtio_console raises while the
// host side is closed; a socket whose peer hung up raises it too.
func TestPortPeerConnected(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	local, peer := os.NewFile(uintptr(fds[0]), "local"), os.NewFile(uintptr(fds[1]), "peer")
	defer local.Close()
	if ok, err := portPeerConnected(local); err != nil || !ok {
		t.Fatalf("an open peer: %v %v", ok, err)
	}
	peer.Close()
	if ok, err := portPeerConnected(local); err != nil || ok {
		t.Fatalf("a peer that hung up: %v %v", ok, err)
	}
}
