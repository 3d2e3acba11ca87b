package qemu

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
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
	"github.com/capsem/capsem/core/guestwire"
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
	if err := signInheritedFDs(args); err != nil {
		fmt.Fprintf(os.Stderr, "fake qemu: %v\n", err)
		return 1
	}
	if slices.Contains(args, "defer") {
		if err := fakeIncoming(args); err != nil {
			fmt.Fprintf(os.Stderr, "fake qemu: %v\n", err)
			return 1
		}
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

// fakeIncoming is the fake's "-incoming defer": on its monitor it answers
// the commands of a restore, and refuses migrate-incoming unless the RAM
// it maps (the memory backend's /proc path, as QEMU opens it) is the
// guest's size and starts with "capsem-ram", as the test's state has it.
func fakeIncoming(args []string) error {
	var monitor *os.File
	var ramPath, size string
	for i := 0; i+1 < len(args); i++ {
		for _, kv := range strings.Split(args[i+1], ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch {
			case args[i] == "-chardev" && strings.HasPrefix(args[i+1], "socket,id="+monitorChardevID+",") && k == "fd":
				n, _ := strconv.Atoi(v)
				monitor = os.NewFile(uintptr(n), "qmp")
			case args[i] == "-object" && k == "mem-path":
				ramPath = v
			case args[i] == "-object" && k == "size":
				size = v
			}
		}
	}
	if monitor == nil || ramPath == "" {
		return errors.New("a restore without a monitor or a memory backend")
	}
	go func() {
		monitor.WriteString(greeting)
		lines := bufio.NewScanner(monitor)
		for lines.Scan() {
			var req struct{ Execute string }
			json.Unmarshal(lines.Bytes(), &req)
			answer := `{"return": {}}`
			if req.Execute == "migrate-incoming" {
				b := make([]byte, 10)
				f, err := os.Open(ramPath)
				if err == nil {
					_, err = f.ReadAt(b, 0)
					st, _ := f.Stat()
					if err == nil && strconv.FormatInt(st.Size()>>20, 10)+"M" != size {
						err = fmt.Errorf("the RAM is %d bytes, the backend %s", st.Size(), size)
					}
					f.Close()
				}
				if err != nil || string(b) != "capsem-ram" {
					answer = fmt.Sprintf(`{"error": {"class": "GenericError", "desc": "the RAM holds %q (%v)"}}`, b, err)
				}
			}
			monitor.WriteString(answer + "\r\n")
		}
	}()
	return nil
}

// signInheritedFDs writes on each port's and the NIC's inherited
// descriptor, found by the number its option names, who it is: "port
// <name>\n" on a port, a frame "nic" (after its length, 4 bytes
// big-endian) on the NIC. The host reads each where it expects it.
func signInheritedFDs(args []string) error {
	write := func(opt string, b []byte) error {
		_, num, _ := strings.Cut(opt, "=")
		n, err := strconv.Atoi(num)
		if err != nil {
			return fmt.Errorf("descriptor in %q: %v", opt, err)
		}
		if _, err := os.NewFile(uintptr(n), opt).Write(b); err != nil {
			return fmt.Errorf("writing on descriptor %d: %v", n, err)
		}
		return nil
	}
	for i := 0; i+1 < len(args); i++ {
		opts := strings.Split(args[i+1], ",")
		var err error
		switch {
		case args[i] == "-chardev" && strings.HasPrefix(opts[1], "id="+portChardevPrefix) && i+3 < len(args):
			// The port's name is on the device that follows.
			_, name, _ := strings.Cut(args[i+3], ",name=")
			err = write(opts[2], []byte("port "+name+"\n"))
		case args[i] == "-netdev":
			err = write(opts[len(opts)-1], []byte{0, 0, 0, 3, 'n', 'i', 'c'})
		}
		if err != nil {
			return err
		}
	}
	return nil
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

// TestInheritedDescriptorsReachTheirOwners: QEMU finds each port's and
// the NIC's socket at the descriptor its option names, and the host end
// of each is the one Port and NetworkConn give (once).
func TestInheritedDescriptorsReachTheirOwners(t *testing.T) {
	t.Setenv(fakeEnv, "connect")
	exe, _ := os.Executable()
	dir := shortDir(t)
	spec := fakeSpec(dir)
	spec.Monitor = true
	spec.RestoreFrom = filepath.Join(dir, "vm.state")
	os.WriteFile(spec.RestoreFrom, []byte("state"), 0o600)
	// The state's RAM, which the fake finds in the memory it maps.
	ram, _ := os.Create(vmm.MemoryPath(spec.RestoreFrom))
	ram.WriteString("capsem-ram")
	ram.Truncate(int64(spec.MemoryMiB) << 20)
	ram.Close()
	spec.Ports = []string{"org.capsem.workspace", "second"}
	spec.Network = &vmm.Network{MAC: "5a:94:ef:e4:0c:ee"}
	vm, err := (&Backend{Binary: exe, OpenKVM: noKVM, Log: testLogger(t)}).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	for _, name := range spec.Ports {
		c, ok := vm.(vmm.PortHolder).Port(name)
		if !ok {
			t.Fatalf("no port %s", name)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := bufio.NewReader(c).ReadString('\n'); line != "port "+name+"\n" {
			t.Errorf("port %s reads %q (%v)", name, line, err)
		}
		c.Close()
	}
	nic := vm.(vmm.NetworkHolder)
	c, framing, ok := nic.NetworkConn()
	if !ok || framing != vmm.FramingStream4BE {
		t.Fatalf("NetworkConn: %v %v %v", c, framing, ok)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	frame := make([]byte, 7)
	if _, err := io.ReadFull(c, frame); err != nil || string(frame) != "\x00\x00\x00\x03nic" {
		t.Errorf("the NIC's end reads %q (%v)", frame, err)
	}
	if again, _, ok := nic.NetworkConn(); ok || again != nil {
		t.Error("NetworkConn handed out the NIC's end twice")
	}
}

// TestUntakenNetworkClosesWithQEMU: a NIC end no one took is closed once
// QEMU is gone, and a machine without a NIC has none to give.
func TestUntakenNetworkClosesWithQEMU(t *testing.T) {
	t.Setenv(fakeEnv, "connect")
	exe, _ := os.Executable()
	spec := fakeSpec(shortDir(t))
	spec.Network = &vmm.Network{MAC: "5a:94:ef:e4:0c:ee"}
	vm, err := (&Backend{Binary: exe, OpenKVM: noKVM, Log: testLogger(t)}).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	m := vm.(*Machine)
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.mu.Lock()
	ours := m.network
	m.mu.Unlock()
	if ours == nil {
		t.Fatal("no NIC end after Start")
	}
	m.Stop(context.Background())
	if _, err := ours.Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write on the untaken NIC end after QEMU exited: %v, want closed", err)
	}
	if c, _, ok := m.NetworkConn(); ok || c != nil {
		t.Error("NetworkConn after exit gave an end")
	}
	plain, _ := fakeMachine(t, "connect")
	if err := plain.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer plain.Stop(context.Background())
	if c, _, ok := plain.NetworkConn(); ok || c != nil {
		t.Error("a machine without spec.Network gave a NIC end")
	}
}

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

// TestBootWithNetwork boots the test guest with a NIC and proves it works
// both ways: the guest sees the NIC with the spec's MAC and the default
// MTU, every frame it sends is well formed and from that MAC, it asks for
// the gateway's address (ARP), and once the host answers it sends its
// ping to the MAC the host gave, which only the answer told it. Under
// both firmwares: the NIC has no option ROM (romfile=) for either to load.
func TestBootWithNetwork(t *testing.T) {
	if _, err := os.Stat(FastFirmware); err != nil {
		t.Fatalf("qboot (Debian package qemu-system-data): %v", err)
	}
	for name, firmware := range map[string]string{"seabios": "", "qboot": FastFirmware} {
		t.Run(name, func(t *testing.T) { bootWithNetwork(t, firmware) })
	}
}

func bootWithNetwork(t *testing.T, firmware string) {
	dir := shortDir(t)
	spec := bootSpec(t, dir)
	spec.Firmware = firmware
	spec.Network = &vmm.Network{MAC: guestwire.NetGuestMAC}
	vm, err := realBackend(t).Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			log, _ := os.ReadFile(spec.ConsoleLog)
			t.Logf("console log:\n%s", log)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := vm.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	conn, framing, ok := vm.(vmm.NetworkHolder).NetworkConn()
	if !ok || framing != vmm.FramingStream4BE {
		t.Fatalf("NetworkConn: ok %v, framing %v", ok, framing)
	}
	defer conn.Close()
	frames := make(chan []byte, 64)
	go func() {
		defer close(frames)
		for {
			f, err := readFrame(conn, DefaultMTU)
			if err != nil {
				t.Logf("reading frames: %v", err)
				return
			}
			frames <- f
		}
	}()

	// The guest's hello says what NIC it has; it powers off if no one
	// takes its control stream.
	ctl, err := vm.Channel().Listen(guestchan.PortControl)
	if err != nil {
		t.Fatal(err)
	}
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ctl.Accept()
		acc <- c
	}()
	var control net.Conn
	select {
	case control = <-acc:
	case <-vm.Done():
		t.Fatalf("QEMU exited before the guest dialled: %v", vm.Wait())
	case <-ctx.Done():
		t.Fatal("the guest never dialled the control port")
	}
	defer control.Close()
	rd := bufio.NewReader(control)
	hello, err := rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest: %s", strings.TrimSpace(hello))
	if want := "/" + guestwire.NetGuestMAC + "/" + strconv.Itoa(DefaultMTU); strings.Count(hello, "nic=") != 1 || !strings.Contains(hello, want) {
		t.Errorf("hello %q: want one NIC with %q", hello, want)
	}

	guestMAC, _ := net.ParseMAC(guestwire.NetGuestMAC)
	gatewayMAC, _ := net.ParseMAC(guestwire.NetGatewayMAC)
	guestIP, gatewayIP := net.ParseIP(guestwire.NetGuestIP).To4(), net.ParseIP(guestwire.NetGatewayIP).To4()
	var seen, arps int
	answered := false
	for {
		var f []byte
		select {
		case f, ok = <-frames:
			if !ok {
				t.Fatalf("the NIC's connection ended after %d frames", seen)
			}
		case <-ctx.Done():
			t.Fatalf("after %d frames (%d ARP requests for the gateway, answered %v), no ping to the gateway's MAC", seen, arps, answered)
		}
		seen++
		if !bytes.Equal(f[6:12], guestMAC) {
			t.Fatalf("frame %d from %s, not the guest's MAC: % x", seen, net.HardwareAddr(f[6:12]), f)
		}
		switch etherType := binary.BigEndian.Uint16(f[12:14]); {
		case etherType == 0x0806 && isARPRequest(f[14:], guestIP, gatewayIP):
			arps++
			reply := arpReply(guestMAC, gatewayMAC, guestIP, gatewayIP)
			if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, uint32(len(reply)))); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write(reply); err != nil {
				t.Fatal(err)
			}
			answered = true
		case etherType == 0x0800 && answered && bytes.Equal(f[0:6], gatewayMAC) && isPingTo(f[14:], guestIP, gatewayIP):
			t.Logf("ping to the gateway's MAC after %d frames (%d ARP requests)", seen, arps)
			fmt.Fprintln(control, "exit")
			rd.ReadString('\n')
			select {
			case <-vm.Done():
			case <-time.After(60 * time.Second):
				t.Error("QEMU still running a minute after the guest powered off")
			}
			return
		}
	}
}

