package workspacefs

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
)

// byteConn is a connection whose peer sent in and reads nothing back.
type byteConn struct {
	r *bytes.Reader
}

func (c *byteConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *byteConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *byteConn) Close() error                { return nil }

// recorder keeps what a client wrote.
type recorder struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.buf.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

// recordSession records the bytes the library's client sends for version,
// attach, walk, create, write, open, read, readdir and unlink.
func recordSession(t testing.TB) []byte {
	fs, _ := testFS(t, Limits{})
	conn, _ := serve(t, fs)
	rec := &recorder{Conn: conn}
	c, err := p9.NewClient(rec, p9.WithMessageSize(MaxMessage))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Attach("/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Mkdir("d", 0o755, p9.NoUID, p9.NoGID); err != nil {
		t.Fatal(err)
	}
	d := walk(t, r, "d")
	f := create(t, d, "f")
	f.WriteAt([]byte("hello"), 0)
	f.ReadAt(make([]byte, 5), 0)
	r.Symlink("/etc", "l", p9.NoUID, p9.NoGID)
	dd := walk(t, r, "d")
	dd.Open(p9.ReadOnly)
	dd.Readdir(0, 4096)
	d.UnlinkAt("f", 0)
	r.StatFS()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return bytes.Clone(rec.buf.Bytes())
}

// FuzzServe feeds arbitrary bytes to Serve as one connection: it must not
// panic, hang, or touch anything outside the workspace.
func FuzzServe(f *testing.F) {
	f.Add(recordSession(f))
	f.Add(append(tversion(1), tattach(2, 1)...))
	f.Add(append(append(tversion(1), tattach(2, 1)...), tlcreate(3, 1, "x")...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0})
	f.Add(msg(msgTxattrcreate, 1, u32(1), str("a"), u64(1<<60), u32(0)))
	f.Add(bytes.Repeat([]byte{7}, 100))

	parent := f.TempDir()
	root := filepath.Join(parent, "ws")
	os.Mkdir(root, 0o755)
	canary := filepath.Join(parent, "canary")
	os.WriteFile(canary, []byte("outside"), 0o644)
	fs := openFS(f, root, Limits{Bytes: 8 * MiB, Inodes: 1000})

	f.Fuzz(func(t *testing.T, in []byte) {
		// A stream of requests reusing tags in flight gets no replies and
		// stalls at MaxInflight until ctx ends: that is the bound.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- fs.Serve(ctx, &byteConn{r: bytes.NewReader(in)}) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Serve hung")
		}
		ents, err := os.ReadDir(parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != "ws" && e.Name() != "canary" {
				t.Fatalf("made %s outside the workspace", e.Name())
			}
		}
		if b, _ := os.ReadFile(canary); string(b) != "outside" {
			t.Fatal("canary changed")
		}
		if fs.files.Load() != 0 {
			t.Fatalf("%d Files alive after the connection", fs.files.Load())
		}
	})
}

var _ io.ReadWriteCloser = (*byteConn)(nil)
