//go:build linux

// Command chanflood is the attacker of the guest channel's end-to-end test:
// run as root inside a guest, it takes the agent's channel descriptor (PID
// 1's virtio-serial port) with pidfd_getfd and, behind the agent's back,
// opens bare multiplexer (yamux) streams on it: some that never send their
// port header, some that stall in the middle of it, some that name a port
// nobody listens on, some that name a real port (-port) and then say
// nothing, some that send garbage to the exec output port. Each write is
// whole frames, so the agent's own frames stay intact around them. It
// writes "done <streams> <bytes>" on stdout when it is through.
//
// With -workspace it attacks the workspace's 9p server instead: it takes
// PID 1's descriptor of the workspace port and writes, amid the kernel's
// own 9p, a Tversion for 4 MiB messages, the start of a 4 MiB Twrite and
// junk, then writes "done workspace <bytes>".
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	streams := flag.Int("streams", 30000, "streams to open")
	first := flag.Uint("first", 1<<31+1, "first stream id (odd, as the guest's are, far above the agent's)")
	port := flag.Uint("port", 5002, "the real port the idle streams name")
	batch := flag.Int("batch", 64, "streams per write")
	over := flag.Duration("over", 0, "spread the streams over this long (0: as fast as the channel takes them)")
	workspace := flag.Bool("workspace", false, "write hostile 9p on PID 1's workspace port instead")
	flag.Parse()
	if *workspace {
		attackWorkspace()
		return
	}
	f, err := takePort("org.capsem.channel")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chanflood:", err)
		os.Exit(1)
	}
	start := time.Now()
	sent := 0
	for i := 0; i < *streams; i += *batch {
		n := min(*batch, *streams-i)
		b := frames(uint32(*first)+2*uint32(i), i, n, uint32(*port))
		if _, err := f.Write(b); err != nil {
			fmt.Fprintln(os.Stderr, "chanflood: write:", err)
			os.Exit(1)
		}
		sent += len(b)
		if *over > 0 {
			// Keep to the schedule: stream i+n is due at (i+n)/streams of it.
			due := start.Add(time.Duration(int64(*over) * int64(i+n) / int64(*streams)))
			time.Sleep(time.Until(due))
		}
	}
	fmt.Printf("done %d %d %v\n", *streams, sent, time.Since(start).Round(time.Millisecond))
}

// takePort returns a descriptor of PID 1's virtio-serial port called name:
// it cannot be opened a second time (EBUSY), but a copy of PID 1's can be
// taken.
func takePort(name string) (*os.File, error) {
	ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
	dev := ""
	for _, p := range ports {
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == name {
			dev = "/dev/" + filepath.Base(filepath.Dir(p))
		}
	}
	if dev == "" {
		return nil, fmt.Errorf("no virtio port called %s", name)
	}
	entries, err := os.ReadDir("/proc/1/fd")
	if err != nil {
		return nil, err
	}
	target := -1
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join("/proc/1/fd", e.Name()))
		if err == nil && link == dev {
			fmt.Sscan(e.Name(), &target)
			break
		}
	}
	if target < 0 {
		return nil, fmt.Errorf("PID 1 has no %s (%s) open", dev, name)
	}
	pidfd, err := unix.PidfdOpen(1, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(1): %w", err)
	}
	fd, err := unix.PidfdGetfd(pidfd, target, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_getfd(PID 1, fd %d): %w", target, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// frames returns the frames opening n streams from id on; stream i of the
// whole attack is of kind i%5.
func frames(id uint32, i, n int, port uint32) []byte {
	var b []byte
	for k := range n {
		sid := id + 2*uint32(k)
		b = syn(b, sid)
		switch (i + k) % 5 {
		case 1: // stalls in the middle of its header
			b = data(b, sid, []byte("CS\x01"))
		case 2: // a port nobody listens on
			b = data(b, sid, header(7777))
		case 3: // a real port, then nothing
			b = data(b, sid, header(port))
		case 4: // the exec output port, then garbage for its exec header
			b = data(b, sid, append(header(5005), "garbage, not an exec stream header"...))
		}
	}
	return b
}

// attackWorkspace writes hostile 9p on PID 1's workspace port.
func attackWorkspace() {
	f, err := takePort("org.capsem.workspace")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chanflood:", err)
		os.Exit(1)
	}
	b := tversion(4 << 20)
	b = binary.LittleEndian.AppendUint32(b, 4<<20)
	b = append(b, 118, 1, 0) // Twrite, tag 1
	junk := make([]byte, 64<<10)
	for j := range junk {
		junk[j] = byte(j * 131)
	}
	b = append(b, junk...)
	// The host closes the connection at the bad message, and the port
	// then takes no more: what is left of the junk is given up on.
	f.SetWriteDeadline(time.Now().Add(5 * time.Second))
	n, err := f.Write(b)
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		fmt.Fprintln(os.Stderr, "chanflood: write:", err)
		os.Exit(1)
	}
	fmt.Printf("done workspace %d\n", n)
}

// tversion is a whole 9p Tversion message (tag NOTAG) for 9P2000.L.
func tversion(msize uint32) []byte {
	v := "9P2000.L"
	m := binary.LittleEndian.AppendUint32(nil, uint32(4+1+2+4+2+len(v)))
	m = append(m, 100, 0xff, 0xff)
	m = binary.LittleEndian.AppendUint32(m, msize)
	m = binary.LittleEndian.AppendUint16(m, uint16(len(v)))
	return append(m, v...)
}

// yamux frames: version 0, type, flags, stream id, length.
func syn(b []byte, id uint32) []byte {
	b = append(b, 0, 1, 0, 1) // window update, SYN
	b = binary.BigEndian.AppendUint32(b, id)
	return binary.BigEndian.AppendUint32(b, 0)
}

func data(b []byte, id uint32, body []byte) []byte {
	b = append(b, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// header is the channel's own stream header (core/guestchan): "CS",
// version 1, reserved 0, the port.
func header(port uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{'C', 'S', 1, 0}, port)
}
