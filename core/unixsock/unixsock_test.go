package unixsock

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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

// TestDialWaitsForAFullQueue: a listener whose queue is full (a server
// slow to accept, under a flood of connections) refuses a connection at
// once; Live still counts it, and Dial waits for room instead of failing.
func TestDialWaitsForAFullQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "full.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var queued []net.Conn
	defer func() {
		for _, c := range queued {
			c.Close()
		}
	}()
	for {
		c, err := net.Dial("unix", path)
		if errors.Is(err, syscall.EAGAIN) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, c)
		if len(queued) > 100000 {
			t.Fatal("the queue never filled")
		}
	}
	if !Live(path) {
		t.Error("a listener with a full queue is not live")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = Dial(ctx, path)
	cancel()
	if !errors.Is(err, syscall.EAGAIN) || !strings.Contains(err.Error(), "stayed full") {
		t.Fatalf("Dial to a queue full until its deadline: %v", err)
	}
	dialed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := Dial(ctx, path)
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	time.Sleep(100 * time.Millisecond)
	// The server takes a few: room in the queue.
	for range 10 {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	if err := <-dialed; err != nil {
		t.Fatalf("Dial once the queue had room: %v", err)
	}
}
