package vmhost_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
)

// bootVMIn boots a VM whose session directory is dir/session, which may
// hold a disk and workspace already: that is how a named VM boots again.
// Unlike startVM it leaves dir alone when the VM stops (see shutdown).
func bootVMIn(t *testing.T, name, dir string) *vmProc {
	t.Helper()
	v := launchVM(t, name, dir)
	// Whatever fails later, no VM outlives the test.
	t.Cleanup(v.proc.Kill)
	return v
}

// shutdown stops the VM through the API and waits for its process to exit,
// keeping the session directory.
func (v *vmProc) shutdown(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v.proc.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := v.proc.Wait(); err != nil {
		t.Fatalf("the VM process exited with %v after stop", err)
	}
}

// guestSh runs a shell script in the guest and returns its stdout; a
// non-zero exit fails the test.
func (v *vmProc) guestSh(t *testing.T, script string) (string, *api.ExecEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o := v.exec(ctx, &api.ExecRequest{Command: script})
	if o.err != nil || o.ev.ExitCode != 0 {
		ev := o.ev
		if ev == nil {
			ev = &api.ExecEvent{}
		}
		t.Fatalf("guest script failed: %v exit %d\nstdout: %s\nstderr: %s\nscript: %s", o.err, ev.ExitCode, o.stdout.String(), o.stderr.String(), script)
	}
	return o.stdout.String(), o.ev
}

// TestNamedVMKeepsFilesAcrossBoots is "stop and boot again with files
// intact (named VM)": files written anywhere in the guest land on the
// per-VM disk through the root overlay, workspace files on the host, and a
// second `capsem process` on the same session directory finds them all.
func TestNamedVMKeepsFilesAcrossBoots(t *testing.T) {
	dir, err := os.MkdirTemp("", "capsem-vm-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	session := filepath.Join(dir, "session")
	ws := paths.Session{Dir: session}.Workspace()

	v := bootVMIn(t, "keeper", dir)
	t.Logf("first boot (disk created): %v", v.info.BootTimings)
	out, _ := v.guestSh(t, `set -e
awk '$2 == "/" {print "root=" $3} $2 == "/root/workspace" {print "workspace=" $3} $3 == "ext4" {print "ext4opts=" $4}' /proc/mounts
echo "clock=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
echo "lazyinit=$(ps | grep -c '[[]ext4lazyinit[]]' || true)"
echo persisted-etc > /etc/capsem-persist
head -c 1048576 /dev/urandom > /root/one-mib.bin
echo "sum=$(sha256sum /root/one-mib.bin | cut -d' ' -f1)"
mkdir -p /usr/local/bin
printf '#!/bin/sh\necho tool-ok\n' > /usr/local/bin/capsem-tool
chmod 755 /usr/local/bin/capsem-tool
rm /etc/shells
echo from-guest > /root/workspace/guest.txt
`)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, val, _ := strings.Cut(line, "=")
		got[k] = val
	}
	if got["root"] != "overlay" || got["workspace"] != "9p" || len(got["sum"]) != 64 {
		t.Fatalf("first boot: want an overlay root, a 9p workspace and a checksum; got %q", out)
	}
	sum := got["sum"]
	// The disk is mounted so that deletes punch holes, and no background
	// thread zeroes the inode tables of a fresh sparse image or reads its
	// bitmaps ahead.
	opts := strings.Split(got["ext4opts"], ",")
	for _, want := range []string{"discard", "noinit_itable", "no_prefetch_block_bitmaps"} {
		if !slices.Contains(opts, want) {
			t.Errorf("per-VM disk mount options %q lack %s", got["ext4opts"], want)
		}
	}
	if got["lazyinit"] != "0" {
		t.Errorf("%s ext4lazyinit threads run in the guest, want none", got["lazyinit"])
	}
	// A clocksource the vDSO can read (the TSC under TCG, kvm-clock under
	// KVM), not the HPET, whose every read is a system call and an
	// emulated MMIO access.
	if c := got["clock"]; c != "tsc" && c != "kvm-clock" {
		t.Errorf("guest clocksource %q, want tsc or kvm-clock", c)
	}

	// The workspace is the host's directory, both ways.
	if b, err := os.ReadFile(filepath.Join(ws, "guest.txt")); err != nil || string(b) != "from-guest\n" {
		t.Fatalf("the guest's workspace file on the host: %q %v", b, err)
	}
	hostData := make([]byte, 8<<20)
	rand.Read(hostData)
	if err := os.WriteFile(filepath.Join(ws, "host.bin"), hostData, 0o644); err != nil {
		t.Fatal(err)
	}
	hostSum := sha256.Sum256(hostData)
	out, read := v.guestSh(t, "sha256sum /root/workspace/host.bin | cut -d' ' -f1")
	if strings.TrimSpace(out) != hex.EncodeToString(hostSum[:]) {
		t.Fatalf("8 MiB written by the host reads back in the guest as %q", out)
	}
	_, write := v.guestSh(t, "dd if=/dev/zero of=/root/workspace/zero.bin bs=1M count=8 2>/dev/null")
	if b, err := os.ReadFile(filepath.Join(ws, "zero.bin")); err != nil || !bytes.Equal(b, make([]byte, 8<<20)) {
		t.Fatalf("8 MiB of zeros written by the guest: %d bytes on the host, %v", len(b), err)
	}
	t.Logf("workspace (9p): guest read+sha256 of 8 MiB in %d ms, guest write of 8 MiB in %d ms", read.DurationMS, write.DurationMS)

	v.shutdown(t)
	disk := paths.Session{Dir: session}.Disk()
	var st unix.Stat_t
	if err := unix.Stat(disk, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("disk.img after the first boot: %d bytes allocated of %d", st.Blocks*512, st.Size)
	if st.Size != api.DefaultDiskGB<<30 || st.Blocks*512 > 64<<20 {
		t.Fatalf("disk.img: size %d, %d bytes allocated; want %d GiB and sparse (under 64 MiB)", st.Size, st.Blocks*512, api.DefaultDiskGB)
	}
	// The guest unmounted its disk cleanly: fsck finds nothing to do.
	if e2fsck, err := exec.LookPath("e2fsck"); err == nil {
		if out, err := exec.Command(e2fsck, "-fn", disk).CombinedOutput(); err != nil {
			t.Fatalf("e2fsck -fn after stop: %v\n%s", err, out)
		}
	}

	v = bootVMIn(t, "keeper", dir)
	t.Logf("second boot (disk reused): %v", v.info.BootTimings)
	if v.info.BootTimings["guest_storage"] <= 0 {
		t.Errorf("boot timings lack guest_storage: %v", v.info.BootTimings)
	}
	out, _ = v.guestSh(t, `cat /etc/capsem-persist
sha256sum /root/one-mib.bin | cut -d' ' -f1
/usr/local/bin/capsem-tool
if [ -e /etc/shells ]; then echo shells-back; else echo shells-gone; fi
cat /root/workspace/guest.txt
`)
	want := "persisted-etc\n" + sum + "\ntool-ok\nshells-gone\nfrom-guest\n"
	if out != want {
		t.Fatalf("after boot again:\n%s\nwant:\n%s", out, want)
	}
	v.shutdown(t)
}
