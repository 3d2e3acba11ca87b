package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/vmm"
)

// The test binary doubles as a fake QEMU (and as a VM owner process for the
// parent-death test), selected by environment: lifecycle tests then run in
// milliseconds and can misbehave on purpose. The real thing is exercised by
// boot_test.go.
const (
	fakeEnv  = "CAPSEM_TEST_FAKE_QEMU"
	ownerEnv = "CAPSEM_TEST_VM_OWNER"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeQEMU(mode, os.Args[1:]))
	}
	if dir := os.Getenv(ownerEnv); dir != "" {
		os.Exit(vmOwner(dir))
	}
	code := m.Run()
	if assetsDir != "" {
		os.RemoveAll(assetsDir)
	}
	os.Exit(code)
}

// fakeQEMU behaves like QEMU towards the backend: it connects to the
// channel socket named in its argv and runs a guest session with an echo on
// PortTerminal. Modes: connect, late (connect after 500 ms), ignore-term
// (SIGTERM does nothing), exit (complain and exit 3 before connecting),
// hang (never connect).
func fakeQEMU(mode string, args []string) int {
	if log := os.Getenv(fakeLogEnv); log != "" {
		f, _ := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		fmt.Fprintln(f, strings.Join(args, " "))
		f.Close()
	}
	if argAfter(args, "-accel") == "kvm" || slices.Contains(args, "--version") || slices.Contains(args, "stdio") {
		return fakeAccel(mode, args)
	}
	return fakeGuest(mode, args)
}

// fakeGuest is the fake's guest: modes as fakeQEMU's.
func fakeGuest(mode string, args []string) int {
	switch mode {
	case "exit":
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: -kernel: fake failure for the test")
		return 3
	case "hang":
		time.Sleep(time.Hour)
		return 0
	case "late":
		time.Sleep(500 * time.Millisecond)
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
	}
	sock := ""
	for i, a := range args {
		if a == "-chardev" && strings.HasPrefix(args[i+1], "socket,") {
			for _, kv := range strings.Split(strings.ReplaceAll(args[i+1], ",,", "\x00"), ",") {
				if v, ok := strings.CutPrefix(kv, "path="); ok {
					sock = strings.ReplaceAll(v, "\x00", ",")
				}
			}
		}
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake qemu: connecting %q: %v\n", sock, err)
		return 1
	}
	s, err := guestchan.Client(c, nil)
	if err != nil {
		return 1
	}
	l, _ := s.Listen(guestchan.PortTerminal)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	<-s.Done()
	return 0
}

// fakeLogEnv names a file the fake appends each argv to.
const fakeLogEnv = "CAPSEM_TEST_FAKE_QEMU_LOG"

