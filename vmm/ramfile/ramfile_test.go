package ramfile

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// memfd is a fresh memory object of size bytes, as a backend makes for a
// guest's RAM.
func memfd(t testing.TB, size int64) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("ramfile-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

func contents(t testing.TB, f *os.File, size int64) []byte {
	t.Helper()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func allocated(t testing.TB, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// ram is a guest RAM of size bytes written as a guest leaves it: pages of
// data here and there, runs of them across chunk boundaries, pages it
// touched and zeroed again, a last page written partly.
func ram(t testing.TB, size int64) (*os.File, int64) {
	f := memfd(t, size)
	r := rand.New(rand.NewPCG(1, 2))
	var data int64
	write := func(off int64, b []byte) {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	page := make([]byte, PageSize)
	for i := 0; i < 200; i++ {
		off := r.Int64N(size/PageSize) * PageSize
		for j := range page {
			page[j] = byte(r.UintN(255) + 1)
		}
		write(off, page)
	}
	// A run across a chunk boundary.
	run := bytes.Repeat([]byte{7}, 3*PageSize)
	write(chunk-PageSize, run)
	// Touched, then zero again: data to the memfd, a hole to the file.
	write(5*chunk, make([]byte, 2*PageSize))
	// One byte in the last page.
	write(size-1, []byte{9})
	for off := int64(0); off < size; off += PageSize {
		b := make([]byte, PageSize)
		f.ReadAt(b, off)
		if !bytes.Equal(b, zeroPage[:]) {
			data += PageSize
		}
	}
	return f, data
}

func TestSaveLoadRoundTrip(t *testing.T) {
	const size = 16 << 20
	src, data := ram(t, size)
	path := filepath.Join(t.TempDir(), "ram")
	dst, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, err := Save(dst, src, size)
	if err != nil {
		t.Fatal(err)
	}
	if n != data {
		t.Errorf("Save wrote %d bytes of data, the RAM holds %d", n, data)
	}
	if st, _ := dst.Stat(); st.Size() != size {
		t.Errorf("the RAM file is %d bytes, want %d", st.Size(), size)
	}
	if a := allocated(t, dst); a > data+64<<10 {
		t.Errorf("the RAM file takes %d bytes on disk for %d of data: zero pages were written", a, data)
	}
	if !bytes.Equal(contents(t, dst, size), contents(t, src, size)) {
		t.Fatal("the RAM file differs from the RAM")
	}

	back := memfd(t, size)
	n, err = Load(back, dst, size)
	if err != nil {
		t.Fatal(err)
	}
	if n != data {
		t.Errorf("Load copied %d bytes, want %d", n, data)
	}
	if !bytes.Equal(contents(t, back, size), contents(t, src, size)) {
		t.Fatal("the loaded RAM differs from the saved one")
	}

	// The hash is the RAM's, not the file's layout: the memfd (with a
	// touched page of zeros) and the file (a hole there) hash alike.
	hashOf := func(f *os.File) []byte {
		h := sha256.New()
		if _, err := Hash(h, f); err != nil {
			t.Fatal(err)
		}
		return h.Sum(nil)
	}
	if !bytes.Equal(hashOf(src), hashOf(dst)) || !bytes.Equal(hashOf(dst), hashOf(back)) {
		t.Error("the same RAM hashed differently")
	}
	dst.WriteAt([]byte{1}, 3*chunk+17)
	if bytes.Equal(hashOf(src), hashOf(dst)) {
		t.Error("a changed byte in a hole did not change the hash")
	}
	dst.WriteAt([]byte{0}, 3*chunk+17)
	dst.WriteAt([]byte{0xff}, size-1)
	if bytes.Equal(hashOf(src), hashOf(dst)) {
		t.Error("a changed byte of data did not change the hash")
	}
}

func TestLoadRefusesAnotherSize(t *testing.T) {
	src, _ := ram(t, 4<<20)
	if _, err := Load(memfd(t, 8<<20), src, 8<<20); err == nil {
		t.Fatal("a RAM file of 4 MiB loaded into a guest of 8 MiB")
	}
}

func TestEmptyRAM(t *testing.T) {
	src := memfd(t, 4<<20)
	dst, err := os.Create(filepath.Join(t.TempDir(), "ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if n, err := Save(dst, src, 4<<20); err != nil || n != 0 {
		t.Fatalf("Save of untouched RAM: %d bytes, %v", n, err)
	}
	if a := allocated(t, dst); a != 0 {
		t.Errorf("untouched RAM took %d bytes on disk", a)
	}
}

// FuzzSaveLoad writes pages of the input at offsets it chooses and checks
// the RAM comes back whole.
func FuzzSaveLoad(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, uint16(0))
	f.Add(bytes.Repeat([]byte{0}, 9000), uint16(3))
	f.Add(bytes.Repeat([]byte{1, 0}, 5000), uint16(255))
	f.Fuzz(func(t *testing.T, b []byte, at uint16) {
		const size = 2 << 20
		if len(b) > size/2 {
			b = b[:size/2]
		}
		src := memfd(t, size)
		off := int64(at) * 517 % (size - int64(len(b)))
		src.WriteAt(b, off)
		dir := t.TempDir()
		dst, err := os.Create(filepath.Join(dir, "ram"))
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Close()
		if _, err := Save(dst, src, size); err != nil {
			t.Fatal(err)
		}
		back := memfd(t, size)
		if _, err := Load(back, dst, size); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(contents(t, back, size), contents(t, src, size)) {
			t.Fatal("the RAM did not come back whole")
		}
	})
}
