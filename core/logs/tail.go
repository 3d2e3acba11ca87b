package logs

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// Bounds of Tail.
const (
	// TailMaxBytes is how much of a log's end Tail reads.
	TailMaxBytes = 1 << 20
	// TailMaxLines bounds the lines asked for.
	TailMaxLines = 100000
	// DefaultTailLines is what Tail returns when asked for 0 lines.
	DefaultTailLines = 200
)

// Tail returns the last n lines (DefaultTailLines when n is 0) of the log
// at path that contain grep (every line when grep is ""), from its last
// TailMaxBytes, read across a rotation (path.1, then path). A missing log
// is an error naming it.
func Tail(path string, n int, grep string) (string, error) {
	if n == 0 {
		n = DefaultTailLines
	}
	if n < 0 || n > TailMaxLines {
		return "", fmt.Errorf("tail %d: want a number of lines from 1 to %d", n, TailMaxLines)
	}
	b, err := tailBytes(path, TailMaxBytes)
	if err != nil {
		return "", err
	}
	if room := TailMaxBytes - len(b); room > 0 {
		// The log rotated not long ago: its start is in path.1.
		if older, err := tailBytes(path+".1", room); err == nil && len(older) > 0 {
			if older[len(older)-1] != '\n' {
				older = append(older, '\n')
			}
			b = append(older, b...)
		}
	}
	text := strings.TrimRight(string(b), "\n")
	if text == "" {
		return "", nil
	}
	lines := strings.Split(text, "\n")
	if grep != "" {
		kept := lines[:0]
		for _, l := range lines {
			if strings.Contains(l, grep) {
				kept = append(kept, l)
			}
		}
		lines = kept
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 0 {
		return "", nil
	}
	return strings.Join(lines, "\n") + "\n", nil
}

// tailBytes is the last max bytes of the file at path.
func tailBytes(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > int64(max) {
		if _, err := f.Seek(st.Size()-int64(max), io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, int64(max)))
}

// MaxLogBytes is the size past which OpenRotated starts a new file.
const MaxLogBytes = 16 << 20

// OpenRotated opens the log at path for appending, first moving it to
// path.1 (replacing an older one) when it has grown past MaxLogBytes.
func OpenRotated(path string) (*os.File, error) {
	if st, err := os.Stat(path); err == nil && st.Size() > MaxLogBytes {
		if err := os.Rename(path, path+".1"); err != nil {
			return nil, fmt.Errorf("rotating %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the log %s: %w", path, err)
	}
	return f, nil
}
