//go:build !linux

package workspacefs

import (
	"context"
	"io"
	"log/slog"
)

// FS is a 9P2000.L server for one workspace directory (Linux only).
type FS struct{}

// Open reports ErrNotSupported: the server needs Linux's O_PATH and
// /proc/self/fd.
func Open(ctx context.Context, root string, lim Limits, log *slog.Logger) (*FS, error) {
	return nil, ErrNotSupported
}

// Usage returns zero usage.
func (fs *FS) Usage() Usage { return Usage{} }

// Serve closes conn and reports ErrNotSupported.
func (fs *FS) Serve(ctx context.Context, conn io.ReadWriteCloser) error {
	conn.Close()
	return ErrNotSupported
}

// Close does nothing.
func (fs *FS) Close() error { return nil }
