package workspacefs

import (
	"errors"

	"github.com/capsem/capsem/core/guestwire"
)

// Limits bounds what one workspace may take on the host.
type Limits struct {
	// Bytes bounds the bytes the workspace takes on the host: the
	// allocated blocks (st_blocks*512) of its files, directories, symlinks
	// and nodes, each inode counted once.
	Bytes int64
	// Inodes bounds the number of files, directories, symlinks and nodes.
	Inodes int64
	// HostReserve is free space on the host filesystem the guest can never
	// take (0 = DefaultHostReserve).
	HostReserve int64
}

// Defaults for a workspace whose limits are not configured.
const (
	DefaultBytes       = 16 << 30
	DefaultInodes      = 1 << 20
	DefaultHostReserve = 1 << 30
)

// Caps on what one guest can make the server hold.
const (
	// MaxConns is the number of connections Serve handles at once.
	MaxConns = 2
	// MaxFids bounds the File objects (each with up to two host
	// descriptors) one connection holds, so one cannot starve the other;
	// see also the RLIMIT_NOFILE cap.
	MaxFids = 16384
	// MaxMessage bounds a whole 9P message (the guest mounts with this
	// msize); Tversion's msize is clamped to it.
	MaxMessage = guestwire.WorkspaceMsize
	// MaxInflight bounds the requests a connection has unanswered.
	MaxInflight = 32
)

// Usage is the workspace's usage as the FS counts it.
type Usage struct {
	Bytes, Inodes int64
	Limits        Limits
	// HostAvailable is the host filesystem's free space for the server
	// (f_bavail*f_bsize), before HostReserve is taken off.
	HostAvailable int64
}

// ErrNotSupported is returned by Open on an OS other than Linux.
var ErrNotSupported = errors.New("workspacefs: not supported on this OS (Linux only)")

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("workspacefs: closed")

func (l Limits) withDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = DefaultBytes
	}
	if l.Inodes <= 0 {
		l.Inodes = DefaultInodes
	}
	if l.HostReserve <= 0 {
		l.HostReserve = DefaultHostReserve
	}
	return l
}
