// Package ramfile keeps a guest's RAM apart from the rest of a saved VM
// state: a sparse file that is the guest's RAM as the guest sees it, byte
// for byte at the guest's own offsets, with a hole for every page that
// holds only zeros.
//
// A backend that runs its guest's RAM in a shared memory object (QEMU:
// memory-backend-file with share=on over a memfd) saves only the devices'
// state through its migration stream and writes the RAM with Save; a
// restore fills a fresh memory object with Load before the backend loads
// the devices' state. Neither walks the untouched part of the RAM: both
// follow the source's data extents (SEEK_DATA/SEEK_HOLE), and pages of
// zeros are holes, as the kernel hands out fresh memory.
package ramfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// PageSize is the unit a RAM file keeps or leaves out.
const PageSize = 4096

// chunk is how much of the source is read at once.
const chunk = 1 << 20

var zeroPage [PageSize]byte

// Save writes the RAM in src (size bytes, e.g. a memfd) to dst, which it
// truncates to size first, leaving holes where src has holes or pages of
// zeros. It returns the bytes of data written.
func Save(dst, src *os.File, size int64) (int64, error) {
	if err := dst.Truncate(0); err != nil {
		return 0, fmt.Errorf("ramfile: %w", err)
	}
	if err := dst.Truncate(size); err != nil {
		return 0, fmt.Errorf("ramfile: sizing the RAM file: %w", err)
	}
	var written int64
	err := walk(src, size, func(off int64, run []byte) error {
		if _, err := dst.WriteAt(run, off); err != nil {
			return fmt.Errorf("ramfile: writing at %d: %w", off, err)
		}
		written += int64(len(run))
		return nil
	})
	return written, err
}

// Load fills dst (size bytes, all zero: a fresh memfd truncated to size)
// with the RAM file src, which must be size bytes long. It returns the
// bytes of data copied.
func Load(dst, src *os.File, size int64) (int64, error) {
	st, err := src.Stat()
	if err != nil {
		return 0, fmt.Errorf("ramfile: %w", err)
	}
	if st.Size() != size {
		return 0, fmt.Errorf("ramfile: the RAM file is %d bytes, the guest has %d", st.Size(), size)
	}
	var copied int64
	err = walk(src, size, func(off int64, run []byte) error {
		if _, err := dst.WriteAt(run, off); err != nil {
			return fmt.Errorf("ramfile: loading at %d: %w", off, err)
		}
		copied += int64(len(run))
		return nil
	})
	return copied, err
}

// Hash writes the RAM file f to h as its pages with data, each after its
// offset (8 bytes, big-endian): two files of the same RAM hash alike
// whatever their holes. It returns the bytes of data.
func Hash(h hash.Hash, f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("ramfile: %w", err)
	}
	var n int64
	var off [8]byte
	binary.BigEndian.PutUint64(off[:], uint64(st.Size()))
	h.Write(off[:])
	err = walk(f, st.Size(), func(at int64, run []byte) error {
		for i := 0; i < len(run); i += PageSize {
			binary.BigEndian.PutUint64(off[:], uint64(at+int64(i)))
			h.Write(off[:])
			h.Write(run[i:min(i+PageSize, len(run))])
		}
		n += int64(len(run))
		return nil
	})
	return n, err
}

// walk calls fn with each run of pages of f, below size, that are not all
// zero, in order, at their offsets. run is only valid during the call.
func walk(f *os.File, size int64, fn func(off int64, run []byte) error) error {
	fd := int(f.Fd())
	buf := make([]byte, chunk)
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return fmt.Errorf("ramfile: finding data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("ramfile: finding a hole: %w", err)
		}
		hole = min(hole, size)
		// Extents start on a block boundary, which is a page boundary
		// on every filesystem with 4 KiB blocks or larger; align down
		// for the others.
		data -= data % PageSize
		for pos := data; pos < hole; {
			n, err := f.ReadAt(buf[:min(int64(chunk), hole-pos)], pos)
			if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
				return fmt.Errorf("ramfile: reading at %d: %w", pos, err)
			}
			if err := runs(buf[:n], pos, fn); err != nil {
				return err
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// runs calls fn with each run of b's pages (b starts at off) that are not
// all zero.
func runs(b []byte, off int64, fn func(off int64, run []byte) error) error {
	start := -1
	for i := 0; i < len(b); i += PageSize {
		page := b[i:min(i+PageSize, len(b))]
		zero := bytes.Equal(page, zeroPage[:len(page)])
		switch {
		case !zero && start < 0:
			start = i
		case zero && start >= 0:
			if err := fn(off+int64(start), b[start:i]); err != nil {
				return err
			}
			start = -1
		}
	}
	if start >= 0 {
		return fn(off+int64(start), b[start:])
	}
	return nil
}
