package qemu

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/capsem/capsem/vmm"
)

// Marker is what a MarkerBoot's guest prints from userspace.
const Marker = "CAPSEM-USERSPACE-OK"

// MarkerBoot boots a guest's kernel and initramfs with busybox's shell as
// init, which prints Marker on the serial console: the earliest point at
// which the guest's userspace speaks. It proves an accelerator can run the
// guest (the KVM probe) and is the bare-boot baseline of the benchmarks.
// The machine type, firmware and kernel parameters are those of a capsem
// VM; there are no devices.
type MarkerBoot struct {
	Binary    string // QEMU; "" means DefaultBinary from PATH
	Files     BootFiles
	Accel     Accel
	CPUs      int           // 0 means 1
	MemoryMiB int           // 0 means 256
	Timeout   time.Duration // 0 means until ctx ends
}

// Args is QEMU's argv (without the program name); a pure function.
func (p MarkerBoot) Args() []string {
	cpus, mem := p.CPUs, p.MemoryMiB
	if cpus <= 0 {
		cpus = 1
	}
	if mem <= 0 {
		mem = 256
	}
	params := "console=ttyS0 panic=-1 quiet loglevel=3"
	if k := AccelKernelParams(p.Accel); k != "" {
		params += " " + k
	}
	// The shell sleeps instead of exiting: init exiting panics the kernel,
	// whose report could land in the middle of the marker.
	params += ` rdinit=/bin/sh -- -c "echo ` + Marker + `; exec sleep 600"`
	a := []string{"-machine", vmm.DefaultMachine}
	a = append(a, AccelArgs(p.Accel)...)
	a = append(a, "-smp", fmt.Sprint(cpus), "-m", fmt.Sprintf("%dM", mem),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-nic", "none", "-serial", "stdio",
		"-kernel", p.Files.Kernel, "-initrd", p.Files.Initramfs, "-append", params)
	if p.Files.Firmware != "" {
		a = append(a, "-bios", p.Files.Firmware)
	}
	return a
}

// Run boots the guest and returns the time from QEMU's start to the marker.
// QEMU is killed and reaped once the marker shows, when it exits first
// (the error carries its complaint) or when the timeout or ctx ends.
func (p MarkerBoot) Run(ctx context.Context) (time.Duration, error) {
	bin := p.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	cmd := exec.Command(bin, p.Args()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	var stderr tailBuffer
	cmd.Stderr = &stderr
	console, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("qemu: starting %s: %w", bin, err)
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	defer stop()
	var seen time.Duration
	var tail []byte
	buf := make([]byte, 4096)
	for {
		n, rerr := console.Read(buf)
		tail = append(tail, buf[:n]...)
		if bytes.Contains(tail, []byte(Marker)) {
			seen = time.Since(start)
			break
		}
		if len(tail) > 1<<16 {
			tail = tail[len(tail)-4096:]
		}
		if rerr != nil {
			break
		}
	}
	cmd.Process.Kill()
	io.Copy(io.Discard, console)
	werr := cmd.Wait()
	if seen > 0 {
		return seen, nil
	}
	if ctx.Err() != nil {
		return 0, fmt.Errorf("the guest printed nothing from userspace within %v%s", time.Since(start).Round(100*time.Millisecond), lastLine(tail))
	}
	complaint := strings.TrimSpace(stderr.String())
	if complaint == "" {
		complaint = "no output"
	}
	return 0, fmt.Errorf("qemu exited before the guest reached userspace (%v): %s", werr, complaint)
}

// lastLine is the console's last line, for an error.
func lastLine(console []byte) string {
	lines := strings.Split(strings.TrimSpace(string(console)), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return fmt.Sprintf(" (last console line: %q)", l)
	}
	return ""
}
