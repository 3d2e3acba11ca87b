package mcpframe

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files")

func goldenPath(name string) string {
	return filepath.Join("..", "..", "testdata", "mcpframe", name+".hex")
}

func TestGoldenFrames(t *testing.T) {
	cases := []struct {
		name  string
		frame Frame
	}{
		{"request", Frame{StreamID: 1, Name: "claude", Payload: []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)}},
		{"notification", Frame{StreamID: 0, Flags: FlagNotification, Name: "python3", Payload: []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)}},
		{"unicode_name_empty_payload", Frame{StreamID: 0xFFFFFFFF, Name: "naïve-agent"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Encode(&tc.frame)
			if err != nil {
				t.Fatal(err)
			}
			path := goldenPath(tc.name)
			if *update {
				if err := os.WriteFile(path, []byte(hex.EncodeToString(got)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("golden missing (run with -update): %v", err)
			}
			want, err := hex.DecodeString(strings.TrimSpace(string(raw)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding changed:\n got %x\nwant %x", got, want)
			}
			dec, err := NewReader(bytes.NewReader(want)).Read()
			if err != nil {
				t.Fatal(err)
			}
			if dec.StreamID != tc.frame.StreamID || dec.Flags != tc.frame.Flags || dec.Name != tc.frame.Name || !bytes.Equal(dec.Payload, tc.frame.Payload) {
				t.Fatalf("round trip mismatch: %+v vs %+v", dec, tc.frame)
			}
		})
	}
}

func TestGoldenLayout(t *testing.T) {
	// The byte layout spelled out, independent of the encoder.
	b, err := Encode(&Frame{StreamID: 7, Name: "ab", Payload: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0, 0, 0, 20, 0x4D, 0x43, 1, 16, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 2, 'a', 'b', '{', '}'}
	if !bytes.Equal(b, want) {
		t.Fatalf("got %v want %v", b, want)
	}
}

// body builds a raw frame body with arbitrary (possibly invalid) fields.
func body(magic uint16, version, hdr byte, stream uint32, flags, nameLen uint16, payloadLen uint32, rest []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, magic)
	b = append(b, version, hdr)
	b = binary.BigEndian.AppendUint32(b, stream)
	b = binary.BigEndian.AppendUint16(b, flags)
	b = binary.BigEndian.AppendUint16(b, nameLen)
	b = binary.BigEndian.AppendUint32(b, payloadLen)
	return append(b, rest...)
}

func TestDecodeBodyRejects(t *testing.T) {
	long := strings.Repeat("n", 129)
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"bad magic", body(0x4D44, 1, 16, 1, 0, 0, 2, []byte("{}")), ErrMagic},
		{"bad version", body(Magic, 2, 16, 1, 0, 0, 2, []byte("{}")), ErrVersion},
		{"bad header len", body(Magic, 1, 20, 1, 0, 0, 2, []byte("{}")), ErrHeaderLen},
		{"reserved flag", body(Magic, 1, 16, 1, 0x8000, 0, 2, []byte("{}")), ErrReservedFlag},
		{"reserved flag bit 1", body(Magic, 1, 16, 1, 0x0002, 0, 2, []byte("{}")), ErrReservedFlag},
		{"stream 0 without notification flag", body(Magic, 1, 16, 0, 0, 0, 2, []byte("{}")), ErrStreamFlag},
		{"notification flag on stream 5", body(Magic, 1, 16, 5, FlagNotification, 0, 2, []byte("{}")), ErrStreamFlag},
		{"name too long", body(Magic, 1, 16, 1, 0, 129, 2, append([]byte(long), '{', '}')), ErrNameLen},
		{"name not utf8", body(Magic, 1, 16, 1, 0, 2, 2, []byte{0xff, 0xfe, '{', '}'}), ErrNameUTF8},
		{"payload len too big", body(Magic, 1, 16, 1, 0, 0, 3, []byte("{}")), ErrLenMismatch},
		{"payload len too small", body(Magic, 1, 16, 1, 0, 0, 1, []byte("{}")), ErrLenMismatch},
		{"short header", []byte{0x4D, 0x43, 1}, ErrLength},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeBody(tc.body)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.want != ErrLength && !IsBodyError(err) {
				t.Fatalf("%v should be a recoverable body error", err)
			}
		})
	}
}

func TestEncodeRejects(t *testing.T) {
	cases := []struct {
		name  string
		frame Frame
		want  error
	}{
		{"stream 0 request", Frame{StreamID: 0}, ErrStreamFlag},
		{"notification on stream 3", Frame{StreamID: 3, Flags: FlagNotification}, ErrStreamFlag},
		{"reserved", Frame{StreamID: 3, Flags: 0x0100}, ErrReservedFlag},
		{"name 129", Frame{StreamID: 1, Name: strings.Repeat("x", 129)}, ErrNameLen},
		{"payload too big", Frame{StreamID: 1, Payload: make([]byte, MaxPayloadLen+1)}, ErrTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Encode(&tc.frame); !errors.Is(err, tc.want) {
				t.Fatalf("got %v want %v", err, tc.want)
			}
		})
	}
	if _, err := Encode(&Frame{StreamID: 1, Payload: make([]byte, MaxPayloadLen)}); err != nil {
		t.Fatalf("largest payload must encode: %v", err)
	}
}

