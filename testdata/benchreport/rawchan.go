package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/qemu"
)

// rawChannelBytes is what the raw channel baseline moves each way.
const rawChannelBytes = 64 << 20

// rawCPU is QEMU's CPU time while the raw channel moved its bytes, each
// way: what the guest and its device cost, beside which the API's cost
// per byte is judged with less noise than rates on a shared host.
type rawCPU struct{ up, down time.Duration }

// rawFigures are the raw channel's rates each way, MiB/s: over the port
// alone (up, down), and between the port and a disk (diskUp: the port into
// the disk; diskDown: the disk into the port), with QEMU's CPU time of the
// port alone.
type rawFigures struct {
	up, down, diskUp, diskDown float64
	cpu                        rawCPU
}

// rawChannel measures the guest channel's transport with nothing of ours on
// it: a bare QEMU (same kernel, initramfs, machine, firmware, CPUs, memory
// and accelerator as a capsem VM, and the same virtio-serial-pci device and
// socket chardev as its channel) whose busybox shell, as init, loads the
// virtio console driver and then moves rawChannelBytes over the port each
// way, one direction at a time, with busybox dd in 32 KiB blocks (the
// driver's largest write; busybox head's 4 KiB writes move far less):
// /dev/zero into the port (guest → host, timed on the host from the first
// byte to the last), then the port into /dev/null (host → guest, timed on
// the host from its first write to the guest's "done" on the console).
// The API figures are the same exec output and file transfers with the
// multiplexer, the agent and the per-VM process on top; this is what they
// are a fraction of. It also returns QEMU's CPU time each way.
//
// Then, since a file the API moves is read from or written to the guest's
// disk, the same bytes between the port and a virtio-blk disk of the same
// kind as a capsem VM's (raw, cache=writeback), with dd in 1 MiB blocks
// and O_DIRECT as the agent's file transfers use: the disk into the port
// (guest → host), then the port into the disk (host → guest, until the
// guest's "done"). That is the floor of a file transfer through this
// guest, with nothing of ours on it.
func rawChannel(ctx context.Context, a *guestfs.Assets, accel qemu.Accel, cpus, memoryMiB int) (fig rawFigures, err error) {
	up, down, diskUp, diskDown, cpu, err := rawChannelRun(ctx, a, accel, cpus, memoryMiB)
	return rawFigures{up: up, down: down, diskUp: diskUp, diskDown: diskDown, cpu: cpu}, err
}

