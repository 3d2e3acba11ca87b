package ledger

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCapField checks the truncation invariants for arbitrary limits (the
// fuzzer's inputs are far below MaxFieldBytes, so the limit is fuzzed too)
// and for CapField itself on an input blown past the cap.
func FuzzCapField(f *testing.F) {
	for _, s := range []string{"", "a", "é", "€uro", "😀😀", "\x80\x80\x80\x80", "a\xffb", "ab\xe2\x82"} {
		f.Add(s, uint16(1))
		f.Add(s, uint16(3))
	}
	f.Fuzz(func(t *testing.T, s string, n uint16) {
		limit := int(n % 64)
		check(t, s, capString(s, limit), limit)

		big := strings.Repeat("x", MaxFieldBytes-limit) + s
		check(t, big, CapField(big), MaxFieldBytes)
	})
}

func check(t *testing.T, in, out string, limit int) {
	t.Helper()
	if len(out) > limit {
		t.Fatalf("len(out) = %d > limit %d", len(out), limit)
	}
	if !strings.HasPrefix(in, out) {
		t.Fatalf("out is not a prefix of in")
	}
	if len(in) <= limit {
		if out != in {
			t.Fatalf("input within the limit was changed")
		}
		return
	}
	if utf8.ValidString(in) {
		if !utf8.ValidString(out) {
			t.Fatalf("valid input %q gave invalid output %q", in, out)
		}
		// Only the rune straddling the limit may go.
		if len(out) < limit-(utf8.UTFMax-1) {
			t.Fatalf("cut too much: %d bytes for limit %d", len(out), limit)
		}
		if rest := in[len(out):]; !utf8.FullRuneInString(rest) || !utf8.ValidString(rest) {
			t.Fatalf("cut inside a rune")
		}
	}
}
