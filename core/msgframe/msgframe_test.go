package msgframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// str is a msgpack string message.
func str(s string) msgp.Raw { return msgp.AppendString(nil, s) }

func frame(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
}

func TestRoundTrip(t *testing.T) {
	var wire bytes.Buffer
	w := NewWriter(&wire, 1<<20, "testwire")
	for _, s := range []string{"", "a", strings.Repeat("x", 70_000)} {
		if err := w.Write(str(s), "msg"); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&wire, 1<<20, "testwire")
	for _, want := range []string{"", "a", strings.Repeat("x", 70_000)} {
		body, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		var got msgp.Raw
		if err := Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		if s, _, err := msgp.ReadStringBytes(got); err != nil || s != want {
			t.Fatalf("got %q (%v), want %d bytes", s, err, len(want))
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReaderErrors(t *testing.T) {
	ok := frame(str("next"))
	cases := []struct {
		name      string
		wire      []byte
		wantErr   string
		inSync    bool // the frame after the bad one still reads
		tooLarge  bool
		limit     int
		bodyLimit int
	}{
		{name: "oversized body skipped", wire: append(frame(make([]byte, 65)), ok...), wantErr: "testwire: message exceeds the frame limit: 65 bytes, the limit is 64", inSync: true, tooLarge: true},
		{name: "short prefix", wire: []byte{0, 0}, wantErr: "testwire: short length prefix"},
		{name: "short body", wire: []byte{0, 0, 0, 9, 1, 2}, wantErr: "testwire: short message"},
		{name: "oversized and cut short", wire: []byte{0, 0, 1, 0, 1}, wantErr: "testwire: skipping oversized message"},
		{name: "forged large prefix, no body", wire: []byte{0, 0x20, 0, 0}, wantErr: "testwire: short message", limit: 4 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			limit := 64
			if tc.limit != 0 {
				limit = tc.limit
			}
			r := NewReader(bytes.NewReader(tc.wire), limit, "testwire")
			_, err := r.Next()
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want it to contain %q", err, tc.wantErr)
			}
			if errors.Is(err, ErrFrameTooLarge) != tc.tooLarge {
				t.Fatalf("errors.Is(ErrFrameTooLarge) = %v for %v", !tc.tooLarge, err)
			}
			if tc.inSync {
				body, err := r.Next()
				if err != nil || !bytes.Equal(body, str("next")) {
					t.Fatalf("frame after the bad one: %q, %v", body, err)
				}
			}
		})
	}
}

// A length prefix alone must not make the reader allocate the limit: the
// buffer grows only as bytes arrive.
func TestForgedPrefixDoesNotAllocateTheLimit(t *testing.T) {
	wire := []byte{0x03, 0xff, 0xff, 0xff, 1, 2, 3} // claims 64 MiB, carries 3 bytes
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := NewReader(bytes.NewReader(wire), 64<<20, "testwire").Next()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut-short 64 MiB frame: %v, want a short-message error", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("reading a forged 64 MiB prefix allocated %d bytes", grew)
	}
}

func TestAppendLimitAndErrors(t *testing.T) {
	dst := []byte("keep")
	out, err := Append(dst, str(strings.Repeat("y", 100)), 64, "testwire", "file_write")
	if !errors.Is(err, ErrFrameTooLarge) || !strings.Contains(err.Error(), "file_write is 102 bytes, the limit is 64") {
		t.Fatalf("Append over the limit: %v", err)
	}
	if string(out) != "keep" {
		t.Fatalf("Append changed dst on error: %q", out)
	}
	out, err = Append(dst, str("hi"), 64, "testwire", "msg")
	if err != nil || !bytes.Equal(out[4:], frame(str("hi"))) {
		t.Fatalf("Append: %x, %v", out, err)
	}
}

func TestUnmarshalRejectsTrailingAndTruncated(t *testing.T) {
	var m msgp.Raw
	if err := Unmarshal(append(str("a"), 0xc0), &m); err == nil || !strings.Contains(err.Error(), "trailing bytes") {
		t.Fatalf("trailing byte: %v", err)
	}
	// An array header claiming 2^32-1 elements with nothing after it.
	if err := Unmarshal([]byte{0xdd, 0xff, 0xff, 0xff, 0xff}, &m); err == nil {
		t.Fatal("a forged array count decoded")
	}
}

// Concurrent writers never interleave their frames.
func TestConcurrentWritersDoNotInterleave(t *testing.T) {
	pr, pw := io.Pipe()
	w := NewWriter(pw, 1<<20, "testwire")
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			body := strings.Repeat(string(rune('a'+i)), 5000+i)
			for range each {
				if err := w.Write(str(body), "msg"); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); pw.Close() }()
	r := NewReader(pr, 1<<20, "testwire")
	n := 0
	for {
		body, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		s, _, err := msgp.ReadStringBytes(body)
		if err != nil || strings.Trim(s, s[:1]) != "" {
			t.Fatalf("frame %d is mixed: %v", n, err)
		}
		n++
	}
	if n != writers*each {
		t.Fatalf("read %d frames, want %d", n, writers*each)
	}
}

func FuzzReader(f *testing.F) {
	f.Add(frame(str("hello")))
	f.Add(append(frame(make([]byte, 300)), frame(str("x"))...))
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, wire []byte) {
		r := NewReader(bytes.NewReader(wire), 256, "fuzz")
		consumed := 0
		for {
			body, err := r.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrFrameTooLarge) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				if errors.Is(err, ErrFrameTooLarge) {
					continue // in sync: keep reading
				}
				return
			}
			if len(body) > 256 {
				t.Fatalf("body of %d bytes past the 256 limit", len(body))
			}
			consumed += 4 + len(body)
			if consumed > len(wire) {
				t.Fatalf("read %d bytes from %d", consumed, len(wire))
			}
			var m msgp.Raw
			_ = Unmarshal(body, &m) // must not panic
		}
	})
}
