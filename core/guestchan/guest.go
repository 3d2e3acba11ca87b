package guestchan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// VirtioPortName is the name of the virtio-serial port that carries the
// channel on QEMU (virtserialport,name=...).
const VirtioPortName = "org.capsem.channel"

// Kind names the transport the guest must use.
type Kind string

// Transports, as written on the kernel command line (capsem.channel=...).
const (
	KindSerial Kind = "serial" // yamux over the virtio-serial port (QEMU)
	KindVsock  Kind = "vsock"  // AF_VSOCK to HostCID (vz)
)

// CmdlineKey is the kernel command line parameter that selects the Kind.
const CmdlineKey = "capsem.channel"

// FromCmdline returns the transport the kernel command line asks for. A
// missing parameter means KindSerial (QEMU, the default backend); the last
// occurrence wins, as with the kernel's own parameters.
func FromCmdline(cmdline string) (Kind, error) {
	kind := KindSerial
	for _, f := range strings.Fields(cmdline) {
		v, ok := strings.CutPrefix(f, CmdlineKey+"=")
		if !ok {
			continue
		}
		switch Kind(v) {
		case KindSerial, KindVsock:
			kind = Kind(v)
		default:
			return "", fmt.Errorf("guestchan: %s=%q on the kernel command line: want %q or %q",
				CmdlineKey, v, KindSerial, KindVsock)
		}
	}
	return kind, nil
}

// OpenGuest opens the guest side of the channel of the given kind: the
// virtio-serial port wrapped in a yamux client Session, or a Vsock channel to
// the host. Waiting for the port to appear is bounded by ctx.
func OpenGuest(ctx context.Context, kind Kind, log *slog.Logger) (Channel, error) {
	switch kind {
	case KindVsock:
		return NewVsock(HostCID, log), nil
	case KindSerial, "":
		f, err := OpenVirtioPort(ctx, VirtioPortName)
		if err != nil {
			return nil, err
		}
		s, err := Client(f, log)
		if err != nil {
			f.Close()
			return nil, err
		}
		return s, nil
	default:
		return nil, fmt.Errorf("guestchan: unknown channel kind %q", kind)
	}
}

// portPollInterval is how often OpenVirtioPort looks again for a port that
// has not appeared yet (the driver may still be probing).
const portPollInterval = 10 * time.Millisecond

// OpenVirtioPort finds the virtio-serial port called name (in
// /sys/class/virtio-ports/*/name) and opens its /dev/vportNpM read-write.
// It retries until the port appears and opens, bounded by ctx; the error
// then names the last reason. A port opens once at a time (a second open
// gets EBUSY), so the caller owns it.
func OpenVirtioPort(ctx context.Context, name string) (*os.File, error) {
	return openVirtioPort(ctx, "/sys/class/virtio-ports", "/dev", name)
}

func openVirtioPort(ctx context.Context, sysDir, devDir, name string) (*os.File, error) {
	t := time.NewTicker(portPollInterval)
	defer t.Stop()
	for {
		f, err := tryOpenVirtioPort(sysDir, devDir, name)
		if err == nil {
			// Until QEMU has told the guest that the host side is open, a
			// read of the port returns 0 bytes, which the multiplexer
			// would take for the end of the channel: a port opened right
			// as its driver loads must wait for that.
			if err := waitForPeer(ctx, f, func() (bool, error) { return portPeerConnected(f) }); err != nil {
				f.Close()
				return nil, fmt.Errorf("guestchan: virtio port %q: %w", name, err)
			}
			return f, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("guestchan: opening virtio port %q: %w (last error: %w)", name, ctx.Err(), err)
		case <-t.C:
		}
	}
}

var errPortNotFound = errors.New("no such port")

// waitForPeer polls connected (every portPollInterval) until it reports
// the host side open, bounded by ctx.
func waitForPeer(ctx context.Context, f *os.File, connected func() (bool, error)) error {
	t := time.NewTicker(portPollInterval / 2)
	defer t.Stop()
	for {
		ok, err := connected()
		if err != nil {
			return fmt.Errorf("checking whether the host side is open: %w", err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the host side of %s never opened: %w", f.Name(), ctx.Err())
		case <-t.C:
		}
	}
}

func tryOpenVirtioPort(sysDir, devDir, name string) (*os.File, error) {
	entries, err := os.ReadDir(sysDir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", sysDir, err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(sysDir, e.Name(), "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		dev := filepath.Join(devDir, e.Name())
		// O_RDWR on a character device: os makes it non-blocking and puts
		// it in the poller, so Close unblocks a pending Read.
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", dev, err)
		}
		return f, nil
	}
	return nil, fmt.Errorf("%w in %s", errPortNotFound, sysDir)
}