// readFrame reads one length-prefixed frame (vmm.FramingStream4BE) and
// checks its length: an Ethernet header at least, an MTU's payload at most.
func readFrame(r io.Reader, mtu int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size < 14 || size > uint32(mtu)+14 {
		return nil, fmt.Errorf("a frame of %d bytes: want 14..%d", size, mtu+14)
	}
	f := make([]byte, size)
	_, err := io.ReadFull(r, f)
	return f, err
}

// isARPRequest: an Ethernet/IPv4 ARP request from ip asking for target.
func isARPRequest(p []byte, ip, target net.IP) bool {
	return len(p) >= 28 && binary.BigEndian.Uint16(p[0:2]) == 1 && binary.BigEndian.Uint16(p[2:4]) == 0x0800 &&
		binary.BigEndian.Uint16(p[6:8]) == 1 && bytes.Equal(p[14:18], ip) && bytes.Equal(p[24:28], target)
}

// arpReply is the frame telling the guest (mac, ip) that target is at
// targetMAC.
func arpReply(mac, targetMAC net.HardwareAddr, ip, target net.IP) []byte {
	f := slices.Concat(mac, targetMAC, []byte{0x08, 0x06})
	f = append(f, 0, 1, 0x08, 0x00, 6, 4, 0, 2)
	return slices.Concat(f, targetMAC, []byte(target), mac, []byte(ip))
}

