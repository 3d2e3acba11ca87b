package workspacefs

import (
	"sync"

	"golang.org/x/sys/unix"
)

const blockSize = 4096

func roundUp(n int64) int64   { return (n + blockSize - 1) &^ (blockSize - 1) }
func roundDown(n int64) int64 { return n &^ (blockSize - 1) }

// accountant keeps the workspace's usage. Its mutex guards arithmetic only;
// no syscall runs under it.
type accountant struct {
	mu             sync.Mutex
	lim            Limits
	bytes, inodes  int64 // charged usage
	reservedBytes  int64 // granted to writes and creates in progress
	reservedInodes int64
	// While a rescan runs, growth is also added here so that the rescan's
	// result can be made conservative (see rescan).
	scanning       bool
	scanGrowBytes  int64
	scanGrowInodes int64
}

// roomLocked is what the guest may still take: the bound's room and the
// host's room above the reserve, less what is reserved.
func (a *accountant) roomLocked(hostAvail int64) int64 {
	bound := a.lim.Bytes - a.bytes
	host := hostAvail - a.lim.HostReserve
	return min(bound, host) - a.reservedBytes
}

// reserveBytes grants up to want bytes (0 when there is no room).
func (a *accountant) reserveBytes(want, hostAvail int64) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	room := a.roomLocked(hostAvail)
	if room <= 0 {
		return 0
	}
	g := min(want, room)
	a.reservedBytes += g
	return g
}

// reserveInode grants one inode and one block, or reports false.
func (a *accountant) reserveInode(hostAvail int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inodes+a.reservedInodes+1 > a.lim.Inodes || a.roomLocked(hostAvail) < blockSize {
		return false
	}
	a.reservedInodes++
	a.reservedBytes += blockSize
	return true
}

// settle ends a reservation and charges what was measured.
func (a *accountant) settle(reservedBytes, reservedInodes, deltaBytes, deltaInodes int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.reservedBytes -= reservedBytes
	a.reservedInodes -= reservedInodes
	a.bytes += deltaBytes
	a.inodes += deltaInodes
	if a.scanning {
		if deltaBytes > 0 {
			a.scanGrowBytes += deltaBytes
		}
		if deltaInodes > 0 {
			a.scanGrowInodes += deltaInodes
		}
	}
}

func (a *accountant) credit(bytes, inodes int64) { a.settle(0, 0, -bytes, -inodes) }

func (a *accountant) snapshot() (bytes, inodes int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bytes, a.inodes
}

// statBytes is what one inode takes on the host.
func statBytes(st *unix.Stat_t) int64 { return int64(st.Blocks) * 512 }
