package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/capsem/capsem/core/guestwire"
)

func TestPlanNetwork(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    bool
	}{
		{"", false},
		{"console=ttyS0 capsem.channel=serial", false},
		{"console=ttyS0 capsem.net=1 capsem.channel=serial", true},
		{"capsem.net=0", false},
		{"capsem.net=", false},
		{"capsem.net=yes", false},
		{"capsem.net", false},
		{"xcapsem.net=1", false},
		{"capsem.network=1", false},
		{"capsem.net=1 capsem.net=0", false}, // the last wins, as in the kernel
		{"capsem.net=0 capsem.net=1", true},
	} {
		if got := planNetwork(tc.cmdline); got != tc.want {
			t.Errorf("planNetwork(%q) = %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}

func FuzzPlanNetwork(f *testing.F) {
	for _, s := range []string{"capsem.net=1", "quiet capsem.net=0", "capsem.net=1\tcapsem.net=11", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cmdline string) {
		if planNetwork(cmdline) && !slices.Contains(strings.Fields(cmdline), guestwire.CmdlineNet+"=1") {
			t.Errorf("planNetwork(%q) without %s=1 on it", cmdline, guestwire.CmdlineNet)
		}
	})
}

func mustMAC(t testing.TB, s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func device(index int, name, mac string, flags net.Flags) netlink.Link {
	var hw net.HardwareAddr
	if mac != "" {
		hw, _ = net.ParseMAC(mac)
	}
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index, Name: name, HardwareAddr: hw, Flags: flags}}
}

func TestNICByMAC(t *testing.T) {
	guest := guestwire.NetGuestMAC
	lo := device(1, "lo", "00:00:00:00:00:00", net.FlagLoopback)
	for _, tc := range []struct {
		name            string
		links           []netlink.Link
		wantNIC, wantLo string
	}{
		{"none", nil, "", ""},
		{"only loopback", []netlink.Link{lo}, "", "lo"},
		{"eth0", []netlink.Link{lo, device(2, "eth0", guest, 0)}, "eth0", "lo"},
		{"not eth0", []netlink.Link{lo, device(2, "eth0", "52:54:00:12:34:56", 0), device(3, "enp0s3", guest, 0)}, "enp0s3", "lo"},
		{"upper-case parse is the same address", []netlink.Link{device(2, "eth9", strings.ToUpper(guest), 0)}, "eth9", ""},
		{"other MACs only", []netlink.Link{lo, device(2, "eth0", "5a:94:ef:e4:0c:ef", 0)}, "", "lo"},
		{"a longer address that starts alike", []netlink.Link{device(2, "ib0", guest+":00:01", 0)}, "", ""},
		{"no address", []netlink.Link{device(2, "sit0", "", 0)}, "", ""},
		{"the first of two", []netlink.Link{device(2, "eth0", guest, 0), device(3, "eth1", guest, 0)}, "eth0", ""},
		{"loopback by name", []netlink.Link{device(1, "lo", "", 0)}, "", "lo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nic, lo := nicByMAC(tc.links, mustMAC(t, guest))
			name := func(l netlink.Link) string {
				if l == nil {
					return ""
				}
				return l.Attrs().Name
			}
			if name(nic) != tc.wantNIC || name(lo) != tc.wantLo {
				t.Errorf("got NIC %q, loopback %q; want %q, %q", name(nic), name(lo), tc.wantNIC, tc.wantLo)
			}
		})
	}
}

// fakeNetlink lists links (the i-th call the i-th list, the last again
// after) and records what is asked of it.
type fakeNetlink struct {
	lists   [][]netlink.Link
	listErr error
	failOn  string // a call that fails
	calls   []string
	sysNet  string // where disable_ipv6 is checked at each call
}

func (f *fakeNetlink) record(call string) error {
	if f.sysNet != "" {
		b, _ := os.ReadFile(filepath.Join(f.sysNet, "ipv6", "conf", "eth1", "disable_ipv6"))
		call += " ipv6off=" + strings.TrimSpace(string(b))
	}
	f.calls = append(f.calls, call)
	if f.failOn != "" && strings.HasPrefix(call, f.failOn) {
		return errors.New("refused by the fake")
	}
	return nil
}

