package service

import (
	"slices"
	"testing"
)

func TestLineWriter(t *testing.T) {
	var lines []string
	w := &lineWriter{line: func(s string) { lines = append(lines, s) }}
	for _, chunk := range []string{"debian: ", "12 s\r\nnpm", ": 3 s\n", "\n", "partial"} {
		w.Write([]byte(chunk))
	}
	if want := []string{"debian: 12 s", "npm: 3 s", ""}; !slices.Equal(lines, want) {
		t.Errorf("lines %q, want %q", lines, want)
	}
}
