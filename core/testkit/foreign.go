package testkit

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// NobodyUID is the uid (and gid) a test plays another local user with.
const NobodyUID = 65534

// ForeignListener is a process of another user listening on a Unix
// socket (testdata/foreignlistener).
type ForeignListener struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	done   bool
}

// ListenAsNobody listens on the Unix socket path in a process running as
// uid and gid NobodyUID: a hostile local user who bound first. The test
// must run as root, which it is in CI and make test; it fails otherwise.
// NobodyUID must be able to create path (a shared directory, or one it
// owns).
func ListenAsNobody(t testing.TB, path string) *ForeignListener {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("playing another user needs root (run the test as root, as make test does)")
	}
	bin := nobodyCanRun(t, build(t, "./testdata/foreignlistener", "foreignlistener"))
	cmd := exec.Command(bin, path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: NobodyUID, Gid: NobodyUID}}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the foreign listener: %v", err)
	}
	l := &ForeignListener{t: t, cmd: cmd, stdin: stdin, stdout: bufio.NewReader(out)}
	t.Cleanup(func() {
		if !l.done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	if line, err := l.stdout.ReadString('\n'); err != nil || line != "listening\n" {
		t.Fatalf("the foreign listener on %s did not start: %q %v", path, line, err)
	}
	return l
}

// MoveInAsNobody starts a ListenAsNobody listener in a directory of
// NobodyUID's, then renames its socket to path, where NobodyUID could not
// have created it: it goes on serving there (a socket is found by its
// inode), as one slipped in through a race, or by a careless root, would.
// The socket file stays NobodyUID's.
func MoveInAsNobody(t testing.TB, path string) *ForeignListener {
	t.Helper()
	dir, err := os.MkdirTemp("", "capsem-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, NobodyUID, NobodyUID); err != nil {
		t.Fatalf("giving a directory to uid %d (the test must run as root): %v", NobodyUID, err)
	}
	bound := filepath.Join(dir, "bound.sock")
	l := ListenAsNobody(t, bound)
	if err := os.Rename(bound, path); err != nil {
		t.Fatal(err)
	}
	return l
}

// Stop ends the listener and returns how many connections it accepted
// and how many bytes they carried.
func (l *ForeignListener) Stop() (connections, bytes int) {
	l.t.Helper()
	l.stdin.Close()
	line, err := l.stdout.ReadString('\n')
	l.done = true
	if werr := l.cmd.Wait(); err == nil {
		err = werr
	}
	if _, serr := fmt.Sscanf(strings.TrimSpace(line), "connections %d bytes %d", &connections, &bytes); serr != nil || err != nil {
		l.t.Fatalf("the foreign listener's report: %q %v %v", line, err, serr)
	}
	return connections, bytes
}

// nobodyCanRun returns a copy of bin that NobodyUID can execute: the build
// cache may sit below a directory only root may enter.
func nobodyCanRun(t testing.TB, bin string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "capsem-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(bin))
	copyFile(t, bin, dst)
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}