// The accelerator behaviours of the fake, as measured on real hosts:
// pvm is a PVM nested /dev/kvm (-cpu host aborts on MSR 0x10a, any other
// model runs a kernel that never reaches userspace); kvm-hang never gets
// a stock kernel to userspace; nested-msr refuses MSR 0x10a but runs the
// guest without arch-capabilities; kvm-works is a KVM that is fine.
// Under TCG every mode is a guest that works.
func fakeAccel(mode string, args []string) int {
	if slices.Contains(args, "--version") {
		fmt.Println("QEMU emulator version 7.2.99 (fake)")
		return 0
	}
	kvm, cpu := argAfter(args, "-accel") == "kvm", argAfter(args, "-cpu")
	probe := slices.Contains(args, "stdio")
	msrAbort := func() int {
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: error: failed to set MSR 0x10a to 0x69")
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64: ../../target/i386/kvm/kvm.c:3183: kvm_buf_set_msrs: Assertion `ret == cpu->kvm_msr_buf->nmsrs' failed.")
		syscall.Kill(os.Getpid(), syscall.SIGABRT)
		return 134
	}
	works := !kvm || mode == "kvm-works" || (mode == "nested-msr" && cpu != "host")
	switch {
	case kvm && cpu == "host" && (mode == "pvm" || mode == "nested-msr"):
		return msrAbort()
	case !works:
		fmt.Println("Probing EDD (edd=off to disable)... ok")
		time.Sleep(time.Hour)
		return 0
	case probe:
		fmt.Println(Marker)
		time.Sleep(time.Hour)
		return 0
	}
	return fakeGuest("connect", args)
}

func argAfter(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// vmOwner starts a fake VM, prints QEMU's PID and waits to be killed.
func vmOwner(dir string) int {
	os.Setenv(fakeEnv, "ignore-term")
	os.Unsetenv(ownerEnv)
	exe, _ := os.Executable()
	vm, err := (&Backend{Binary: exe, OpenKVM: noKVM}).Create(context.Background(), fakeSpec(dir))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	if err := vm.Start(context.Background()); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("pid", vm.PID())
	time.Sleep(time.Hour)
	return 0
}

func noKVM() error { return errors.New("no kvm in tests") }

func fakeSpec(dir string) vmm.Spec {
	s := minimalSpec()
	s.Name = "fake"
	s.ChannelSocket = filepath.Join(dir, "chan.sock")
	s.ConsoleLog = filepath.Join(dir, "console.log")
	return s
}

// fakeMachine creates a machine whose QEMU is this test binary in mode.
func fakeMachine(t *testing.T, mode string) (*Machine, vmm.Spec) {
	t.Setenv(fakeEnv, mode)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spec := fakeSpec(shortDir(t))
	vm, err := (&Backend{Binary: exe, OpenKVM: noKVM, Log: testLogger(t), StopGrace: 300 * time.Millisecond}).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return vm.(*Machine), spec
}

func assertNoSocket(t *testing.T, spec vmm.Spec) {
	t.Helper()
	if _, err := os.Lstat(spec.ChannelSocket); !os.IsNotExist(err) {
		t.Errorf("channel socket left behind: %v", err)
	}
}

func TestStartStopWithFakeQEMU(t *testing.T) {
	m, spec := fakeMachine(t, "connect")
	if m.Channel() != nil || m.PID() != 0 {
		t.Fatal("Channel or PID set before Start")
	}
	if err := m.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	m, spec = fakeMachine(t, "connect") // Stop before Start poisons a machine; use a fresh one
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err == nil {
		t.Fatal("second Start succeeded")
	}
	assertNoSocket(t, spec)
	if fi, err := os.Stat(spec.ConsoleLog); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("console log: %v %v, want mode 0600", fi, err)
	}
	// The channel works through the backend's socket. The fake guest
	// listens on its port only after it connected: until then a dial is
	// answered "no listener", as a real guest's would be.
	var c net.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err = m.Channel().Dial(context.Background(), guestchan.PortTerminal)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c, "hi")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "hi\n" {
		t.Fatalf("echo through the fake QEMU: %q %v", line, err)
	}
	pid := m.PID()
	for range 3 {
		if err := m.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Wait(); err != nil {
		t.Errorf("Wait after Stop: %v", err)
	}
	<-m.Channel().Done()
	assertReaped(t, pid)
}

func TestStartFailsWhenQEMUExits(t *testing.T) {
	m, spec := fakeMachine(t, "exit")
	err := m.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exited before connecting") || !strings.Contains(err.Error(), "fake failure") {
		t.Fatalf("Start: %v; want the exit and QEMU's stderr", err)
	}
	t.Log(err)
	assertNoSocket(t, spec)
	<-m.Done()
	if werr := m.Wait(); werr == nil {
		t.Error("Wait after a failed Start: nil")
	}
	assertReaped(t, m.PID())
}

func TestStartTimeoutKillsQEMU(t *testing.T) {
	m, spec := fakeMachine(t, "hang")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := m.Start(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start with a short deadline: %v", err)
	}
	assertNoSocket(t, spec)
	assertReaped(t, m.PID())
	if m.Channel() != nil {
		t.Error("Channel set after a failed Start")
	}
}

func TestStartMissingBinary(t *testing.T) {
	_, err := (&Backend{Binary: "/nonexistent/qemu"}).Create(context.Background(), minimalSpec())
	if err == nil || !strings.Contains(err.Error(), "qemu-system-x86") {
		t.Fatalf("Create with a missing binary: %v", err)
	}
}

func TestStartReplacesStaleSocketOnly(t *testing.T) {
	m, spec := fakeMachine(t, "connect")
	// A stale socket from a crashed run is replaced.
	l, err := net.Listen("unix", spec.ChannelSocket)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if err := m.Start(context.Background()); err != nil {
		t.Fatalf("Start over a stale socket: %v", err)
	}
	m.Stop(context.Background())

	// A regular file is never removed.
	m, spec = fakeMachine(t, "connect")
	os.WriteFile(spec.ChannelSocket, []byte("precious"), 0o600)
	if err := m.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Start over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(spec.ChannelSocket); string(b) != "precious" {
		t.Fatal("the regular file was touched")
	}
}

// TestForeignPeerRefused: a process that connects to the channel socket
// before QEMU is turned away; QEMU's own connection is accepted.
func TestForeignPeerRefused(t *testing.T) {
	m, spec := fakeMachine(t, "late")
	errc := make(chan error, 1)
	go func() { errc <- m.Start(context.Background()) }()
	var c net.Conn
	for range 200 {
		var err error
		if c, err = net.Dial("unix", spec.ChannelSocket); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if c == nil {
		t.Fatal("never reached the channel socket")
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("foreign peer: read %d, %v; want EOF", n, err)
	}
	if fi, err := os.Stat(spec.ChannelSocket); err == nil && fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if err := <-errc; err != nil {
		t.Fatalf("Start: %v", err)
	}
	m.Stop(context.Background())
}

func TestStopEscalatesToSIGKILL(t *testing.T) {
	m, _ := fakeMachine(t, "ignore-term")
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	m.Stop(context.Background())
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("Stop returned after %v, before the grace period", d)
	}
	if err := m.Wait(); err != nil {
		t.Errorf("Wait after a Stop that needed SIGKILL: %v", err)
	}
	assertReaped(t, m.PID())
}

func TestExitWithoutStopIsReported(t *testing.T) {
	m, _ := fakeMachine(t, "connect")
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(m.PID(), syscall.SIGKILL) // "QEMU crashed"
	select {
	case <-m.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after QEMU died")
	}
	if err := m.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Wait after QEMU was killed behind our back: %v", err)
	}
	select {
	case <-m.Channel().Done():
	case <-time.After(5 * time.Second):
		t.Error("channel not Done after QEMU died")
	}
	m.Stop(context.Background()) // must not hide the crash
	if err := m.Wait(); err == nil {
		t.Error("Stop after the crash turned Wait's error into nil")
	}
}

// TestQEMUDiesWithItsOwner: SIGKILL the process that owns the VM; the
// parent-death signal takes QEMU down with it (QEMU here ignores SIGTERM,
// so only the SIGKILL from Pdeathsig can do it).
func TestQEMUDiesWithItsOwner(t *testing.T) {
	exe, _ := os.Executable()
	owner := exec.Command(exe)
	owner.Env = append(os.Environ(), ownerEnv+"="+shortDir(t))
	out, _ := owner.StdoutPipe()
	owner.Stderr = os.Stderr
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	defer owner.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("owner: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	if err != nil {
		t.Fatalf("owner said %q", line)
	}
	if !processAlive(pid) {
		t.Fatalf("QEMU %d not running under its owner", pid)
	}
	// The owner runs long enough for the runtime to have spare threads;
	// the spawning thread is locked, so only the owner's death counts.
	time.Sleep(200 * time.Millisecond)
	if !processAlive(pid) {
		t.Fatalf("QEMU %d died while its owner lived", pid)
	}
	owner.Process.Kill()
	owner.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for processAlive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("QEMU %d outlived its owner", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
