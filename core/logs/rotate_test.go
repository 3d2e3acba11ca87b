package logs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRotatingWriter: whatever is written, the log and its one predecessor
// stay within the bound (plus one write), and Tail reads across them.
func TestRotatingWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	w, err := OpenRotating(path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if _, err := fmt.Fprintf(w, "%s line %03d\n", strings.Repeat("x", 40), i); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil || st.Size() > 1000 || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, st, err)
		}
	}
	if _, err := os.Stat(path + ".2"); err == nil {
		t.Fatal("a second predecessor is kept")
	}
	tail, err := Tail(path, 30, "")
	if err != nil || !strings.HasSuffix(tail, "line 499\n") || strings.Count(tail, "\n") != 30 {
		t.Fatalf("tail across the rotation: %q %v", tail, err)
	}
	if _, err := OpenRotating(path, 0); err == nil {
		t.Fatal("a zero bound was accepted")
	}
}

// TestRotateFD: a descriptor's log past its bound moves aside and the
// descriptor writes to a new file, without its writer knowing.
func TestRotateFD(t *testing.T) {
	path := filepath.Join(t.TempDir(), "process.log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString(strings.Repeat("old\n", 1000))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { RotateFD(ctx, path, int(f.Fd()), 100, 10*time.Millisecond); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path + ".1"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not rotated")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	f.WriteString("new\n")
	if b, _ := os.ReadFile(path); string(b) != "new\n" {
		t.Fatalf("the descriptor writes %q to the new log", b)
	}
	if st, _ := os.Stat(path + ".1"); st.Size() != 4000 {
		t.Fatalf("the old log has %d bytes", st.Size())
	}
}