// isPingTo: an IPv4 packet from ip to target carrying an ICMP echo request.
func isPingTo(p []byte, ip, target net.IP) bool {
	if len(p) < 20 || p[0]>>4 != 4 {
		return false
	}
	hl := int(p[0]&0x0f) * 4
	return len(p) > hl && p[9] == 1 && bytes.Equal(p[12:16], ip) && bytes.Equal(p[16:20], target) && p[hl] == 8
}

// TestRestoreNeedsItsRAM: a state whose RAM file is missing or of another
// size than the guest's is refused before QEMU starts, naming the file,
// and leaves nothing running.
func TestRestoreNeedsItsRAM(t *testing.T) {
	t.Setenv(fakeEnv, "connect")
	exe, _ := os.Executable()
	for name, ramSize := range map[string]int64{"missing": -1, "another size": 64 << 20} {
		t.Run(name, func(t *testing.T) {
			dir := shortDir(t)
			spec := fakeSpec(dir)
			spec.Monitor = true
			spec.RestoreFrom = filepath.Join(dir, "vm.state")
			os.WriteFile(spec.RestoreFrom, []byte("state"), 0o600)
			if ramSize >= 0 {
				os.WriteFile(vmm.MemoryPath(spec.RestoreFrom), nil, 0o600)
				os.Truncate(vmm.MemoryPath(spec.RestoreFrom), ramSize)
			}
			vm, err := (&Backend{Binary: exe, OpenKVM: noKVM, Log: testLogger(t)}).Create(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			err = vm.Start(context.Background())
			if err == nil || !strings.Contains(err.Error(), "vm.state.ram") {
				vm.Stop(context.Background())
				t.Fatalf("Start with the state's RAM %s: %v", name, err)
			}
			if vm.PID() != 0 {
				t.Errorf("QEMU ran (pid %d)", vm.PID())
			}
		})
	}
}
