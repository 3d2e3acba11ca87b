package logs

import (
	"strings"
	"testing"
)

func TestLineWriter(t *testing.T) {
	var got []string
	w := &LineWriter{Line: func(l string) { got = append(got, l) }}
	for _, chunk := range []string{"first ", "line\n\n  second\nthi", "rd\n", strings.Repeat("x", maxLine+1), "\nlast"} {
		if n, err := w.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	w.Flush()
	want := []string{"first line", "second", "third", strings.Repeat("x", maxLine+1), "last"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q\nwant %q", got, want)
	}
}
