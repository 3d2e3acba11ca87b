package netstack

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"

	"github.com/capsem/capsem/core/guestwire"
)

// Ethernet frame bounds on the link: a header of 14 bytes, and at most the
// MTU plus that header and a VLAN tag.
const (
	ethHeaderLen = 14
	frameSlack   = ethHeaderLen + 4
)

// guestMAC is the only source address a frame from the guest may carry:
// the switch learns every source it sees and never forgets one, so frames
// from made-up addresses would grow its table without bound.
var guestMAC = func() [6]byte {
	hw, err := net.ParseMAC(guestwire.NetGuestMAC)
	if err != nil || len(hw) != 6 {
		panic("guestwire.NetGuestMAC is not a MAC address")
	}
	return [6]byte(hw)
}()

// validFrame reports whether an Ethernet frame from the guest may reach
// the switch: a whole header, within the link's size, from the guest's
// own address.
func validFrame(frame []byte, max int) bool {
	return len(frame) >= ethHeaderLen && len(frame) <= max && [6]byte(frame[6:12]) == guestMAC
}

// frameFilter sits between the hypervisor's stream (frames behind a 4-byte
// big-endian length) and the switch, which trusts what it reads: a frame
// shorter than an Ethernet header would make it index past the end, a
// length of gigabytes would make it allocate that much, and every new
// source address would stay in its table. Frames out of bounds or from
// another address are skipped and counted, so a hostile guest (or
// hypervisor) costs the host a counter, not the process. Writes pass
// through.
type frameFilter struct {
	net.Conn
	max     int    // largest frame accepted
	pending []byte // the rest of the current frame, length prefix first
	buf     []byte
	dropped atomic.Int64
}

func newFrameFilter(c net.Conn, mtu int) *frameFilter {
	max := mtu + frameSlack
	return &frameFilter{Conn: c, max: max, buf: make([]byte, 4+max)}
}

func (f *frameFilter) Read(p []byte) (int, error) {
	for len(f.pending) == 0 {
		if err := f.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, f.pending)
	f.pending = f.pending[n:]
	return n, nil
}

// next reads one frame; a frame out of bounds is skipped.
func (f *frameFilter) next() error {
	if _, err := io.ReadFull(f.Conn, f.buf[:4]); err != nil {
		return err
	}
	size := int64(binary.BigEndian.Uint32(f.buf[:4]))
	if size < ethHeaderLen || size > int64(f.max) {
		f.dropped.Add(1)
		if _, err := io.CopyN(io.Discard, f.Conn, size); err != nil {
			return fmt.Errorf("skipping a %d-byte frame: %w", size, err)
		}
		return nil
	}
	if _, err := io.ReadFull(f.Conn, f.buf[4:4+size]); err != nil {
		return err
	}
	if !validFrame(f.buf[4:4+size], f.max) {
		f.dropped.Add(1)
		return nil
	}
	f.pending = f.buf[:4+size]
	return nil
}

// datagramFilter is frameFilter for a link of one frame per datagram.
type datagramFilter struct {
	net.Conn
	max     int
	dropped *atomic.Int64
}

func (f datagramFilter) Read(p []byte) (int, error) {
	for {
		n, err := f.Conn.Read(p)
		if err != nil {
			return n, err
		}
		if validFrame(p[:n], f.max) {
			return n, nil
		}
		f.dropped.Add(1)
	}
}