func (f *fakeNetlink) LinkList() ([]netlink.Link, error) {
	if f.listErr != nil {
		return nil, f.listErr
	}
	f.calls = append(f.calls, "list")
	l := f.lists[min(len(f.calls)-1, len(f.lists)-1)]
	return l, nil
}

func (f *fakeNetlink) LinkSetUp(l netlink.Link) error { return f.record("up " + l.Attrs().Name) }

func (f *fakeNetlink) AddrReplace(l netlink.Link, a *netlink.Addr) error {
	return f.record("addr " + l.Attrs().Name + " " + a.IPNet.String())
}

func (f *fakeNetlink) RouteReplace(r *netlink.Route) error {
	dst := "default"
	if r.Dst != nil {
		dst = r.Dst.String()
	}
	return f.record(fmt.Sprintf("route %s via %s dev %d", dst, r.Gw, r.LinkIndex))
}

// fakeSysNet is a /proc/sys/net stand-in with IPv6 settings for the
// named interfaces.
func fakeSysNet(t *testing.T, ifaces ...string) string {
	dir := t.TempDir()
	for _, n := range ifaces {
		d := filepath.Join(dir, "ipv6", "conf", n)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "disable_ipv6"), []byte("0\n"), 0o644)
	}
	return dir
}

func TestConfigureNetwork(t *testing.T) {
	fixed, err := fixedNetwork()
	if err != nil {
		t.Fatal(err)
	}
	lo := device(1, "lo", "", net.FlagLoopback)
	nic := device(3, "eth1", guestwire.NetGuestMAC, 0)
	other := device(2, "eth0", "52:54:00:12:34:56", 0)
	ready := []netlink.Link{lo, other, nic}
	// IPv6 is off before anything is up, and stays off.
	wantCalls := []string{"list", "up lo ipv6off=1", "addr eth1 192.168.127.2/24 ipv6off=1", "up eth1 ipv6off=1",
		"route default via 192.168.127.1 dev 3 ipv6off=1"}
	for _, tc := range []struct {
		name      string
		fake      fakeNetlink
		noIPv6    bool
		wantCalls []string
		wantErr   string
	}{
		{name: "at once", fake: fakeNetlink{lists: [][]netlink.Link{ready}}, wantCalls: wantCalls},
		{name: "the NIC appears after a while", fake: fakeNetlink{lists: [][]netlink.Link{{lo}, {lo, other}, ready}},
			wantCalls: append([]string{"list", "list"}, wantCalls...)},
		{name: "a kernel without IPv6", noIPv6: true, fake: fakeNetlink{lists: [][]netlink.Link{ready}},
			wantCalls: []string{"list", "up lo ipv6off=", "addr eth1 192.168.127.2/24 ipv6off=", "up eth1 ipv6off=",
				"route default via 192.168.127.1 dev 3 ipv6off="}},
		{name: "no NIC with the MAC", fake: fakeNetlink{lists: [][]netlink.Link{{lo, other}}},
			wantErr: "no network interface has the MAC 5a:94:ef:e4:0c:ee after 50ms (interfaces: lo=, eth0=52:54:00:12:34:56"},
		{name: "netlink fails", fake: fakeNetlink{listErr: syscall.EPERM}, wantErr: "listing network interfaces: operation not permitted"},
		{name: "the address is refused", fake: fakeNetlink{lists: [][]netlink.Link{ready}, failOn: "addr"},
			wantErr: "giving eth1 the address 192.168.127.2/24: refused by the fake"},
		{name: "the route is refused", fake: fakeNetlink{lists: [][]netlink.Link{ready}, failOn: "route"},
			wantErr: "default route through 192.168.127.1 on eth1: refused by the fake"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sysNet := fakeSysNet(t, "lo", "eth0", "eth1")
			if tc.noIPv6 {
				sysNet = t.TempDir()
			}
			tc.fake.sysNet = sysNet
			name, err := configureNetwork(context.Background(), &tc.fake, sysNet, fixed, 50*time.Millisecond)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || name != "eth1" {
				t.Fatalf("configureNetwork: %q, %v", name, err)
			}
			if !slices.Equal(tc.fake.calls, tc.wantCalls) {
				t.Errorf("calls:\n %q\nwant\n %q", tc.fake.calls, tc.wantCalls)
			}
			// Only the NIC's IPv6 is turned off.
			if b, _ := os.ReadFile(filepath.Join(sysNet, "ipv6", "conf", "eth0", "disable_ipv6")); !tc.noIPv6 && string(b) != "0\n" {
				t.Errorf("eth0's disable_ipv6 is %q", b)
			}
		})
	}
}

