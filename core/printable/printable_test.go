package printable

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"plain", "hello, world", "hello, world"},
		{"lines and tabs kept", "a\tb\nc\n", "a\tb\nc\n"},
		{"console line ends kept", "boot\r\nok\r\n", "boot\r\nok\r\n"},
		{"lone carriage return", "progress\rspoof", `progress\rspoof`},
		{"carriage return at the end", "x\r", `x\r`},
		{"OSC 52 clipboard write", "\x1b]52;c;ZXZpbA==\x07", `\x1b]52;c;ZXZpbA==\x07`},
		{"OSC 0 window title", "\x1b]0;pwned\x1b\\", `\x1b]0;pwned\x1b\\`},
		{"backslash", `C:\x1b`, `C:\\x1b`},
		{"NUL and DEL", "a\x00b\x7f", `a\x00b\x7f`},
		{"C1 CSI as UTF-8", "a\u009b31mred", `a\u009b31mred`},
		{"raw 8-bit CSI", "a\x9b31m", `a\x9b31m`},
		{"invalid UTF-8", "\xff\xfe", `\xff\xfe`},
		{"bidi override", "abc\u202Edef", `abc\u202edef`},
		{"line separator", "a\u2028b", `a\u2028b`},
		{"other scripts kept", "héllo 世界 🙂 \ufffd", "héllo 世界 🙂 \ufffd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Text(tt.in); got != tt.want {
				t.Errorf("Text(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestLine(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"plain", "ls -la", "ls -la"},
		{"newline and tab escaped", "a\tb\nc", `a\tb\nc`},
		{"console line end escaped", "ok\r\n", `ok\r\n`},
		{"OSC 0", "\x1b]0;title\x07", `\x1b]0;title\x07`},
		{"backslash n is not a newline", `a\nb`, `a\\nb`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Line(tt.in); got != tt.want {
				t.Errorf("Line(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestJSON(t *testing.T) {
	in := map[string]string{"log": "\x1b]0;t\x07 \u009b \u202e \x7f é"}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	got := JSON(b)
	want := `{"log":"\u001b]0;t\u0007 \u009b \u202e \u007f é"}`
	if string(got) != want {
		t.Fatalf("JSON = %s, want %s", got, want)
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || !reflect.DeepEqual(back, in) {
		t.Fatalf("JSON does not decode to the same value: %q, %v", back, err)
	}
}

// unescape reverses escape; the fuzz target proves with it that no two
// inputs print the same.
func unescape(t *testing.T, s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			out = append(out, s[i])
			continue
		}
		if i+1 >= len(s) {
			t.Fatalf("%q ends inside an escape", s)
		}
		i++
		switch s[i] {
		case '\\':
			out = append(out, '\\')
		case 'n':
			out = append(out, '\n')
		case 't':
			out = append(out, '\t')
		case 'r':
			out = append(out, '\r')
		case 'x', 'u':
			n := 2
			if s[i] == 'u' {
				n = 4
			}
			if i+n >= len(s) {
				t.Fatalf("%q: short escape at %d", s, i)
			}
			v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil {
				t.Fatalf("%q: bad escape at %d: %v", s, i, err)
			}
			if n == 2 {
				out = append(out, byte(v))
			} else {
				out = utf8.AppendRune(out, rune(v))
			}
			i += n
		default:
			t.Fatalf("%q: unknown escape \\%c", s, s[i])
		}
	}
	return string(out)
}

// checkShown fails when shown holds anything a terminal would act on
// rather than show: C0 controls (but newline and tab, and a carriage
// return before a newline, when keepLines), DEL, C1 controls, the
// characters hidden reports, or bytes that are not UTF-8.
func checkShown(t *testing.T, in, shown string, keepLines bool) {
	t.Helper()
	if !utf8.ValidString(shown) {
		t.Fatalf("escaping %q gave %q: not UTF-8", in, shown)
	}
	for i, r := range shown {
		allowed := keepLines && (r == '\n' || r == '\t' || r == '\r' && i+1 < len(shown) && shown[i+1] == '\n')
		if (r < 0x20 || r == 0x7f || hidden(r)) && !allowed {
			t.Fatalf("escaping %q gave %q: %U at %d", in, shown, r, i)
		}
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"", "plain", "\x1b]52;c;ZXZpbA==\x07", "\x1b]0;t\x1b\\", `\x1b`, "a\r\nb\rc\n\t",
		"\xff\x9b\u009b\u202e\u2028", "\\\\x00", "\r", "\r\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, keepLines := range []bool{true, false} {
			shown := escape(s, keepLines)
			checkShown(t, s, shown, keepLines)
			if back := unescape(t, shown); back != s {
				t.Fatalf("escaping %q gave %q, which reads back as %q", s, shown, back)
			}
			if escape(s, keepLines) != shown {
				t.Fatal("escaping is not deterministic")
			}
		}
	})
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{"", "\x1b]52;c;ZXZpbA==\x07", "\u009b\u202e\x7f", "\xff", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Marshal replaces invalid UTF-8 rather than failing, so every
		// input is a case.
		b, err := json.Marshal(map[string]any{"k" + s: []string{s}})
		if err != nil {
			t.Fatal(err)
		}
		got := JSON(b)
		checkShown(t, s, string(got), false)
		var want, back any
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got, &back); err != nil || !reflect.DeepEqual(back, want) {
			t.Fatalf("JSON(%s) = %s decodes to %v (%v), want %v", b, got, back, err, want)
		}
	})
}
