package guestchan

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFromCmdline(t *testing.T) {
	for cmdline, want := range map[string]Kind{
		"":                           KindSerial,
		"console=ttyS0 panic=-1":     KindSerial,
		"capsem.channel=vsock quiet": KindVsock,
		"capsem.channel=serial":      KindSerial,
		"capsem.channel=vsock capsem.channel=serial": KindSerial,
		"xcapsem.channel=vsock":                      KindSerial,
	} {
		got, err := FromCmdline(cmdline)
		if err != nil || got != want {
			t.Errorf("FromCmdline(%q) = %q, %v; want %q", cmdline, got, err, want)
		}
	}
	for _, bad := range []string{"capsem.channel=", "capsem.channel=virtio", "capsem.channel=VSOCK"} {
		if _, err := FromCmdline(bad); err == nil || !strings.Contains(err.Error(), "capsem.channel") {
			t.Errorf("FromCmdline(%q): %v, want an error naming the parameter", bad, err)
		}
	}
}

// fakePorts lays out a sysfs-like virtio-ports directory and a dev dir.
func fakePorts(t *testing.T) (sysDir, devDir string) {
	d := t.TempDir()
	sysDir, devDir = filepath.Join(d, "sys"), filepath.Join(d, "dev")
	os.MkdirAll(sysDir, 0o755)
	os.MkdirAll(devDir, 0o755)
	addPort(t, sysDir, devDir, "vport0p0", "org.qemu.guest_agent.0")
	return
}

func addPort(t *testing.T, sysDir, devDir, node, name string) {
	os.MkdirAll(filepath.Join(sysDir, node), 0o755)
	// Device node first, then the name: the order the driver publishes in.
	if err := os.WriteFile(filepath.Join(devDir, node), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sysDir, node, "name"), []byte(name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenVirtioPortWaitsForThePort(t *testing.T) {
	sysDir, devDir := fakePorts(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		addPort(t, sysDir, devDir, "vport0p1", VirtioPortName)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := openVirtioPort(ctx, sysDir, devDir, VirtioPortName)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Name() != filepath.Join(devDir, "vport0p1") {
		t.Fatalf("opened %s", f.Name())
	}
}

func TestOpenVirtioPortGivesUp(t *testing.T) {
	sysDir, devDir := fakePorts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := openVirtioPort(ctx, sysDir, devDir, VirtioPortName)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errPortNotFound) ||
		!strings.Contains(err.Error(), VirtioPortName) {
		t.Fatalf("err = %v; want the deadline, the last cause and the port name", err)
	}
	// A name without its device node reports the open failure.
	os.MkdirAll(filepath.Join(sysDir, "vport1p1"), 0o755)
	os.WriteFile(filepath.Join(sysDir, "vport1p1", "name"), []byte(VirtioPortName), 0o644)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := openVirtioPort(ctx2, sysDir, devDir, VirtioPortName); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing device node: %v", err)
	}
	t.Log(err)
}

func TestOpenGuestUnknownKind(t *testing.T) {
	if _, err := OpenGuest(context.Background(), "carrier-pigeon", nil); err == nil {
		t.Fatal("unknown kind accepted")
	}
	ch, err := OpenGuest(context.Background(), KindVsock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
}

// A port opened before the host side is up must wait for it, not be handed
// to the multiplexer (its reads would return 0 bytes: end of channel).
func TestWaitForPeer(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "port")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	calls := 0
	err = waitForPeer(context.Background(), f, func() (bool, error) { calls++; return calls >= 3, nil })
	if err != nil || calls != 3 {
		t.Fatalf("err %v after %d checks, want success on the third", err, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err = waitForPeer(ctx, f, func() (bool, error) { return false, nil })
	if err == nil || !strings.Contains(err.Error(), "never opened") || !strings.Contains(err.Error(), f.Name()) {
		t.Fatalf("a host side that never opens: %v", err)
	}
	boom := errors.New("poll failed")
	if err := waitForPeer(context.Background(), f, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("a failing check: %v", err)
	}
}