func TestConfigureNetworkEndsWithItsContext(t *testing.T) {
	fixed, _ := fixedNetwork()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := configureNetwork(ctx, &fakeNetlink{lists: [][]netlink.Link{nil}}, t.TempDir(), fixed, time.Hour)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the context's", err)
	}
}

func TestDisableIPv6RefusesOddNames(t *testing.T) {
	sysNet := fakeSysNet(t, "eth0")
	for _, name := range []string{"..", ".", "a/b", "x\x00"} {
		if err := disableIPv6(sysNet, name); err == nil {
			t.Errorf("interface %q accepted", name)
		}
	}
}

func TestResolvConf(t *testing.T) {
	want := "# Written by the capsem agent at boot: the host answers DNS at the gateway.\nnameserver 192.168.127.1\n"
	if got := string(resolvConf()); got != want {
		t.Errorf("resolv.conf:\n%q\nwant\n%q", got, want)
	}
	var servers []string
	for _, l := range strings.Split(string(resolvConf()), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
			servers = append(servers, f[1])
		}
	}
	if !slices.Equal(servers, []string{guestwire.NetGatewayIP}) {
		t.Errorf("nameservers %q, want the gateway only", servers)
	}
}

func TestWriteResolvConf(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string) (keep string) // a file that must not change
	}{
		{"no /etc", func(t *testing.T, path string) string { return "" }},
		{"replaces a file", func(t *testing.T, path string) string {
			os.MkdirAll(filepath.Dir(path), 0o755)
			os.WriteFile(path, []byte("nameserver 8.8.8.8\n"), 0o600)
			return ""
		}},
		{"replaces a symlink, not its target", func(t *testing.T, path string) string {
			target := filepath.Join(t.TempDir(), "stub-resolv.conf")
			os.WriteFile(target, []byte("nameserver 127.0.0.53\n"), 0o644)
			os.MkdirAll(filepath.Dir(path), 0o755)
			os.Symlink(target, path)
			return target
		}},
		{"a leftover temporary symlink is not followed", func(t *testing.T, path string) string {
			target := filepath.Join(t.TempDir(), "victim")
			os.WriteFile(target, []byte("precious\n"), 0o644)
			os.MkdirAll(filepath.Dir(path), 0o755)
			os.Symlink(target, filepath.Join(filepath.Dir(path), fmt.Sprintf(".resolv.conf.capsem-%d", os.Getpid())))
			return target
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "etc", "resolv.conf")
			keep := tc.setup(t, path)
			var before []byte
			if keep != "" {
				before, _ = os.ReadFile(keep)
			}
			if err := writeResolvConf(path); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(path)
			if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
				t.Fatalf("%s: %v %v, want a regular file, mode 0644", path, fi, err)
			}
			if b, _ := os.ReadFile(path); string(b) != string(resolvConf()) {
				t.Errorf("content %q", b)
			}
			if keep != "" {
				if after, _ := os.ReadFile(keep); string(after) != string(before) {
					t.Errorf("%s changed: %q → %q", keep, before, after)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".resolv.conf.*")); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestNetworkStageIsNilSafe: a VM without a NIC has no stage, and the
// boot's calls on it do nothing.
func TestNetworkStageIsNilSafe(t *testing.T) {
	var s *networkStage
	s.join()
	s.wait(nil)
	s.finish(nil)
}

// TestNetworkStageSurvivesAPanic: a fault while bringing the NIC up is an
// error logged by PID 1, not the end of it.
func TestNetworkStageSurvivesAPanic(t *testing.T) {
	s := startNetwork(context.Background(), func(...string) { panic("driver wait exploded") })
	s.join()
	if s.err == nil || !strings.Contains(s.err.Error(), "driver wait exploded") {
		t.Fatalf("err %v, want the panic as an error", s.err)
	}
	s.finish(nil) // nothing to write after a failure
}