func TestReaderLengthRules(t *testing.T) {
	prefix := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	t.Run("clean EOF", func(t *testing.T) {
		if _, err := NewReader(bytes.NewReader(nil)).Read(); err != io.EOF {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("below minimum", func(t *testing.T) {
		if _, err := NewReader(bytes.NewReader(prefix(15))).Read(); !errors.Is(err, ErrLength) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("above maximum", func(t *testing.T) {
		if _, err := NewReader(bytes.NewReader(prefix(MaxBodyLen + 1))).Read(); !errors.Is(err, ErrLength) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("short body", func(t *testing.T) {
		in := append(prefix(40), make([]byte, 10)...)
		if _, err := NewReader(bytes.NewReader(in)).Read(); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("corrupt body then valid frame stays in sync", func(t *testing.T) {
		bad := body(0xBEEF, 1, 16, 77, 0, 0, 2, []byte("{}"))
		good, _ := Encode(&Frame{StreamID: 78, Name: "x", Payload: []byte("{}")})
		in := append(prefix(uint32(len(bad))), bad...)
		in = append(in, good...)
		r := NewReader(bytes.NewReader(in))
		b, err := r.ReadBody()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeBody(b); !errors.Is(err, ErrMagic) {
			t.Fatalf("got %v", err)
		}
		if id, ok := StreamIDHint(b); !ok || id != 77 {
			t.Fatalf("hint %d %v", id, ok)
		}
		f, err := r.Read()
		if err != nil || f.StreamID != 78 {
			t.Fatalf("next frame: %+v %v", f, err)
		}
	})
}

func TestSanitizeName(t *testing.T) {
	cases := []struct{ in, want string }{
		{"claude", "claude"},
		{"", "unknown"},
		{"a b\tc\nd\x00e", "a_b_c_d_e"},
		{"/usr/bin/node", "/usr/bin/node"},
		{strings.Repeat("a", 127) + "é", strings.Repeat("a", 127)}, // é would straddle byte 128
		{strings.Repeat("é", 70), strings.Repeat("é", 64)},
		{"bad\xffutf8", "bad\uFFFDutf8"},
		{"ev\x1b[31mil\u202etxt.exe", "ev_[31mil_txt.exe"}, // ESC and RIGHT-TO-LEFT OVERRIDE
		{"a\u200bb\u2028c\u00a0d\ufeffe", "a_b_c_d_e"},     // zero-width space, line separator, NBSP, BOM
	}
	for _, tc := range cases {
		got := SanitizeName(tc.in)
		if got != tc.want {
			t.Errorf("SanitizeName(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if len(got) > MaxNameLen {
			t.Errorf("too long: %d", len(got))
		}
		if _, err := Encode(&Frame{StreamID: 1, Name: got}); err != nil {
			t.Errorf("sanitized name %q must encode: %v", got, err)
		}
	}
}

func FuzzDecodeBody(f *testing.F) {
	for _, fr := range []Frame{
		{StreamID: 1, Name: "claude", Payload: []byte(`{"jsonrpc":"2.0","id":1,"method":"ping"}`)},
		{Flags: FlagNotification, Payload: []byte(`{}`)},
	} {
		b, _ := Encode(&fr)
		f.Add(b[PrefixLen:])
	}
	f.Add(body(0x4D43, 1, 16, 0, 3, 200, 0, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := DecodeBody(b)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to the same bytes.
		out, err := Encode(&fr)
		if err != nil {
			t.Fatalf("decoded frame does not re-encode: %v", err)
		}
		if !bytes.Equal(out[PrefixLen:], b) {
			t.Fatalf("re-encode differs")
		}
	})
}

func FuzzReader(f *testing.F) {
	good, _ := Encode(&Frame{StreamID: 9, Name: "n", Payload: []byte("{}")})
	f.Add(good)
	f.Add(append(good, good[:7]...))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(bytes.NewReader(b))
		for i := 0; i < 64; i++ {
			if _, err := r.Read(); err != nil && !IsBodyError(err) {
				return
			}
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	fr := Frame{StreamID: 42, Name: "claude", Payload: bytes.Repeat([]byte("x"), 1024)}
	buf := make([]byte, 0, fr.EncodedLen())
	b.SetBytes(int64(fr.EncodedLen()))
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = Append(buf[:0], &fr)
	}
}

func BenchmarkDecode(b *testing.B) {
	fr := Frame{StreamID: 42, Name: "claude", Payload: bytes.Repeat([]byte("x"), 1024)}
	enc, _ := Encode(&fr)
	rd := bytes.NewReader(enc)
	r := NewReader(rd)
	b.SetBytes(int64(len(enc)))
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(enc)
		if _, err := r.Read(); err != nil {
			b.Fatal(err)
		}
	}
}
