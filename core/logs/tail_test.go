package logs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	var b strings.Builder
	for i := range 300 {
		if i%2 == 0 {
			b.WriteString("even ")
		}
		b.WriteString("line\n")
	}
	os.WriteFile(path, []byte(b.String()), 0o600)
	for _, tc := range []struct {
		n     int
		grep  string
		lines int
		err   string
	}{
		{n: 0, lines: DefaultTailLines},
		{n: 5, lines: 5},
		{n: 1000, lines: 300},
		{n: 1000, grep: "even", lines: 150},
		{n: 3, grep: "odd", lines: 0},
		{n: -1, err: "want a number of lines"},
		{n: TailMaxLines + 1, err: "want a number of lines"},
	} {
		got, err := Tail(path, tc.n, tc.grep)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Tail(%d, %q) error %v, want %q", tc.n, tc.grep, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Count(got, "\n") != tc.lines {
			t.Errorf("Tail(%d, %q) = %d lines (%v), want %d", tc.n, tc.grep, strings.Count(got, "\n"), err, tc.lines)
		}
	}
	if _, err := Tail(filepath.Join(t.TempDir(), "missing"), 1, ""); err == nil {
		t.Error("a missing log gave no error")
	}
	// Only the last TailMaxBytes are read.
	big := filepath.Join(t.TempDir(), "big")
	os.WriteFile(big, []byte(strings.Repeat("x", TailMaxBytes)+"\nlast\n"), 0o600)
	if got, err := Tail(big, 1, ""); err != nil || got != "last\n" {
		t.Errorf("Tail(big) = %q, %v", got, err)
	}
}

func TestOpenRotated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "service.log")
	os.WriteFile(path, make([]byte, MaxLogBytes+1), 0o600)
	f, err := OpenRotated(path)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("fresh\n")
	f.Close()
	if b, _ := os.ReadFile(path); string(b) != "fresh\n" {
		t.Errorf("new log holds %d bytes", len(b))
	}
	if st, err := os.Stat(path + ".1"); err != nil || st.Size() != MaxLogBytes+1 {
		t.Errorf("rotated log: %v", err)
	}
}