func rawChannelRun(ctx context.Context, a *guestfs.Assets, accel qemu.Accel, cpus, memoryMiB int) (up, down, diskUp, diskDown float64, cpu rawCPU, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "cbr-")
	if err != nil {
		return 0, 0, 0, 0, cpu, err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "raw.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return 0, 0, 0, 0, cpu, err
	}
	defer ln.Close()
	disk := filepath.Join(dir, "disk.img")
	data := make([]byte, rawChannelBytes)
	rand.Read(data)
	if err := os.WriteFile(disk, data, 0o600); err != nil {
		return 0, 0, 0, 0, cpu, err
	}

	const portName = "raw"
	// The kernel hands what follows "--" to init; its only quoting is
	// double quotes, so the script has none. The port stays open from
	// first to last (fd 3): the guest's driver drops what arrives for a
	// port nobody has open, and a port opens only once at a time.
	modules := []string{"virtio/virtio_ring", "virtio/virtio_pci_modern_dev", "virtio/virtio_pci_legacy_dev", "virtio/virtio", "virtio/virtio_pci", "char/virtio_console"}
	script := "mount -t devtmpfs d /dev; mount -t sysfs s /sys; M=/lib/modules/$(uname -r)/kernel/drivers; " +
		"for m in " + strings.Join(modules, " ") + "; do insmod $M/$m.ko; done; " +
		"for i in $(seq 50); do for p in /sys/class/virtio-ports/*; do [ -e $p/name ] && [ $(cat $p/name) = " + portName + " ] && P=/dev/${p##*/}; done; [ -e ${P:-/none} ] && break; sleep 0.1; done; " +
		fmt.Sprintf("exec 3<>$P; echo RAW-READY $P; dd if=/dev/zero bs=32k count=%d >&3 2>/dev/null; dd bs=32k count=%d iflag=fullblock <&3 >/dev/null 2>/dev/null; echo RAW-DONE; ", rawChannelBytes/(32<<10), rawChannelBytes/(32<<10)) +
		"insmod $M/block/virtio_blk.ko; for i in $(seq 50); do [ -b /dev/vda ] && break; sleep 0.1; done; " +
		fmt.Sprintf("dd if=/dev/vda bs=1M count=%d iflag=direct >&3 2>/dev/null; dd of=/dev/vda bs=1M count=%d iflag=fullblock oflag=direct <&3 2>/dev/null; echo DISK-DONE; exec sleep 600", rawChannelBytes>>20, rawChannelBytes>>20)
	params := "console=ttyS0 panic=-1 quiet loglevel=3"
	if k := qemu.AccelKernelParams(accel); k != "" {
		params += " " + k
	}
	params += ` rdinit=/bin/sh -- -c "` + script + `"`
	args := []string{"-machine", vmm.DefaultMachine}
	args = append(args, qemu.AccelArgs(accel)...)
	args = append(args, "-smp", fmt.Sprint(cpus), "-m", fmt.Sprintf("%dM", memoryMiB),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-nic", "none", "-serial", "stdio",
		"-kernel", a.Kernel, "-initrd", a.Initramfs, "-append", params,
		"-device", "virtio-serial-pci,id=vser0,max_ports=2",
		"-chardev", "socket,id=raw,path="+sock+",server=off",
		"-device", "virtserialport,bus=vser0.0,chardev=raw,name="+portName,
		"-drive", "file="+disk+",if=none,id=disk,format=raw,cache=writeback",
		"-device", "virtio-blk-pci,drive=disk,num-queues=1")
	if fw := qemu.PreferredFirmware(); fw != "" {
		args = append(args, "-bios", fw)
	}
	cmd := exec.CommandContext(ctx, qemu.DefaultBinary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	console, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, 0, 0, cpu, err
	}
	if err := cmd.Start(); err != nil {
		return 0, 0, 0, 0, cpu, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil && stderr.Len() > 0 {
			err = fmt.Errorf("%w (qemu: %s)", err, strings.TrimSpace(stderr.String()))
		}
	}()
	done, diskDone := make(chan struct{}), make(chan struct{})
	var consoleMu sync.Mutex
	var consoleTail bytes.Buffer
	consoleText := func() string {
		consoleMu.Lock()
		defer consoleMu.Unlock()
		return strings.TrimSpace(consoleTail.String())
	}
	go func() {
		sc := bufio.NewScanner(console)
		for sc.Scan() {
			consoleMu.Lock()
			if consoleTail.Len() < 1<<16 {
				consoleTail.WriteString(sc.Text() + "\n")
			}
			consoleMu.Unlock()
			if strings.Contains(sc.Text(), "RAW-DONE") {
				close(done)
			}
			if strings.Contains(sc.Text(), "DISK-DONE") {
				close(diskDone)
				io.Copy(io.Discard, console)
				return
			}
		}
	}()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	var conn net.Conn
	select {
	case conn = <-accepted:
	case <-ctx.Done():
		return 0, 0, 0, 0, cpu, errors.New("QEMU never connected to the channel socket")
	}
	if conn == nil {
		return 0, 0, 0, 0, cpu, errors.New("accepting QEMU's connection failed")
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	// Guest → host.
	buf := make([]byte, 256<<10)
	first, err := io.ReadAtLeast(conn, buf, 1)
	if err != nil {
		return 0, 0, 0, 0, cpu, fmt.Errorf("guest → host: %w (console: %s)", err, consoleText())
	}
	qemuBefore, _ := procCPU(cmd.Process.Pid)
	t := time.Now()
	rest, err := io.CopyN(io.Discard, conn, int64(rawChannelBytes-first))
	if err != nil {
		return 0, 0, 0, 0, cpu, fmt.Errorf("guest → host: %d of %d bytes: %w", int64(first)+rest, rawChannelBytes, err)
	}
	down = float64(rest) / time.Since(t).Seconds() / (1 << 20)
	qemuMid, _ := procCPU(cmd.Process.Pid)
	cpu.down = qemuMid - qemuBefore

	// Host → guest.
	t = time.Now()
	for sent := 0; sent < rawChannelBytes; sent += len(buf) {
		if _, err := conn.Write(buf); err != nil {
			return 0, 0, 0, 0, cpu, fmt.Errorf("host → guest: %w", err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		return 0, 0, 0, 0, cpu, fmt.Errorf("host → guest: the guest never said it read everything (console: %s)", consoleText())
	}
	up = float64(rawChannelBytes) / time.Since(t).Seconds() / (1 << 20)
	qemuEnd, _ := procCPU(cmd.Process.Pid)
	cpu.up = qemuEnd - qemuMid

	// The disk into the port, then the port into the disk.
	first, err = io.ReadAtLeast(conn, buf, 1)
	if err != nil {
		return 0, 0, 0, 0, cpu, fmt.Errorf("disk → host: %w (console: %s)", err, consoleText())
	}
	t = time.Now()
	rest, err = io.CopyN(io.Discard, conn, int64(rawChannelBytes-first))
	if err != nil {
		return 0, 0, 0, 0, cpu, fmt.Errorf("disk → host: %d of %d bytes: %w", int64(first)+rest, rawChannelBytes, err)
	}
	diskDown = float64(rest) / time.Since(t).Seconds() / (1 << 20)
	t = time.Now()
	for sent := 0; sent < rawChannelBytes; sent += len(buf) {
		if _, err := conn.Write(buf); err != nil {
			return 0, 0, 0, 0, cpu, fmt.Errorf("host → disk: %w", err)
		}
	}
	select {
	case <-diskDone:
	case <-ctx.Done():
		return 0, 0, 0, 0, cpu, fmt.Errorf("host → disk: the guest never said it wrote everything (console: %s)", consoleText())
	}
	diskUp = float64(rawChannelBytes) / time.Since(t).Seconds() / (1 << 20)
	return up, down, diskUp, diskDown, cpu, nil
}
