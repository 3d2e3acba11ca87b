package logs

import (
	"fmt"
	"os"
	"sync"
)

// Bounds of the logs a guest can write into while its VM runs (the serial
// console, the per-VM process log): each is at most its bound, plus one
// predecessor (path.1) of the same size, whatever the guest writes.
const (
	ConsoleLogMaxBytes = 8 << 20
	ProcessLogMaxBytes = MaxLogBytes
)

// RotatingWriter appends to the log at path and, when a write would take
// it past max bytes, first moves it to path.1 (replacing an older one) and
// starts a new one: the two never hold more than about 2×max. It is safe
// for concurrent use.
type RotatingWriter struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
}

// OpenRotating opens (creating, 0600) the log at path for appending.
func OpenRotating(path string, max int64) (*RotatingWriter, error) {
	if max <= 0 {
		return nil, fmt.Errorf("log %s: a bound of %d bytes", path, max)
	}
	w := &RotatingWriter{path: path, max: max}
	if err := w.open(); err != nil {
		return nil, err
	}
	if w.size > max {
		if err := w.rotate(); err != nil {
			w.f.Close()
			return nil, err
		}
	}
	return w, nil
}

func (w *RotatingWriter) open() error {
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening the log %s: %w", w.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("opening the log %s: %w", w.path, err)
	}
	w.f, w.size = f, st.Size()
	return nil
}

func (w *RotatingWriter) rotate() error {
	w.f.Close()
	if err := os.Rename(w.path, w.path+".1"); err != nil {
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	return w.open()
}

// Write appends p, rotating first when p would take the log past its bound.
func (w *RotatingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return 0, os.ErrClosed
	}
	if w.size > 0 && w.size+int64(len(p)) > w.max {
		if err := w.rotate(); err != nil {
			w.f = nil
			return 0, err
		}
	}
	n, err := w.f.Write(p)
	w.size += int64(n)
	return n, err
}

// Close closes the log.
func (w *RotatingWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}
