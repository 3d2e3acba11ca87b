package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/capsem/capsem/core/guestwire"
)

// networkModules are what the NIC needs before it exists (its
// dependencies, failover and net_failover, load before it in its chain).
var networkModules = []string{"virtio_net"}

// nicWait bounds the wait for the NIC once its driver is in. The driver
// registers the NIC while it loads, so it is there at once; the wait only
// covers a NIC the host did not attach after all.
var nicWait = 2 * time.Second

// procSysNet is where the kernel's per-interface network settings are.
const procSysNet = "/proc/sys/net"

// planNetwork reports whether the host attached a NIC for the agent to
// bring up (guestwire.CmdlineNet=1).
func planNetwork(cmdline string) bool {
	v, _ := guestwire.CmdlineValue(cmdline, guestwire.CmdlineNet)
	return v == "1"
}

// netlinker is the part of netlink.Handle that bringing the NIC up uses:
// a fake in tests.
type netlinker interface {
	LinkList() ([]netlink.Link, error)
	LinkSetUp(link netlink.Link) error
	AddrReplace(link netlink.Link, addr *netlink.Addr) error
	RouteReplace(route *netlink.Route) error
}

var _ netlinker = (*netlink.Handle)(nil)

// guestNetwork is the fixed addressing the agent gives the NIC, from
// guestwire.
type guestNetwork struct {
	mac     net.HardwareAddr
	addr    *net.IPNet // the guest's address and prefix
	gateway net.IP
}

func fixedNetwork() (guestNetwork, error) {
	mac, err := net.ParseMAC(guestwire.NetGuestMAC)
	if err != nil {
		return guestNetwork{}, fmt.Errorf("agent: guest MAC %q: %w", guestwire.NetGuestMAC, err)
	}
	ip, gw := net.ParseIP(guestwire.NetGuestIP).To4(), net.ParseIP(guestwire.NetGatewayIP).To4()
	if ip == nil || gw == nil {
		return guestNetwork{}, fmt.Errorf("agent: guest address %q or gateway %q is not IPv4", guestwire.NetGuestIP, guestwire.NetGatewayIP)
	}
	return guestNetwork{mac: mac, addr: &net.IPNet{IP: ip, Mask: net.CIDRMask(guestwire.NetPrefixLen, 32)}, gateway: gw}, nil
}

// networkStage brings the NIC up in the background while the boot goes
// on, from when its driver is in; wait joins it. It touches /proc, so it
// must be joined before the root switch (which moves /proc).
type networkStage struct {
	done  chan struct{}
	nic   string // the NIC's name, once up
	err   error
	took  time.Duration
	attrs []any
}

// startNetwork starts bringing the NIC up: once the modules it needs
// are in (waitModules), it finds the NIC by its MAC and configures it
// (configureNetwork).
func startNetwork(ctx context.Context, waitModules func(...string)) *networkStage {
	s := &networkStage{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		// A fault in here must not take PID 1 (and the kernel) with it:
		// the VM runs on without network.
		defer func() {
			if r := recover(); r != nil {
				s.err = fmt.Errorf("agent: bringing the NIC up panicked: %v", r)
			}
		}()
		t := time.Now()
		defer func() { s.took = time.Since(t) }()
		waitModules(networkModules...)
		s.attrs = append(s.attrs, "driver_ms", time.Since(t).Milliseconds())
		fixed, err := fixedNetwork()
		if err != nil {
			s.err = err
			return
		}
		s.nic, s.err = configureNetwork(ctx, &netlink.Handle{}, procSysNet, fixed, nicWait)
	}()
	return s
}

// join waits for the stage to end; nothing for a nil stage (no NIC).
func (s *networkStage) join() {
	if s != nil {
		<-s.done
	}
}

// wait joins the stage and logs how it went; an error is logged, not
// returned: a VM without a network still runs commands. Nothing for a nil
// stage.
func (s *networkStage) wait(log *slog.Logger) {
	if s == nil {
		return
	}
	<-s.done
	if s.err != nil {
		log.Error("the guest has no network", "err", s.err)
		return
	}
	log.Info("network up", append([]any{"nic", s.nic, "address", guestwire.NetGuestIP, "gateway", guestwire.NetGatewayIP,
		"ms", s.took.Milliseconds()}, s.attrs...)...)
}

// finish writes the resolver configuration, in the root the guest runs
// in (after the switch); nothing when the NIC did not come up or for a
// nil stage. After wait.
func (s *networkStage) finish(log *slog.Logger) {
	if s == nil || s.err != nil {
		return
	}
	if err := writeResolvConf(guestwire.GuestResolvConf); err != nil {
		log.Error("the guest cannot resolve names", "err", err)
	}
}

