package unixsock

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/testkit"
)

// privateTestDir is a fresh directory of this user's at a short path (a
// Unix socket's path is bounded), that other uids may enter.
func privateTestDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "usk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func modeOf(t *testing.T, path string) fs.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode()
}

// TestSecureDir: a directory of this user's is made private (created
// 0700, or tightened when others may only read it); a shared one, or one
// of another user's, is refused and left as it is.
func TestSecureDir(t *testing.T) {
	tests := []struct {
		name    string
		mode    fs.FileMode // 0: do not create it
		owner   int         // -1: this user
		want    fs.FileMode // the mode after
		refusal string      // "" when accepted
	}{
		{name: "missing", want: 0o700 | fs.ModeDir, owner: -1},
		{name: "private", mode: 0o700, owner: -1, want: 0o700 | fs.ModeDir},
		{name: "readable by others", mode: 0o755, owner: -1, want: 0o700 | fs.ModeDir},
		{name: "sticky and world-writable, like /tmp", mode: 0o777 | fs.ModeSticky, owner: -1,
			want: 0o777 | fs.ModeSticky | fs.ModeDir, refusal: "other users can create and replace files in it (mode 1777)"},
		{name: "sticky only", mode: 0o700 | fs.ModeSticky, owner: -1,
			want: 0o700 | fs.ModeSticky | fs.ModeDir, refusal: "(mode 1700)"},
		{name: "group-writable", mode: 0o770, owner: -1, want: 0o770 | fs.ModeDir, refusal: "(mode 0770)"},
		{name: "world-writable", mode: 0o707, owner: -1, want: 0o707 | fs.ModeDir, refusal: "(mode 0707)"},
		{name: "another user's", mode: 0o755, owner: testkit.NobodyUID, want: 0o755 | fs.ModeDir,
			refusal: "it belongs to uid 65534, not to you"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(privateTestDir(t), "run")
			if tt.mode != 0 {
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				// Mkdir leaves out the sticky bit and what umask masks.
				if err := os.Chmod(dir, tt.mode); err != nil {
					t.Fatal(err)
				}
			}
			if tt.owner >= 0 {
				if os.Geteuid() != 0 {
					t.Fatal("giving a directory to another user needs root (run the test as root, as make test does)")
				}
				if err := os.Chown(dir, tt.owner, tt.owner); err != nil {
					t.Fatal(err)
				}
			}
			err := SecureDir(dir)
			switch {
			case tt.refusal == "" && err != nil:
				t.Fatalf("SecureDir = %v", err)
			case tt.refusal != "" && (!IsNotPrivate(err) || !strings.Contains(err.Error(), dir+" is not private to you: ") ||
				!strings.Contains(err.Error(), tt.refusal)):
				t.Fatalf("SecureDir = %v, want a refusal naming %s and %q", err, dir, tt.refusal)
			}
			if got := modeOf(t, dir); got != tt.want {
				t.Errorf("mode after = %v, want %v", got, tt.want)
			}
			// What SecureDir accepts, CheckPrivateDir accepts; what it
			// refuses, so does CheckPrivateDir.
			if cerr := CheckPrivateDir(dir); (cerr == nil) != (tt.refusal == "") {
				t.Errorf("CheckPrivateDir = %v after SecureDir = %v", cerr, err)
			}
		})
	}
}

func TestCheckPrivateDirChangesNothing(t *testing.T) {
	dir := privateTestDir(t) // 0755: others may read it, not write
	if err := CheckPrivateDir(dir); err != nil {
		t.Fatalf("CheckPrivateDir(%s) = %v", dir, err)
	}
	if got := modeOf(t, dir).Perm(); got != 0o755 {
		t.Errorf("mode after = %v, want 0755", got)
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	if err := CheckPrivateDir(file); !IsNotPrivate(err) || !strings.Contains(err.Error(), "regular file, not a directory") {
		t.Errorf("CheckPrivateDir of a file = %v", err)
	}
	if err := CheckPrivateDir(filepath.Join(dir, "missing")); err == nil || IsNotPrivate(err) {
		t.Errorf("CheckPrivateDir of a missing directory = %v, want the stat error", err)
	}
}

func TestDial(t *testing.T) {
	path := filepath.Join(privateTestDir(t), "api.sock")
	ctx := context.Background()
	if _, err := Dial(ctx, path); err == nil || IsNotPrivate(err) {
		t.Fatalf("Dial with no socket = %v, want an ordinary error (nothing serves yet)", err)
	}
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatalf("Dial of this user's own socket = %v", err)
	}
	defer c.Close()
	buf := make([]byte, 5)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// TestDialRefusesAnotherUsersListener: another local user listens where
// a client looks for its server. Dial refuses in each way that user may
// have got there, and the listener receives not one byte.
func TestDialRefusesAnotherUsersListener(t *testing.T) {
	tests := []struct {
		name string
		// place puts a foreign listener where the client dials, at path.
		place   func(t *testing.T, path string) *testkit.ForeignListener
		refusal string
		reached bool // the client connected before refusing
	}{
		{name: "a shared directory, where the other user bound first", place: func(t *testing.T, path string) *testkit.ForeignListener {
			if err := os.Chmod(filepath.Dir(path), 0o777|fs.ModeSticky); err != nil {
				t.Fatal(err)
			}
			return testkit.ListenAsNobody(t, path)
		}, refusal: "other users can create and replace files in it (mode 1777)"},
		{name: "the other user's socket in a private directory", place: func(t *testing.T, path string) *testkit.ForeignListener {
			return testkit.MoveInAsNobody(t, path)
		}, refusal: "the socket belongs to uid 65534, not to you"},
		{name: "a socket of this user's on which the other user listens", place: func(t *testing.T, path string) *testkit.ForeignListener {
			l := testkit.MoveInAsNobody(t, path)
			if err := os.Lchown(path, os.Geteuid(), os.Getegid()); err != nil {
				t.Fatal(err)
			}
			return l
		}, refusal: "runs as uid 65534, not as you", reached: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(privateTestDir(t), "service.sock")
			l := tt.place(t, path)
			c, err := Dial(context.Background(), path)
			if err == nil {
				c.Write([]byte("GET /v1/vms HTTP/1.1\r\n\r\n"))
				c.Close()
			}
			if !IsNotPrivate(err) || !strings.HasPrefix(err.Error(), "refusing to connect to "+path+": ") || !strings.Contains(err.Error(), tt.refusal) {
				t.Errorf("Dial = %v, want a refusal naming %s and %q", err, path, tt.refusal)
			}
			conns, bytes := l.Stop()
			if bytes != 0 {
				t.Errorf("the other user's listener received %d bytes", bytes)
			}
			if reached := conns > 0; reached != tt.reached {
				t.Errorf("the listener accepted %d connections; want a connection: %v", conns, tt.reached)
			}
		})
	}
}

func TestReadPrivateFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, want string
	}{
		{"private", write("ok", "key", 0o600), ""},
		{"group readable", write("group", "key", 0o640), "must be readable by its owner only (0600)"},
		{"world readable", write("world", "key", 0o604), "must be readable by its owner only"},
		{"too big", write("big", "12345", 0o600), "larger than 4 bytes"},
		{"a directory", dir, "not a regular file"},
		{"a FIFO with no writer", fifo, "not a regular file"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			max := int64(4)
			if tc.want == "" {
				max = 16
			}
			b, err := ReadPrivateFile(tc.path, max)
			if tc.want == "" {
				if err != nil || string(b) != "key" {
					t.Fatalf("got %q, %v", b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
