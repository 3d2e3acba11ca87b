package builtintools

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseTarget: an accepted URL is http(s) with a host and a port in
// range, whatever the agent passed; a refusal says what is wrong.
func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"https://example.com/a?b", "http://[::1]:8080/", "ftp://x", "example.com", "http://:80", "http://a:99999", "  ", "http://ex%41mple.com", "HTTP://A.B.", "http://[fe80::1%25eth0]/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		tg, err := parseTarget(raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if s := strings.ToLower(tg.url.Scheme); s != "http" && s != "https" {
			t.Fatalf("accepted scheme %q", tg.url.Scheme)
		}
		if tg.host == "" || tg.port < 1 || tg.port > 65535 {
			t.Fatalf("accepted host %q port %d from %q", tg.host, tg.port, raw)
		}
		if tg.host != strings.ToLower(tg.host) {
			t.Fatalf("host %q not normalized", tg.host)
		}
	})
}

// FuzzDecodeText: the text handed to the agent is always valid UTF-8, and
// valid UTF-8 input comes back unchanged.
func FuzzDecodeText(f *testing.F) {
	f.Add([]byte("caf\xe9 \x80 \x9d"), "windows-1252")
	f.Add([]byte("plain"), "")
	f.Add([]byte("\xff\xfe"), "utf-8")
	f.Add([]byte("h\xc3\xa9"), "latin1")
	f.Fuzz(func(t *testing.T, body []byte, charset string) {
		text, ok := decodeText(body, charset)
		if !utf8.ValidString(text) {
			t.Fatalf("invalid UTF-8 out of %q (%s)", body, charset)
		}
		if utf8.Valid(body) && (text != string(body) || !ok) {
			t.Fatalf("valid UTF-8 %q changed to %q (ok %v)", body, text, ok)
		}
	})
}
