package guestfs

import (
	"bytes"
	"crypto/rand"
	"os"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

func TestDecodeXZRoundTrip(t *testing.T) {
	data := bytes.Repeat([]byte("capsem guest assets "), 5000)
	rnd := make([]byte, 70000)
	rand.Read(rnd)
	for _, tc := range []struct {
		name  string
		check byte
		data  []byte
	}{
		{"crc32", xz.CRC32, data},
		{"crc64", xz.CRC64, data},
		{"sha256", xz.SHA256, data},
		{"none", xz.None, data},
		{"random", xz.CRC32, rnd},
		{"empty", xz.CRC32, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeXZ(xzCompress(t, tc.data, tc.check), 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Fatalf("round trip differs: %d bytes, want %d", len(got), len(tc.data))
			}
		})
	}
}

// TestDecodeXZBCJ decodes a stream made by xz(1) with the x86 BCJ filter,
// the chain Debian's kernel uses. The block's CRC32 covers the unfiltered
// data, so a BCJ bug fails the check as well as the comparison.
func TestDecodeXZBCJ(t *testing.T) {
	stream, err := os.ReadFile("testdata/bcj-x86.xz")
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeXZ(stream, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if want := bcjSample(); !bytes.Equal(got, want) {
		t.Fatalf("BCJ decode differs from the original (%d vs %d bytes)", len(got), len(want))
	}
}

func TestDecodeXZErrors(t *testing.T) {
	good := xzCompress(t, bytes.Repeat([]byte("abcdefgh"), 4096), xz.CRC32)
	bcj, err := os.ReadFile("testdata/bcj-x86.xz")
	if err != nil {
		t.Fatal(err)
	}
	flip := func(b []byte, i int) []byte {
		c := bytes.Clone(b)
		c[i] ^= 0x55
		return c
	}
	for _, tc := range []struct {
		name   string
		data   []byte
		maxOut int64
		want   string
	}{
		{"no magic", []byte("not xz at all"), 1 << 20, "magic"},
		{"stream header crc", flip(good, 8), 1 << 20, "stream header CRC"},
		{"block header crc", flip(good, 13), 1 << 20, "block header CRC"},
		{"truncated", good[:len(good)/2], 1 << 20, "xz:"},
		{"output limit", good, 100, "limit"},
		{"data check", flip(bcj, len(bcj)-40-4), 1 << 20, "xz:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeXZ(tc.data, tc.maxOut)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	t.Run("dictionary limit", func(t *testing.T) {
		// testdata's block asks for an 8 MiB dictionary.
		if _, err := decodeXZDict(bcj, 1<<20, 1<<20); err == nil || !strings.Contains(err.Error(), "dictionary") {
			t.Fatalf("error %v, want a dictionary limit error", err)
		}
	})
}

func TestBCJX86DecodeShortBuffers(t *testing.T) {
	// Nothing converts in five bytes or fewer: a call needs its four
	// displacement bytes, and the last four bytes are never touched.
	for n := range 6 {
		buf := bytes.Repeat([]byte{0xE8}, n)
		bcjX86Decode(buf, 0)
		if !bytes.Equal(buf, bytes.Repeat([]byte{0xE8}, n)) {
			t.Fatalf("buffer of %d bytes was modified: %x", n, buf)
		}
	}
}

// FuzzDecodeXZ feeds arbitrary bytes to the xz container parser: it must
// return an error or data within the limit, never panic or over-allocate.
func FuzzDecodeXZ(f *testing.F) {
	if b, err := os.ReadFile("testdata/bcj-x86.xz"); err == nil {
		f.Add(b)
	}
	f.Add(xzCompress(f, []byte("hello, guest"), xz.CRC64))
	f.Add(xzCompress(f, bytes.Repeat([]byte{0xE8, 0, 0, 0, 0}, 100), xz.SHA256))
	f.Add([]byte{0xFD, '7', 'z', 'X', 'Z', 0, 0, 1, 0x69, 0x22, 0xDE, 0x36, 0x02, 0x01, 0x04, 0, 0x21, 0x01, 0x16, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		const limit = 1 << 20
		out, err := decodeXZDict(data, limit, 1<<20)
		if err == nil && len(out) > limit {
			t.Fatalf("output %d bytes beyond the %d limit", len(out), limit)
		}
	})
}
