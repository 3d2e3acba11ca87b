package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/vmm"
)

// shortDir is a temp dir with a short path: a Unix socket path holds at most
// 107 bytes and t.TempDir() paths are long.
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "cvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func testLogger(t testing.TB) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(w.end)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// tWriter logs through the test until it ends: a machine's goroutines (the
// channel noticing QEMU is gone) may still speak after the test returned,
// and testing panics on a Log after the end.
type tWriter struct {
	t     testing.TB
	mu    sync.Mutex
	ended bool
}

func (w *tWriter) end() {
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

// bootSpec is the spec the real-boot tests share: 2 vCPUs, 512 MiB, one
// read-only disk and one share, TCG unless KVM is usable.
func bootSpec(t *testing.T, dir string) vmm.Spec {
	a := testAssets(t)
	disk := filepath.Join(dir, "disk.img")
	img := make([]byte, 1<<20)
	copy(img, "CAPSEM-DISK-0001")
	if err := os.WriteFile(disk, img, 0o600); err != nil {
		t.Fatal(err)
	}
	share := filepath.Join(dir, "share")
	os.Mkdir(share, 0o755)
	return vmm.Spec{
		Name:          "boot-test",
		Kernel:        a.Kernel,
		Initramfs:     a.Initramfs,
		Cmdline:       "console=ttyS0 panic=-1 quiet capsem.channel=serial",
		CPUs:          2,
		MemoryMiB:     512,
		Disks:         []vmm.Disk{{ID: "base", Path: disk, ReadOnly: true}},
		Shares:        []vmm.Share{{Tag: "share", HostPath: share}},
		ChannelSocket: filepath.Join(dir, "chan.sock"),
		ConsoleLog:    filepath.Join(dir, "console.log"),
	}
}

// TestBootRealGuest boots the kernel and a busybox initramfs under QEMU
// (TCG here), and proves the channel end to end: the guest opens the port
// and dials the host's control port, streams work both ways, the disk and
// the share are there, and the guest powering off ends QEMU, reaped.
func TestBootRealGuest(t *testing.T) {
	dir := shortDir(t)
	spec := bootSpec(t, dir)
	b := realBackend(t)
	vm, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	m := vm.(*Machine)
	t.Logf("accelerator: %s", m.Accel())
	defer func() {
		if t.Failed() {
			log, _ := os.ReadFile(spec.ConsoleLog)
			t.Logf("console log:\n%s", log)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := vm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	started := time.Since(t0)
	if _, err := os.Stat(spec.ChannelSocket); !os.IsNotExist(err) {
		t.Errorf("channel socket still there after QEMU connected: %v", err)
	}
	ch := vm.Channel()
	ctl, err := ch.Listen(guestchan.PortControl)
	if err != nil {
		t.Fatal(err)
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, 1)
	go func() { c, err := ctl.Accept(); acc <- accepted{c, err} }()
	var conn net.Conn
	select {
	case a := <-acc:
		if a.err != nil {
			t.Fatalf("accepting the guest's control stream: %v", a.err)
		}
		conn = a.c
	case <-vm.Done():
		t.Fatalf("QEMU exited before the guest dialled: %v", vm.Wait())
	case <-ctx.Done():
		t.Fatal("guest never dialled the control port")
	}
	rd := bufio.NewReader(conn)
	hello, err := rd.ReadString('\n')
	if err != nil {
		t.Fatalf("reading hello: %v", err)
	}
	firstByte := time.Since(t0)
	t.Logf("guest: %s", strings.TrimSpace(hello))
	t.Logf("FIGURE boot (QEMU start → first channel byte, %s, 2 vCPU, 512 MiB, bzImage): %v (QEMU connected after %v)",
		m.Accel(), firstByte.Round(time.Millisecond), started.Round(time.Millisecond))
	for _, want := range []string{"hello kind=serial", `vda="CAPSEM-DISK-0001"`, "vda_serial=base", "share=ok"} {
		if !strings.Contains(hello, want) {
			t.Errorf("hello %q lacks %q", hello, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(spec.Shares[0].HostPath, "from-guest.txt")); err != nil || string(b) != "written by the guest\n" {
		t.Errorf("file the guest wrote into the share: %q, %v", b, err)
	}

	// Host → guest: round trips on the echo port.
	echo, err := ch.Dial(ctx, guestchan.PortTerminal)
	if err != nil {
		t.Fatal(err)
	}
	msg := make([]byte, 64)
	var lat []time.Duration
	for i := range 500 {
		binary.BigEndian.PutUint64(msg, uint64(i))
		s := time.Now()
		if _, err := echo.Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(echo, got); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(s))
		if !bytes.Equal(got, msg) {
			t.Fatalf("echo %d differs", i)
		}
	}
	echo.Close()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("FIGURE channel round trip (64 B, yamux stream, %s): p50 %v p99 %v",
		m.Accel(), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Microsecond))

	// Throughput each way, 32 MiB.
	const total = 32 << 20
	sink, err := ch.Dial(ctx, guestchan.PortExecOutput)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256<<10)
	s := time.Now()
	for n := 0; n < total; n += len(buf) {
		if _, err := sink.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	sink.Close()
	up := time.Since(s)
	src, err := ch.Dial(ctx, guestchan.PortEgress)
	if err != nil {
		t.Fatal(err)
	}
	s = time.Now()
	binary.Write(src, binary.BigEndian, uint64(total))
	n, err := io.Copy(io.Discard, src)
	down := time.Since(s)
	if err != nil || n != total {
		t.Fatalf("guest → host: %d bytes, %v", n, err)
	}
	src.Close()
	mibs := func(d time.Duration) string { return fmt.Sprintf("%.0f MiB/s", float64(total)/(1<<20)/d.Seconds()) }
	t.Logf("FIGURE channel throughput (32 MiB one stream, %s): host→guest %s, guest→host %s", m.Accel(), mibs(up), mibs(down))

	// The guest powers off when told; QEMU exits cleanly and is reaped.
	fmt.Fprintln(conn, "exit")
	if bye, _ := rd.ReadString('\n'); bye != "bye\n" {
		t.Errorf("reply to exit: %q", bye)
	}
	select {
	case <-vm.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("QEMU still running a minute after the guest powered off")
	}
	if err := vm.Wait(); err != nil {
		t.Fatalf("Wait after power-off: %v", err)
	}
	select {
	case <-ch.Done():
	case <-time.After(5 * time.Second):
		t.Error("channel not Done after QEMU exited")
	}
	assertReaped(t, m.PID())
	console, _ := os.ReadFile(spec.ConsoleLog)
	if !bytes.Contains(console, []byte("capsem-test: init ready")) {
		t.Errorf("console log lacks the init's line:\n%s", console)
	}
}

// TestBootCancelKillsQEMU: ending the context Start got kills the VM, and
// QEMU is reaped.
func TestBootCancelKillsQEMU(t *testing.T) {
	dir := shortDir(t)
	spec := bootSpec(t, dir)
	vm, err := (&Backend{Log: testLogger(t), StopGrace: 2 * time.Second, VerdictPath: testkit.AccelVerdict(t)}).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := vm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pid := vm.PID()
	if !processAlive(pid) {
		t.Fatalf("QEMU pid %d not running after Start", pid)
	}
	cancel()
	select {
	case <-vm.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("QEMU still running 10 s after its context was cancelled")
	}
	if err := vm.Wait(); err != nil {
		t.Errorf("Wait after a cancel (a stop): %v", err)
	}
	assertReaped(t, pid)
	if err := vm.Stop(context.Background()); err != nil {
		t.Errorf("Stop after exit: %v", err)
	}
}

// TestRealQEMUAcceptsOddPaths: real QEMU parses the argv for paths with
// commas (escaped ",,") in every option string, a writable disk and a
// share, and runs the kernel until Stop; Stop is then a clean end.
func TestRealQEMUAcceptsOddPaths(t *testing.T) {
	dir := filepath.Join(shortDir(t), "a,b")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := bootSpec(t, dir)
	spec.Cmdline = "console=ttyS0 panic=-1" // not quiet: the console must show the kernel
	rw := filepath.Join(dir, "rw,disk.img")
	if err := os.WriteFile(rw, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	spec.Disks = append(spec.Disks, vmm.Disk{ID: "upper", Path: rw})
	vm, err := realBackend(t).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, _ := os.ReadFile(spec.ConsoleLog)
		if bytes.Contains(b, []byte("Linux version")) {
			break
		}
		select {
		case <-vm.Done():
			t.Fatalf("QEMU exited: %v", vm.Wait())
		default:
		}
		if time.Now().After(deadline) {
			vm.Stop(context.Background())
			t.Fatalf("no kernel banner on the console log after 60 s:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	pid := vm.PID()
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := vm.Wait(); err != nil {
		t.Fatalf("Wait after Stop: %v", err)
	}
	assertReaped(t, pid)
}

// realBackend is the backend of the tests that boot real guests, with the
// accelerator verdict every VM test shares (KVM is proven once per host
// boot, not once per test).
func realBackend(t *testing.T) *Backend {
	return &Backend{Log: testLogger(t), VerdictPath: testkit.AccelVerdict(t)}
}
