package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "api.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode = %v, %v; want 0600", st.Mode(), err)
	}
	if dst, _ := os.Stat(filepath.Dir(path)); dst.Mode().Perm() != 0o700 {
		t.Errorf("created directory mode = %v, want 0700", dst.Mode().Perm())
	}
	if !Live(path) {
		t.Fatal("the socket does not accept connections")
	}
	ln.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("closing left the socket behind: %v", err)
	}
	if Live(path) {
		t.Error("a closed socket is live")
	}
}

func TestListenReplacesOnlyASocket(t *testing.T) {
	dir := t.TempDir()
	// A stale socket: bound, then its listener gone without removing it.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	ln, err := Listen(stale)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	ln.Close()

	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("keep me"), 0o600)
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep me too"), 0o600)
	link := filepath.Join(dir, "link")
	os.Symlink(target, link)
	sub := filepath.Join(dir, "dir")
	os.Mkdir(sub, 0o700)
	for path, kind := range map[string]string{file: "regular file", link: "symbolic link", sub: "directory"} {
		_, err := Listen(path)
		if err == nil || !strings.Contains(err.Error(), "refusing to replace "+path+": it is a "+kind) {
			t.Errorf("Listen(%s) = %v, want a refusal naming a %s", path, err, kind)
		}
	}
	for path, want := range map[string]string{file: "keep me", target: "keep me too"} {
		if b, _ := os.ReadFile(path); string(b) != want {
			t.Errorf("%s now holds %q", path, b)
		}
	}
}
