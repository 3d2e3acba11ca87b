package unixsock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// NotPrivateError says why a directory or socket may be another user's:
// a client must not talk to a socket there, nor a server keep its state
// there. It is never worth a retry, nor starting a server in its place.
type NotPrivateError struct {
	Path   string // the directory or socket
	Reason string
}

func (e *NotPrivateError) Error() string { return e.Path + " is not private to you: " + e.Reason }

// IsNotPrivate reports whether err is, or wraps, a NotPrivateError.
func IsNotPrivate(err error) bool {
	var np *NotPrivateError
	return errors.As(err, &np)
}

// CheckPrivateDir reports why dir is not private to this user, or nil: it
// must be a directory this user owns in which no one else can create,
// remove or replace a file. Others may write in a directory with a group
// or other write bit, and a sticky one is shared by design (as /tmp is,
// even when this user is root and owns it). Others may read or enter it.
// A missing directory is the error os.Stat gives.
func CheckPrivateDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	return checkDir(dir, st)
}

func checkDir(dir string, st fs.FileInfo) error {
	if !st.IsDir() {
		return &NotPrivateError{Path: dir, Reason: "it is a " + describe(st.Mode()) + ", not a directory"}
	}
	if uid, me := ownerOf(st), os.Geteuid(); uid != me {
		return &NotPrivateError{Path: dir, Reason: fmt.Sprintf("it belongs to uid %d, not to you (uid %d)", uid, me)}
	}
	if shared := st.Mode()&fs.ModeSticky != 0 || st.Mode().Perm()&0o022 != 0; shared {
		return &NotPrivateError{Path: dir, Reason: fmt.Sprintf("other users can create and replace files in it (mode %s)", octalMode(st.Mode()))}
	}
	return nil
}

// SecureDir makes dir a directory private to this user, or says why it
// cannot, changing nothing then. A missing one is created 0700 (with its
// missing parents). One that is this user's and that others may only
// read or enter is tightened to 0700: an older capsem, or the user, made
// it. One that is another user's, or shared (CheckPrivateDir), is
// refused and left as it is: chmodding it would lock its other users out.
func SecureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if err := checkDir(dir, st); err != nil {
		return err
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("securing %s: %w", dir, err)
		}
	}
	return nil
}

func ownerOf(st fs.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid)
	}
	return -1
}

// octalMode is m's permission and sticky bits as chmod takes them (1777).
func octalMode(m fs.FileMode) string {
	bits := uint32(m.Perm())
	if m&fs.ModeSticky != 0 {
		bits |= 0o1000
	}
	if m&fs.ModeSetgid != 0 {
		bits |= 0o2000
	}
	return fmt.Sprintf("%04o", bits)
}

// ReadPrivateFile reads a regular file of at most max bytes that only this
// user may read (a key, a secret): one that belongs to another user, or
// that its group or others may read, is refused, as ssh refuses such a key.
// Opening does not block, so a FIFO in its place cannot hang the reader.
func ReadPrivateFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	switch uid, me := ownerOf(st), os.Geteuid(); {
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, describe(st.Mode()))
	case st.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("%s has mode %s: it must be readable by its owner only (0600)", path, octalMode(st.Mode()))
	case uid != me:
		return nil, fmt.Errorf("%s belongs to uid %d, not to you (uid %d)", path, uid, me)
	case st.Size() > max:
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return data, nil
}
