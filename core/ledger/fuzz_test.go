package ledger

import (
	"encoding/json"
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

// FuzzAnswerCells checks the bounds of cut cells against encoding/json
// itself: a text's JSON length is what it writes, a text cut to a budget
// is a prefix within it that splits no rune, a blob's prefix encodes
// within its budget, and a cell boundCell keeps whole fits its bound.
func FuzzAnswerCells(f *testing.F) {
	for _, s := range []string{"", "a", "é", "<&>", "\"\\\n\r\t\b\f\x01\x1f\x7f", "\u2028\u2029", "\xff\xfe", "ab\xe2\x82", "😀x"} {
		f.Add(s, uint16(8))
		f.Add(s, uint16(70))
	}
	f.Fuzz(func(t *testing.T, s string, budget uint16) {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if n := jsonStringLen(s); n != len(b) {
			t.Fatalf("jsonStringLen(%q) = %d, encoding/json wrote %d: %s", s, n, len(b), b)
		}
		p := cutText(s, int(budget))
		if !strings.HasPrefix(s, p) {
			t.Fatalf("cutText(%q) = %q, not a prefix", s, p)
		}
		if n := jsonStringLen(p); n > max(int(budget), 2) {
			t.Fatalf("cutText(%q, %d) = %q takes %d", s, budget, p, n)
		}
		if utf8.ValidString(s) && !utf8.ValidString(p) {
			t.Fatalf("cutText(%q) = %q split a rune", s, p)
		}
		if jsonStringLen(s) <= int(budget) && p != s {
			t.Fatalf("cutText(%q, %d) cut a text that fits", s, budget)
		}
		for k := 0; k <= len(s); k++ {
			if tr := trimPartialRune(s[:k]); !strings.HasPrefix(s, tr) || (utf8.ValidString(s) && !utf8.ValidString(tr)) || len(tr) < k-(utf8.UTFMax-1) {
				t.Fatalf("trimPartialRune(%q) = %q", s[:k], tr)
			}
		}
		bound := max(int(budget), minCellBytes)
		for _, v := range []any{s, []byte(s)} {
			cell, cost := boundCell(v, -1, bound)
			enc, err := json.Marshal(cell)
			if err != nil {
				t.Fatal(err)
			}
			if c, ok := cell.(CutValue); ok {
				if c.Bytes != int64(len(s)) {
					t.Fatalf("cut %q: whole length %d", s, c.Bytes)
				}
				if cost > bound {
					t.Fatalf("cut %q: costs %d over %d", s, cost, bound)
				}
				continue
			}
			if len(enc) != cost || cost > bound {
				t.Fatalf("%T %q kept whole: costs %d, encodes to %d, bound %d", v, s, cost, len(enc), bound)
			}
		}
	})
}
