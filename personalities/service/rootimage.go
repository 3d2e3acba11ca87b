package service

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/guestfs"
)

// rootImage is the service's source of root images: base names a recipe
// of guestfs, whose image is made on first use (its build's progress
// lines told to progress) and reused while its inputs stay the same.
func rootImage(ctx context.Context, base string, progress func(string)) (string, error) {
	recipe, err := guestfs.LoadRecipe(base)
	if err != nil {
		return "", err
	}
	dir, err := paths.AssetsDir()
	if err != nil {
		return "", err
	}
	w := &lineWriter{line: progress}
	r, err := guestfs.EnsureRoot(ctx, guestfs.RootOptions{Dir: dir, Recipe: recipe, Progress: w,
		Logger: logs.From(ctx).With("base", base)})
	if err != nil {
		return "", fmt.Errorf("%w (capsem image build --base %s builds it and says more)", err, base)
	}
	return r.Image, nil
}

// lineWriter calls line with each whole line written to it.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	line func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(bytes.TrimRight(w.buf[:i], "\r")))
		w.buf = w.buf[i+1:]
	}
}
