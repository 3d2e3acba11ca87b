package workspacefs

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

type inodeKey struct{ dev, ino uint64 }

// scanner counts the allocated blocks and inodes of a tree, each inode once
// (hard links are remembered by key). It opens directories one component
// at a time with O_NOFOLLOW and never follows a symlink.
type scanner struct {
	bytes, inodes int64
	linked        map[inodeKey]struct{}
	buf           []byte
	stop          func() bool
}

func scanTree(rootFD int, stop func() bool) (bytes, inodes int64, err error) {
	s := &scanner{linked: map[inodeKey]struct{}{}, buf: make([]byte, 32<<10), stop: stop}
	var st unix.Stat_t
	if err := unix.Fstat(rootFD, &st); err != nil {
		return 0, 0, fmt.Errorf("stat workspace root: %w", err)
	}
	s.bytes += statBytes(&st)
	s.inodes++
	fd, err := unix.Openat(rootFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("open workspace root: %w", err)
	}
	err = s.dir(fd)
	unix.Close(fd)
	return s.bytes, s.inodes, err
}

var errScanStopped = errors.New("workspacefs: scan stopped")

// dir counts the entries of the directory open at fd and recurses. It
// holds one descriptor per level.
func (s *scanner) dir(fd int) error {
	var subdirs []string
	for {
		if s.stop != nil && s.stop() {
			return errScanStopped
		}
		n, err := unix.Getdents(fd, s.buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("read directory: %w", err)
		}
		if n == 0 {
			break
		}
		for b := s.buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				break
			}
			name := direntName(b[19:reclen])
			b = b[reclen:]
			if name == "." || name == ".." {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if err == unix.ENOENT {
					continue // gone meanwhile
				}
				return fmt.Errorf("stat %q: %w", name, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
				k := inodeKey{uint64(st.Dev), st.Ino}
				if _, seen := s.linked[k]; seen {
					continue
				}
				s.linked[k] = struct{}{}
			}
			s.bytes += statBytes(&st)
			s.inodes++
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				subdirs = append(subdirs, name)
			}
		}
	}
	for _, name := range subdirs {
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
				continue // replaced meanwhile
			}
			return fmt.Errorf("open directory %q: %w", name, err)
		}
		err = s.dir(sub)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}

func direntName(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
