package workspacefs

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

const MiB = 1 << 20

// testFS opens a workspace in a fresh directory with hostFree faked as
// plenty, unless the test sets it.
func testFS(t testing.TB, lim Limits) (*FS, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "ws")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return openFS(t, root, lim), root
}

func openFS(t testing.TB, root string, lim Limits) *FS {
	t.Helper()
	fs, err := Open(context.Background(), root, lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	fs.setHostFree(func() (int64, error) { return 1 << 50, nil })
	t.Cleanup(func() { fs.Close() })
	return fs
}

// socketPair returns two connected unix stream sockets.
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "sock")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// serve runs fs.Serve on one end of a socket pair and returns the other;
// the returned channel yields Serve's result.
func serve(t testing.TB, fs *FS) (net.Conn, <-chan error) {
	t.Helper()
	client, server := socketPair(t)
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() {
		done <- fs.Serve(context.Background(), server)
		close(finished)
	}()
	t.Cleanup(func() {
		client.Close()
		select {
		case <-finished:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the client closed")
		}
	})
	return client, done
}

// attach connects the library's client and attaches to the root.
func attach(t testing.TB, fs *FS) (*p9.Client, p9.File) {
	t.Helper()
	conn, _ := serve(t, fs)
	c, err := p9.NewClient(conn, p9.WithMessageSize(MaxMessage))
	if err != nil {
		t.Fatal(err)
	}
	root, err := c.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	return c, root
}

func walk(t testing.TB, dir p9.File, names ...string) p9.File {
	t.Helper()
	_, f, err := dir.Walk(names)
	if err != nil {
		t.Fatalf("walk %v: %v", names, err)
	}
	return f
}

// create makes name in dir and returns it opened read-write.
func create(t testing.TB, dir p9.File, name string) p9.File {
	t.Helper()
	d := walk(t, dir)
	f, _, _, err := d.Create(name, p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return f
}

// writeAll writes p at off and on until it is written or an error.
func writeAll(f p9.File, p []byte, off int64) (int64, error) {
	var done int64
	for len(p) > 0 {
		n, err := f.WriteAt(p, off+done)
		done += int64(n)
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrShortWrite
		}
		p = p[n:]
	}
	return done, nil
}

// hostUsage is what the tree under root takes on the host.
func hostUsage(t testing.TB, root string) (bytes, inodes int64) {
	t.Helper()
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	bytes, inodes, err = scanTree(fd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bytes, inodes
}

func isErrno(err error, want linux.Errno) bool {
	var e linux.Errno
	return errors.As(err, &e) && e == want
}

// waitGoroutines waits for the goroutine count to drop to at most n.
func waitGoroutines(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want <= %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Raw 9P messages, for clients the library's client cannot play.

func msg(typ byte, tag uint16, body ...[]byte) []byte {
	n := headerLen
	for _, b := range body {
		n += len(b)
	}
	out := make([]byte, headerLen, n)
	binary.LittleEndian.PutUint32(out[0:], uint32(n))
	out[4] = typ
	binary.LittleEndian.PutUint16(out[5:], tag)
	for _, b := range body {
		out = append(out, b...)
	}
	return out
}

func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func str(s string) []byte {
	return append(binary.LittleEndian.AppendUint16(nil, uint16(len(s))), s...)
}

const (
	tVersion = 100
	tAttach  = 104
	tLcreate = 14
	tWrite   = 118
	tWalk    = 110
	tLopen   = 12
	tClunk   = 120
	tRead    = 116
)

func tversion(tag uint16) []byte { return msg(tVersion, tag, u32(MaxMessage), str("9P2000.L")) }
func tattach(tag uint16, fid uint32) []byte {
	return msg(tAttach, tag, u32(fid), u32(^uint32(0)), str("root"), str(""), u32(0))
}
func tlcreate(tag uint16, fid uint32, name string) []byte {
	return msg(tLcreate, tag, u32(fid), str(name), u32(2), u32(0o644), u32(0))
}
func twrite(tag uint16, fid uint32, off uint64, data []byte) []byte {
	return msg(tWrite, tag, u32(fid), u64(off), u32(uint32(len(data))), data)
}

// readReply reads one reply and returns its type, tag and body.
func readReply(t testing.TB, r io.Reader) (byte, uint16, []byte) {
	t.Helper()
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatalf("read reply: %v", err)
	}
	body := make([]byte, binary.LittleEndian.Uint32(hdr[:])-headerLen)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("read reply body: %v", err)
	}
	return hdr[4], binary.LittleEndian.Uint16(hdr[5:]), body
}
