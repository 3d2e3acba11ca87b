package guestwire

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTermFramesGolden pins the terminal stream's bytes
// (testdata/guestwire/term.hex; -update rewrites it).
func TestTermFramesGolden(t *testing.T) {
	var b bytes.Buffer
	WriteTermFrame(&b, TermOpenKind, []byte(`{"version":1,"rows":24,"cols":80}`))
	WriteTermFrame(&b, TermDataKind, []byte("ls\r"))
	WriteTermFrame(&b, TermResizeKind, ResizePayload(40, 100))
	WriteTermFrame(&b, TermExitKind, ExitPayload(130))
	path := filepath.Join("..", "..", "testdata", "guestwire", "term.hex")
	if *update {
		os.WriteFile(path, []byte(hex.EncodeToString(b.Bytes())+"\n"), 0o644)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden missing (run with -update): %v", err)
	}
	if got := hex.EncodeToString(b.Bytes()); got != strings.TrimSpace(string(raw)) {
		t.Fatalf("encoding changed:\n got %s\nwant %s", got, raw)
	}
	var buf []byte
	r := bytes.NewReader(b.Bytes())
	kinds := ""
	for {
		k, p, err := ReadTermFrame(r, &buf)
		if err != nil {
			break
		}
		kinds += string(k)
		switch k {
		case TermOpenKind:
			if o, err := ParseTermOpen(p); err != nil || o.Rows != 24 || o.Cols != 80 {
				t.Fatalf("open: %+v %v", o, err)
			}
		case TermResizeKind:
			if rows, cols, err := ParseResize(p); err != nil || rows != 40 || cols != 100 {
				t.Fatalf("resize: %d %d %v", rows, cols, err)
			}
		case TermExitKind:
			if c, err := ParseExit(p); err != nil || c != 130 {
				t.Fatalf("exit: %d %v", c, err)
			}
		}
	}
	if kinds != "odrx" {
		t.Fatalf("frames read back: %q", kinds)
	}
}

func TestTermRefusals(t *testing.T) {
	var buf []byte
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{[]byte{'z', 0, 0, 0, 0}, "unknown kind"},
		{[]byte{'d', 0x7f, 0, 0, 0}, "more than"},
		{[]byte{'d', 0, 0, 0, 5, 'a'}, "cut short"},
	} {
		if _, _, err := ReadTermFrame(bytes.NewReader(tc.in), &buf); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%x: %v, want %q", tc.in, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{`{"version":2}`, "version 2"},
		{`{"version":1,"argv":[""]}`, "empty program"},
		{`{"version":1,"argv":["a\u0000b"]}`, "NUL"},
		{`{"version":1,"env":{"LD_PRELOAD":"x"}}`, "LD_PRELOAD"},
		{`{"version":1,"cwd":"relative"}`, "cwd"},
		{`not json`, "terminal open"},
	} {
		if _, err := ParseTermOpen([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.want)
		}
	}
}

// FuzzTermStream: any bytes read as a terminal stream give frames or a
// clear error, never a panic or a payload over the bound.
func FuzzTermStream(f *testing.F) {
	raw, _ := os.ReadFile(filepath.Join("..", "..", "testdata", "guestwire", "term.hex"))
	if b, err := hex.DecodeString(strings.TrimSpace(string(raw))); err == nil {
		f.Add(b)
	}
	f.Add([]byte{'o', 0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, in []byte) {
		var buf []byte
		r := bytes.NewReader(in)
		for {
			k, p, err := ReadTermFrame(r, &buf)
			if err != nil {
				return
			}
			if len(p) > MaxTermPayload {
				t.Fatalf("payload of %d bytes", len(p))
			}
			switch k {
			case TermOpenKind:
				ParseTermOpen(p)
			case TermResizeKind:
				ParseResize(p)
			case TermExitKind:
				ParseExit(p)
			}
		}
	})
}
