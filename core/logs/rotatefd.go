package logs

import (
	"context"
	"fmt"
	"os"
	"time"
)

// RotateFD keeps the log at path, which descriptor fd writes to (a
// process's stderr, which its own log and a crash both go to), within max
// bytes while ctx lasts: every interval it looks at the file's size and,
// past max, moves it to path.1 and puts a new file under fd. Nothing that
// writes to fd needs to know.
func RotateFD(ctx context.Context, path string, fd int, max int64, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := rotateFDOnce(path, fd, max); err != nil {
			From(ctx).Warn("rotating a log", "path", path, "err", err)
		}
	}
}

func rotateFDOnce(path string, fd int, max int64) error {
	st, err := os.Stat(path)
	if err != nil || st.Size() <= max {
		return nil
	}
	if err := os.Rename(path, path+".1"); err != nil {
		return fmt.Errorf("rotating %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("rotating %s: %w", path, err)
	}
	defer f.Close()
	return replaceFD(int(f.Fd()), fd)
}
