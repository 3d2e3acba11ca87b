package agent

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// piecewiseReader returns its data in reads of at most size bytes, as a
// data stream does, then err (io.EOF when nil).
type piecewiseReader struct {
	data []byte
	size int
	err  error
}

func (p *piecewiseReader) Read(b []byte) (int, error) {
	if len(p.data) == 0 {
		if p.err != nil {
			return 0, p.err
		}
		return 0, io.EOF
	}
	n := copy(b[:min(len(b), p.size)], p.data)
	p.data = p.data[n:]
	return n, nil
}

// TestCopyToFile: whatever the size and however the data arrives, the file
// has exactly its bytes, whether it was opened for direct I/O (whole
// blocks direct, the tail through the page cache) or not.
func TestCopyToFile(t *testing.T) {
	dir := realTempDir(t)
	sizes := []int{0, 1, directIOAlign - 1, directIOAlign, directIOAlign + 1,
		fileBuf - 1, fileBuf, fileBuf + 1, 3*fileBuf + 12345}
	for _, direct := range []bool{true, false} {
		for _, size := range sizes {
			for _, piece := range []int{1000, 64 << 10, 1 << 20} {
				if piece == 1000 && size > fileBuf {
					continue // slow, and no different
				}
				data := make([]byte, size)
				rand.Read(data)
				path := filepath.Join(dir, "f")
				flags := unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC
				if direct {
					flags |= unix.O_DIRECT
				}
				fd, err := unix.Open(path, flags, 0o600)
				if errors.Is(err, unix.EINVAL) {
					if os.Getenv("CI") == "true" {
						t.Fatalf("%s takes no direct I/O: under CI the direct path must be tested", dir)
					}
					t.Skipf("%s takes no direct I/O", dir)
				}
				if err != nil {
					t.Fatal(err)
				}
				f := os.NewFile(uintptr(fd), path)
				n, err := copyToFile(f, &piecewiseReader{data: data, size: piece})
				f.Close()
				if err != nil || n != int64(size) {
					t.Fatalf("direct %v, %d bytes in pieces of %d: copied %d, %v", direct, size, piece, n, err)
				}
				if back, _ := os.ReadFile(path); !bytes.Equal(back, data) {
					t.Fatalf("direct %v, %d bytes in pieces of %d: the file has %d bytes, not the ones sent", direct, size, piece, len(back))
				}
			}
		}
	}
}

// TestCopyToFileReportsTheReadersError: a stream cut short is an error,
// not the end of the file.
func TestCopyToFileReportsTheReadersError(t *testing.T) {
	path := filepath.Join(realTempDir(t), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cut := errors.New("cut")
	n, err := copyToFile(f, &piecewiseReader{data: make([]byte, fileBuf+5), size: 1 << 20, err: cut})
	if !errors.Is(err, cut) || n != fileBuf+5 {
		t.Fatalf("copied %d, %v; want all %d bytes and the reader's error", n, err, fileBuf+5)
	}
}

// TestCopyRead: a file is sent whole, large ones read direct, and one over
// the limit is refused, whatever the limit's alignment (a last piece cut by
// the limit is no whole number of blocks, which direct I/O refuses).
func TestCopyRead(t *testing.T) {
	dir := realTempDir(t)
	for _, size := range []int{0, 1, directReadMin - 1, directReadMin, directReadMin + directIOAlign + 1, 3*fileBuf + 5} {
		data := make([]byte, size)
		rand.Read(data)
		path := filepath.Join(dir, "f")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			max     int64
			tooBig  bool
			comment string
		}{
			{int64(size), false, "exactly the limit"},
			{int64(size) + 100, false, "under an unaligned limit"},
			{int64(size) + fileBuf, false, "well under the limit"},
			{int64(size) - 1, true, "one byte over"},
		} {
			if tc.max < 0 {
				continue
			}
			f, _, err := openRead(path, false, max(tc.max, int64(size)))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			n, err := copyRead(&out, f, path, tc.max)
			f.Close()
			if tc.tooBig {
				if err == nil || !strings.Contains(err.Error(), "more than") {
					t.Fatalf("%d bytes, %s (max %d): copied %d, %v; want a refusal", size, tc.comment, tc.max, n, err)
				}
				continue
			}
			if err != nil || n != int64(size) || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("%d bytes, %s (max %d): copied %d (%d arrived), %v", size, tc.comment, tc.max, n, out.Len(), err)
			}
		}
	}
}
