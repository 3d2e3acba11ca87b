package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/workspacefs"
)

// kernelEnd is the 9P client's side of a relay, as the kernel has it: it
// writes requests into one pipe and reads replies from another.
type kernelEnd struct {
	io.Reader
	io.Writer
	close func()
}

func (k kernelEnd) Close() error { k.close(); return nil }

// asLinux makes the client speak as Linux's does: its Tversion, the first
// message, asks for plain 9P2000.L (hugelgupf/p9's client asks for its
// extensions, and then creates files with a message Linux never sends).
type asLinux struct {
	w    io.Writer
	buf  []byte
	done bool
}

func (a *asLinux) Write(p []byte) (int, error) {
	if a.done {
		return a.w.Write(p)
	}
	a.buf = append(a.buf, p...)
	if len(a.buf) < 4 || len(a.buf) < int(binary.LittleEndian.Uint32(a.buf)) {
		return len(p), nil
	}
	a.done = true
	size := int(binary.LittleEndian.Uint32(a.buf))
	first, rest := a.buf[:size], a.buf[size:]
	if len(first) < p9HeaderSize+4 || first[4] != p9Tversion {
		return 0, errors.New("the client's first message is not its Tversion")
	}
	body := append(slices.Clone(first[p9HeaderSize:p9HeaderSize+4]), 8, 0)
	msg := p9Build(p9Tversion, append(body, "9P2000.L"...))
	copy(msg[5:7], first[5:7]) // its tag
	if _, err := a.w.Write(append(msg, rest...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// relayedClient starts a relay between a real 9P client (hugelgupf/p9's,
// standing in for the kernel's) and port, and attaches the client.
func relayedClient(t *testing.T, port io.ReadWriteCloser) (*wsRelay, *p9.Client) {
	t.Helper()
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	closeKernel := func() { reqR.Close(); repW.Close() }
	relay := newWSRelay(slog.New(slog.DiscardHandler), reqR, repW, closeKernel, port, guestwire.WorkspaceMsize)
	c, err := p9.NewClient(kernelEnd{repR, &asLinux{w: reqW}, func() { repR.Close(); reqW.Close() }}, p9.WithMessageSize(guestwire.WorkspaceMsize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		relay.End(errors.New("test over"))
	})
	return relay, c
}

// workspaceServer serves dir on a new connection, as a per-VM process's
// workspace server does; closing the FS ends it.
func workspaceServer(t *testing.T, dir string) (io.ReadWriteCloser, *workspacefs.FS) {
	t.Helper()
	fs, err := workspacefs.Open(context.Background(), dir, workspacefs.Limits{Bytes: 1 << 30, Inodes: 1 << 20}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fs.Serve(ctx, theirs); close(done) }()
	t.Cleanup(func() { cancel(); <-done; fs.Close() })
	return ours, fs
}

// TestWorkspaceRelayKeepsFidsAcrossServers: a client's directories and
// open files (one it created, one it opened, one under a directory it
// renamed) serve on after a park hands it to a new server of the same
// workspace; a file removed meanwhile fails its next use instead of
// hanging; requests the client sent during the park reach the new server.
func TestWorkspaceRelayKeepsFidsAcrossServers(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "proj", "src"), 0o755)
	os.WriteFile(filepath.Join(dir, "proj", "src", "old.txt"), []byte("old contents"), 0o644)
	os.WriteFile(filepath.Join(dir, "proj", "src", "gone.txt"), []byte("x"), 0o644)
	port1, _ := workspaceServer(t, dir)
	relay, c := relayedClient(t, port1)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	root, err := c.Attach("")
	must(err)
	_, src, err := root.Walk([]string{"proj", "src"})
	must(err)
	_, made, err := src.Walk(nil)
	must(err)
	made, _, _, err = made.Create("new.txt", p9.ReadWrite, 0o644, p9.UID(os.Getuid()), p9.GID(os.Getgid()))
	must(err)
	_, err = made.WriteAt([]byte("before "), 0)
	must(err)
	_, old, err := src.Walk([]string{"old.txt"})
	must(err)
	_, _, err = old.Open(p9.ReadOnly)
	must(err)
	_, gone, err := src.Walk([]string{"gone.txt"})
	must(err)
	// A directory above open files renamed: the fids follow it.
	must(root.RenameAt("proj", root, "project"))

	must(relay.Park(5 * time.Second))
	// While parked the client's requests wait; one sent now reaches the
	// next server.
	wrote := make(chan error, 1)
	go func() { _, err := made.WriteAt([]byte("during "), 7); wrote <- err }()
	select {
	case err := <-wrote:
		t.Fatalf("a write went through a parked relay: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	os.Remove(filepath.Join(dir, "project", "src", "gone.txt"))
	port2, _ := workspaceServer(t, dir)
	if err := relay.Resume(port2); err != nil {
		t.Fatalf("resume: %v (%s)", err, relay.track)
	}
	must(<-wrote)

	_, err = made.WriteAt([]byte("after"), 14)
	must(err)
	if b, _ := os.ReadFile(filepath.Join(dir, "project", "src", "new.txt")); string(b) != "before during after" {
		t.Errorf("the created file holds %q", b)
	}
	buf := make([]byte, 64)
	n, err := old.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) || string(buf[:n]) != "old contents" {
		t.Errorf("the opened file reads %q, %v", buf[:n], err)
	}
	// A walk from a replayed directory fid.
	if _, f, err := src.Walk([]string{"old.txt"}); err != nil {
		t.Errorf("walk from the directory after the park: %v", err)
	} else {
		f.Close()
	}
	// The removed file's fid is stale: an error, not a hang.
	if _, _, err := gone.Open(p9.ReadOnly); err == nil {
		t.Error("the fid of a file removed during the park opened")
	}
}

// TestWorkspaceRelayParkWaitsForReplies: a park waits for a request's
// reply, and with none in time it refuses, leaving the relay as it was.
func TestWorkspaceRelayParkWaitsForReplies(t *testing.T) {
	ours, theirs := net.Pipe()
	defer theirs.Close()
	reqR, reqW := io.Pipe()
	repR, repW := io.Pipe()
	relay := newWSRelay(slog.New(slog.DiscardHandler), reqR, repW, func() { reqR.Close(); repW.Close() }, ours, guestwire.WorkspaceMsize)
	defer relay.End(errors.New("test over"))
	// A Tversion the server never answers.
	msg := p9Build(p9Tversion, append(binary.LittleEndian.AppendUint32(nil, 8192), 0, 0))
	go reqW.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(theirs, got); err != nil {
		t.Fatal(err)
	}
	err := relay.Park(300 * time.Millisecond)
	if !errors.Is(err, errWorkspaceBusy) || !strings.Contains(err.Error(), "(1)") {
		t.Fatalf("park with a request unanswered: %v", err)
	}
	// Not parked: the reply still reaches the client.
	reply := p9Build(p9Tversion+1, append(binary.LittleEndian.AppendUint32(nil, 8192), 0, 0))
	go theirs.Write(reply)
	back := make([]byte, len(reply))
	if _, err := io.ReadFull(repR, back); err != nil || string(back) != string(reply) {
		t.Fatalf("the reply after a refused park: %q %v", back, err)
	}
	if err := relay.Park(time.Second); err != nil {
		t.Fatalf("park with nothing in flight: %v", err)
	}
}
