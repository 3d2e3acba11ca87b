package vmm

import (
	"errors"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	good := Spec{
		Name: "dev-1", Kernel: "/k", Initramfs: "/i", Cmdline: "console=ttyS0",
		CPUs: 1, MemoryMiB: 256, ChannelSocket: "/s/c.sock", ConsoleLog: "/s/console.log",
		Disks:  []Disk{{ID: "base", Path: "/b.img", ReadOnly: true}},
		Shares: []Share{{Tag: "workspace", HostPath: "/w"}},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good spec: %v", err)
	}
	bad := good
	bad.Name = "../etc"
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "../etc") {
		t.Fatalf("path-like name: %v", err)
	}
}

func TestValidateTCGCache(t *testing.T) {
	for _, tc := range []struct {
		mib int
		ok  bool
	}{{0, true}, {MinTCGCacheMiB, true}, {64, true}, {MaxTCGCacheMiB, true}, {MinTCGCacheMiB - 1, false}, {-1, false}, {MaxTCGCacheMiB + 1, false}} {
		s := Spec{Name: "dev-1", Kernel: "/k", Initramfs: "/i", CPUs: 1, MemoryMiB: 256, ChannelSocket: "/s/c.sock", ConsoleLog: "/s/console.log", TCGCacheMiB: tc.mib}
		err := s.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "TCG cache")) {
			t.Errorf("TCG cache %d MiB: %v, want ok=%v", tc.mib, err, tc.ok)
		}
	}
}

func TestValidatePorts(t *testing.T) {
	for _, tc := range []struct {
		ports []string
		want  string // "" for valid
	}{
		{nil, ""},
		{[]string{"org.capsem.workspace"}, ""},
		{[]string{"a", "b-2_c.d"}, ""},
		{[]string{""}, "port 0 name"},
		{[]string{"Upper"}, "port 0 name"},
		{[]string{"../x"}, "port 0 name"},
		{[]string{"a,b"}, "port 0 name"},
		{[]string{"a", "a"}, "used twice"},
		{[]string{"org.capsem.channel"}, "used twice"},
		{[]string{strings.Repeat("a", 65)}, "port 0 name"},
	} {
		s := Spec{Name: "dev-1", Kernel: "/k", Initramfs: "/i", CPUs: 1, MemoryMiB: 256, ChannelSocket: "/s/c.sock", ConsoleLog: "/s/console.log", Ports: tc.ports}
		err := s.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("ports %q: %v, want %q", tc.ports, err, tc.want)
		}
	}
}

func TestValidateNetwork(t *testing.T) {
	for _, tc := range []struct {
		name string
		nic  *Network
		want string // "" for valid
	}{
		{"none", nil, ""},
		{"locally administered", &Network{MAC: "5a:94:ef:e4:0c:ee"}, ""},
		{"upper case, dashes", &Network{MAC: "52-54-00-AB-CD-EF"}, ""},
		{"lowest MTU", &Network{MAC: "52:54:00:12:34:56", MTU: MinMTU}, ""},
		{"highest MTU", &Network{MAC: "52:54:00:12:34:56", MTU: MaxMTU}, ""},
		{"Ethernet MTU", &Network{MAC: "52:54:00:12:34:56", MTU: 1500}, ""},
		{"empty MAC", &Network{}, "network MAC"},
		{"not a MAC", &Network{MAC: "eth0"}, "network MAC"},
		{"five octets", &Network{MAC: "52:54:00:12:34"}, "network MAC"},
		{"EUI-64", &Network{MAC: "52:54:00:12:34:56:78:9a"}, "want 6 octets"},
		{"comma smuggles an option", &Network{MAC: "52:54:00:12:34:56,romfile=/x"}, "network MAC"},
		{"multicast", &Network{MAC: "01:00:5e:00:00:01"}, "multicast"},
		{"broadcast", &Network{MAC: "ff:ff:ff:ff:ff:ff"}, "multicast"},
		{"all zero", &Network{MAC: "00:00:00:00:00:00"}, "all zero"},
		{"MTU too small", &Network{MAC: "52:54:00:12:34:56", MTU: MinMTU - 1}, "network MTU"},
		{"MTU too large", &Network{MAC: "52:54:00:12:34:56", MTU: MaxMTU + 1}, "network MTU"},
		{"negative MTU", &Network{MAC: "52:54:00:12:34:56", MTU: -1}, "network MTU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Spec{Name: "dev-1", Kernel: "/k", Initramfs: "/i", CPUs: 1, MemoryMiB: 256, ChannelSocket: "/s/c.sock", ConsoleLog: "/s/console.log", Network: tc.nic}
			err := s.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (!errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("%+v: %v, want %q", tc.nic, err, tc.want)
			}
		})
	}
}

func TestFramingString(t *testing.T) {
	for f, want := range map[Framing]string{FramingStream4BE: "stream-4be", FramingDatagram: "datagram", 0: "Framing(0)"} {
		if got := f.String(); got != want {
			t.Errorf("Framing(%d).String() = %q, want %q", int(f), got, want)
		}
	}
}
