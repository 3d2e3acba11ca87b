// Command testguest is the guest side of the QEMU backend's boot test: a
// tiny stand-in for the agent, run by a busybox /init once the virtio
// modules are loaded. It opens the channel port, says hello on the control
// port, serves an echo (PortTerminal), a sink (PortExecOutput) and a source
// (PortEgress) for the host's measurements, and exits when the host says
// "exit" (the /init script then powers off).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capsem/capsem/core/guestchan"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testguest:", err)
		os.Exit(1)
	}
}

func run() error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cmdline, _ := os.ReadFile("/proc/cmdline")
	kind, err := guestchan.FromCmdline(string(cmdline))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ch, err := guestchan.OpenGuest(ctx, kind, log)
	if err != nil {
		return err
	}
	defer ch.Close()

	serve := func(port uint32, handle func(net.Conn)) error {
		l, err := ch.Listen(port)
		if err != nil {
			return err
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { defer c.Close(); handle(c) }()
			}
		}()
		return nil
	}
	if err := serve(guestchan.PortTerminal, func(c net.Conn) { io.Copy(c, c) }); err != nil {
		return err
	}
	if err := serve(guestchan.PortExecOutput, func(c net.Conn) { io.Copy(io.Discard, c) }); err != nil {
		return err
	}
	// The source writes the number of bytes the host asks for (u64 BE).
	if err := serve(guestchan.PortEgress, func(c net.Conn) {
		var n uint64
		if binary.Read(c, binary.BigEndian, &n) != nil {
			return
		}
		buf := make([]byte, 256<<10)
		for n > 0 {
			k := min(n, uint64(len(buf)))
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
			n -= k
		}
	}); err != nil {
		return err
	}

	ctl, err := ch.Dial(ctx, guestchan.PortControl)
	if err != nil {
		return err
	}
	fmt.Fprintf(ctl, "hello kind=%s %s\n", kind, probes())
	sc := bufio.NewScanner(ctl)
	for sc.Scan() {
		switch sc.Text() {
		case "exit":
			fmt.Fprintln(ctl, "bye")
			ctl.Close()
			return nil
		case "ping":
			fmt.Fprintln(ctl, "pong")
		}
	}
	return fmt.Errorf("control stream ended: %v", sc.Err())
}

// probes reports what the boot test checks besides the channel: the first
// bytes of the first disk, a write into the 9p share at /mnt, and each NIC
// with its MAC and MTU.
func probes() string {
	var out []string
	nics, _ := filepath.Glob("/sys/class/net/*")
	for _, n := range nics {
		if filepath.Base(n) == "lo" {
			continue
		}
		mac, _ := os.ReadFile(filepath.Join(n, "address"))
		mtu, _ := os.ReadFile(filepath.Join(n, "mtu"))
		out = append(out, fmt.Sprintf("nic=%s/%s/%s", filepath.Base(n), strings.TrimSpace(string(mac)), strings.TrimSpace(string(mtu))))
	}
	if f, err := os.Open("/dev/vda"); err == nil {
		b := make([]byte, 16)
		n, _ := io.ReadFull(f, b)
		f.Close()
		out = append(out, fmt.Sprintf("vda=%q", b[:n]))
	} else {
		out = append(out, "vda=none")
	}
	if serial, err := os.ReadFile("/sys/block/vda/serial"); err == nil {
		out = append(out, "vda_serial="+strings.TrimSpace(string(serial)))
	}
	if err := os.WriteFile("/mnt/from-guest.txt", []byte("written by the guest\n"), 0o644); err == nil {
		out = append(out, "share=ok")
	} else {
		out = append(out, "share=none")
	}
	return strings.Join(out, " ")
}
