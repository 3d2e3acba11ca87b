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