// configureNetwork finds the NIC whose MAC is n.mac (waiting up to limit
// for it to appear) and brings it up: IPv6 off on the NIC (the host's
// stack speaks IPv4 only; off before the link is up, so the guest sends no
// IPv6 at all), loopback up, the guest's address, the link up, and the
// default route through the gateway. The NIC's MTU is the host's (the
// device tells the driver). Everything it sets is the same in every VM.
// It returns the NIC's name.
func configureNetwork(ctx context.Context, nl netlinker, sysNet string, n guestNetwork, limit time.Duration) (string, error) {
	nic, lo, err := waitForNIC(ctx, nl, n.mac, limit)
	if err != nil {
		return "", err
	}
	name := nic.Attrs().Name
	if err := disableIPv6(sysNet, name); err != nil {
		return name, err
	}
	if lo != nil {
		if err := nl.LinkSetUp(lo); err != nil {
			return name, fmt.Errorf("agent: bringing the loopback up: %w", err)
		}
	}
	if err := nl.AddrReplace(nic, &netlink.Addr{IPNet: n.addr}); err != nil {
		return name, fmt.Errorf("agent: giving %s the address %s: %w", name, n.addr, err)
	}
	if err := nl.LinkSetUp(nic); err != nil {
		return name, fmt.Errorf("agent: bringing %s up: %w", name, err)
	}
	if err := nl.RouteReplace(&netlink.Route{LinkIndex: nic.Attrs().Index, Gw: n.gateway}); err != nil {
		return name, fmt.Errorf("agent: default route through %s on %s: %w", n.gateway, name, err)
	}
	return name, nil
}

// waitForNIC polls the links until one has mac, up to limit; lo is the
// loopback when listed.
func waitForNIC(ctx context.Context, nl netlinker, mac net.HardwareAddr, limit time.Duration) (nic, lo netlink.Link, err error) {
	deadline := time.Now().Add(limit)
	for {
		links, err := nl.LinkList()
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, nil, fmt.Errorf("agent: listing network interfaces: %w", err)
		}
		nic, lo := nicByMAC(links, mac)
		if nic != nil {
			return nic, lo, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("agent: no network interface has the MAC %s after %v (interfaces: %s; is the virtio_net driver in and the NIC attached?)",
				mac, limit, describeLinks(links))
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("agent: waiting for the NIC %s: %w", mac, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// nicByMAC returns the link whose hardware address is mac (whatever its
// name: the kernel names NICs in probe order) and the loopback.
func nicByMAC(links []netlink.Link, mac net.HardwareAddr) (nic, lo netlink.Link) {
	for _, l := range links {
		a := l.Attrs()
		switch {
		case a.Flags&net.FlagLoopback != 0 || a.Name == "lo":
			lo = l
		case nic == nil && bytes.Equal(a.HardwareAddr, mac):
			nic = l
		}
	}
	return nic, lo
}

// describeLinks lists links as name=MAC, for an error.
func describeLinks(links []netlink.Link) string {
	if len(links) == 0 {
		return "none"
	}
	var parts []string
	for _, l := range links {
		parts = append(parts, l.Attrs().Name+"="+l.Attrs().HardwareAddr.String())
	}
	return strings.Join(parts, ", ")
}

// disableIPv6 turns IPv6 off on the interface. A kernel without IPv6 has
// nothing to turn off.
func disableIPv6(sysNet, name string) error {
	if strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("agent: interface name %q is not a file name", name)
	}
	if _, err := os.Stat(filepath.Join(sysNet, "ipv6")); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	path := filepath.Join(sysNet, "ipv6", "conf", name, "disable_ipv6")
	if err := os.WriteFile(path, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("agent: turning IPv6 off on %s: %w", name, err)
	}
	return nil
}

// resolvConf is the resolver configuration: the gateway answers DNS.
func resolvConf() []byte {
	return []byte("# Written by the capsem agent at boot: the host answers DNS at the gateway.\nnameserver " + guestwire.NetGatewayIP + "\n")
}

// writeResolvConf replaces path with resolvConf, whole or not at all: a
// symlink there (an image's link to a resolver daemon's file) is replaced,
// not followed.
func writeResolvConf(path string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("agent: creating %s: %w", dir, err)
	}
	// A new file (O_EXCL: never through whatever a persistent root left
	// at this name), for everyone to read (Chmod: the umask filters
	// OpenFile's mode).
	tmp := filepath.Join(dir, "."+filepath.Base(path)+".capsem-"+strconv.Itoa(os.Getpid()))
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("agent: creating %s: %w", tmp, err)
	}
	_, err = f.Write(resolvConf())
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("agent: writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("agent: replacing %s: %w", path, err)
	}
	return nil
}
