package logs

import (
	"bytes"
	"strings"
	"sync"
)

// maxLine bounds the part of a line kept while waiting for its end: a line
// that never ends is still passed on, in pieces.
const maxLine = 4096

// LineWriter calls Line with each line written to it, trimmed of spaces
// (blank lines are skipped). It is safe for concurrent use; Flush passes
// on a last line without its newline.
type LineWriter struct {
	Line func(line string)

	mu      sync.Mutex
	partial []byte
}

func (w *LineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.emit(w.partial[:i])
		w.partial = w.partial[i+1:]
	}
	if len(w.partial) > maxLine {
		w.emit(w.partial)
		w.partial = nil
	}
	return len(p), nil
}

// Flush passes on what is left of an unfinished line.
func (w *LineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.emit(w.partial)
		w.partial = nil
	}
}

func (w *LineWriter) emit(line []byte) {
	if s := strings.TrimSpace(string(line)); s != "" {
		w.Line(s)
	}
}
