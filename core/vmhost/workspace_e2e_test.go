package vmhost_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmhost"
)

// hostWorkspaceBytes is what the VM's workspace takes on the host's disk:
// the allocated blocks of every file under it, and of the files its
// process holds open after the guest deleted them (which still take room
// until closed).
func hostWorkspaceBytes(t *testing.T, v *vmProc) int64 {
	t.Helper()
	var total int64
	seen := map[uint64]bool{}
	count := func(st *syscall.Stat_t) {
		if !seen[st.Ino] {
			seen[st.Ino] = true
			total += st.Blocks * 512
		}
	}
	ws := paths.Session{Dir: v.sessionDir}.Workspace()
	err := filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		if p != ws {
			count(&st)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking the workspace: %v", err)
	}
	fdDir := "/proc/" + strconv.Itoa(v.info.PID) + "/fd"
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatalf("the VM process's descriptors: %v", err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil || !strings.HasPrefix(target, ws+"/") || !strings.HasSuffix(target, " (deleted)") {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join(fdDir, e.Name()), &st) == nil {
			count(&st)
		}
	}
	return total
}

// guestRun runs script in the guest and returns its output and exit code
// (a non-zero exit is the caller's to judge).
func (v *vmProc) guestRun(t *testing.T, script string) (stdout, stderr string, exit int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := v.exec(ctx, &api.ExecRequest{Command: script})
	if o.err != nil || o.ev == nil {
		t.Fatalf("running %q: %v", script, o.err)
	}
	return o.stdout.String(), o.stderr.String(), o.ev.ExitCode
}

// TestWorkspaceStaysWithinItsBound attacks the workspace as a guest that
// wants the host's disk: it writes past the bound, then holds a deleted
// file open and writes on; each time it gets ENOSPC at the bound, the
// host's disk never holds more than the bound for it, `df` in the guest
// shows the bound (not the host's free space), and the room comes back
// when the guest frees it. Files it makes carry no setuid bit and no
// device onto the host.
func TestWorkspaceStaysWithinItsBound(t *testing.T) {
	const boundMiB = 48
	v := startVM(t, "wsbound", func(c *vmhost.ProcessConfig) { c.WorkspaceMiB = boundMiB })
	defer v.stop(t)
	const bound = boundMiB << 20
	// Allocation rounds up to blocks, and a file's metadata may take a
	// few blocks the server measures only after the write.
	const slack = 256 << 10
	if w := v.info.Workspace; w == nil || w.LimitBytes != bound {
		t.Fatalf("info's workspace: %+v, want a %d-byte bound", w, bound)
	}

	out, _, _ := v.guestRun(t, "df -k /root/workspace | tail -n 1")
	f := strings.Fields(out)
	if len(f) < 4 || f[1] != strconv.Itoa(bound>>10) {
		t.Fatalf("df in the guest: %q, want %d KiB in all (the bound)", out, bound>>10)
	}

	_, stderr, exit := v.guestRun(t, "dd if=/dev/zero of=/root/workspace/fill bs=1M count=200")
	if exit == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("writing 200 MiB into a %d MiB workspace: exit %d, stderr %q; want ENOSPC", boundMiB, exit, stderr)
	}
	if used := hostWorkspaceBytes(t, v); used > bound+slack || used < bound-(4<<20) {
		t.Fatalf("the workspace takes %d bytes on the host after the guest filled it; want about the bound, %d", used, bound)
	}
	out, _, _ = v.guestRun(t, "df -k /root/workspace | tail -n 1")
	if f := strings.Fields(out); len(f) < 4 || f[3] != "0" {
		t.Fatalf("df in a full workspace: %q, want 0 KiB available", out)
	}
	info, err := v.client.Info(context.Background())
	if err != nil || info.Workspace == nil || info.Workspace.UsedBytes < bound-(4<<20) {
		t.Fatalf("info after the fill: %+v %v", info, err)
	}

	// Deleted but held open: the blocks stay taken on the host until the
	// last close, so they still count.
	_, stderr, exit = v.guestRun(t, `rm /root/workspace/fill && exec 3>/root/workspace/held && rm /root/workspace/held &&
dd if=/dev/zero bs=1M count=200 >&3; rc=$?; ls -l /proc/self/fd/3 >&2; exit $rc`)
	if exit == 0 || !strings.Contains(stderr, "No space left on device") {
		t.Fatalf("writing 200 MiB to a deleted file held open: exit %d, stderr %q; want ENOSPC", exit, stderr)
	}
	if used := hostWorkspaceBytes(t, v); used > bound+slack {
		t.Fatalf("the workspace takes %d bytes on the host (deleted files held open included); the bound is %d", used, bound)
	}
	// The shell that held it exited: its room is back.
	if _, stderr, exit := v.guestRun(t, "dd if=/dev/zero of=/root/workspace/again bs=1M count=32 && sync"); exit != 0 {
		t.Fatalf("writing 32 MiB once the held file closed: exit %d: %s", exit, stderr)
	}

	// No privilege reaches the host through the workspace.
	_, _, _ = v.guestRun(t, "touch /root/workspace/suid && chmod 6755 /root/workspace/suid; mknod /root/workspace/mem c 1 1")
	st, err := os.Stat(filepath.Join(paths.Session{Dir: v.sessionDir}.Workspace(), "suid"))
	if err != nil || st.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
		t.Fatalf("a guest chmod 6755 on the host: %v %v; want no setuid or setgid bit", st.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(paths.Session{Dir: v.sessionDir}.Workspace(), "mem")); err == nil {
		t.Fatal("the guest made a device node in the host's workspace")
	}
}

// TestHostDirectoryAsWorkspace: a host directory given as the workspace
// is the guest's /root/workspace and its commands' working directory;
// the guest's writes are on the host at once, the host's in the guest at
// once, and files are the host user's on the host and root's in the guest.
func TestHostDirectoryAsWorkspace(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v := startVM(t, "hostws", func(c *vmhost.ProcessConfig) { c.Workspace = dir; c.NoNetwork = true })
	defer v.stop(t)
	out, _ := v.guestSh(t, `pwd; cat hello.txt; stat -c %u hello.txt; echo from the guest > made-by-guest.txt; mkdir -p sub/deeper`)
	if want := "/root/workspace\nfrom the host\n0\n"; out != want {
		t.Errorf("guest saw %q, want %q", out, want)
	}
	got, err := os.ReadFile(filepath.Join(dir, "made-by-guest.txt"))
	if err != nil || string(got) != "from the guest\n" {
		t.Fatalf("the guest's file on the host: %q, %v", got, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "made-by-guest.txt"), &st); err != nil || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("the guest's file is owned by uid %d on the host, want %d (%v)", st.Uid, os.Geteuid(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "sub", "deeper")); err != nil || !fi.IsDir() {
		t.Errorf("the guest's directory on the host: %v", err)
	}
	// The host edits; the guest reads the edit at once (no cache).
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("edited on the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := v.guestSh(t, "cat /root/workspace/hello.txt"); out != "edited on the host\n" {
		t.Errorf("after the host's edit the guest read %q", out)
	}
	// An exec that names its own directory keeps it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if o := v.exec(ctx, &api.ExecRequest{Command: "pwd", Cwd: "/tmp"}); o.err != nil || o.stdout.String() != "/tmp\n" {
		t.Errorf("exec with cwd /tmp ran in %q (%v)", o.stdout.String(), o.err)
	}
}
