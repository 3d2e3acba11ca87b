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
