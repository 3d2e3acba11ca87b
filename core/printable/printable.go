// Package printable makes text that a guest controls (its console, the
// ledger rows it causes, its doctor results, its error messages) safe to
// show on a person's terminal: control characters are shown escaped,
// never sent, so the guest cannot write the clipboard (OSC 52), retitle
// the window (OSC 0) or move the cursor over what the person reads. The
// escaping keeps every input distinguishable: a backslash is escaped too,
// so two different inputs never print the same.
//
// Escapes: \\ for a backslash; \n, \t and \r; \xNN for any other C0
// control, DEL, and each byte that is not UTF-8; \uNNNN for a C1 control,
// a bidirectional-text control and the Unicode line and paragraph
// separators.
package printable

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Text escapes s for a terminal, keeping its lines: newline, tab, and a
// carriage return just before a newline (as a serial console ends its
// lines) are left as they are.
func Text(s string) string { return escape(s, true) }

// Line escapes s to print on one line or in one table cell: newline, tab
// and carriage return are escaped too.
func Line(s string) string { return escape(s, false) }

const hexDigits = "0123456789abcdef"

func escape(s string, keepLines bool) string {
	if isSafe(s, keepLines) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/8)
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '\\':
				b.WriteString(`\\`)
			case keepLines && (c == '\n' || c == '\t' || c == '\r' && i+1 < len(s) && s[i+1] == '\n'):
				b.WriteByte(c)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\t':
				b.WriteString(`\t`)
			case c == '\r':
				b.WriteString(`\r`)
			case c < 0x20 || c == 0x7f:
				writeHexByte(&b, c)
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			writeHexByte(&b, c)
		case hidden(r):
			b.WriteString(`\u`)
			for shift := 12; shift >= 0; shift -= 4 {
				b.WriteByte(hexDigits[r>>shift&0xf])
			}
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func writeHexByte(b *strings.Builder, c byte) {
	b.WriteString(`\x`)
	b.WriteByte(hexDigits[c>>4])
	b.WriteByte(hexDigits[c&0xf])
}

// isSafe reports whether escape would return s unchanged: most text is, and
// is then not copied.
func isSafe(s string, keepLines bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			plain := c >= 0x20 && c != 0x7f && c != '\\'
			kept := keepLines && (c == '\n' || c == '\t')
			if !plain && !kept {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || hidden(r) {
			return false
		}
		i += size
	}
	return true
}

// hidden reports whether r, though valid UTF-8, changes what a terminal
// shows rather than showing itself: C1 controls (U+009B is CSI to many
// terminals), the controls that reorder bidirectional text, and the line
// and paragraph separators.
func hidden(r rune) bool {
	return r >= 0x80 && r <= 0x9f || r == 0x2028 || r == 0x2029 || unicode.Is(unicode.Bidi_Control, r)
}

// JSON makes the output of encoding/json safe for a terminal. The encoder
// already escapes C0 controls and replaces bytes that are not UTF-8, but
// leaves DEL, C1 controls and bidirectional-text controls as they are;
// JSON writes them as \uNNNN escapes, which decode to the same value. It
// relies on these characters appearing only inside JSON strings, as they
// do in an encoder's output.
func JSON(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c == 0x7f {
				out = append(out, `\u007f`...)
			} else {
				out = append(out, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if hidden(r) {
			out = append(out, '\\', 'u')
			for shift := 12; shift >= 0; shift -= 4 {
				out = append(out, hexDigits[r>>shift&0xf])
			}
		} else {
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}
