package qemu

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/vmm"
)

var update = flag.Bool("update", false, "rewrite testdata/qemu/*.args from the current Args")

func minimalSpec() vmm.Spec {
	return vmm.Spec{
		Name:          "minimal",
		Kernel:        "/assets/vmlinuz",
		Initramfs:     "/assets/initramfs.cpio",
		Cmdline:       "console=ttyS0 panic=-1 quiet capsem.channel=serial",
		CPUs:          2,
		MemoryMiB:     512,
		ChannelSocket: "/run/capsem/s1/chan.sock",
		ConsoleLog:    "/run/capsem/s1/console.log",
	}
}

// goldenSpecs are the specs whose argv is pinned in testdata/qemu.
func goldenSpecs() map[string]struct {
	spec  vmm.Spec
	accel Accel
} {
	disks := minimalSpec()
	disks.Name = "with-disks"
	disks.Disks = []vmm.Disk{
		{ID: "base", Path: "/assets/base.img", ReadOnly: true},
		{ID: "upper", Path: "/var/lib/capsem/vms/dev/upper.img"},
	}
	share := minimalSpec()
	share.Name = "with-share"
	share.Shares = []vmm.Share{
		{Tag: "workspace", HostPath: "/home/u/work"},
		{Tag: "ro-tools", HostPath: "/opt/tools", ReadOnly: true, SecurityModel: "mapped-xattr"},
	}
	odd := minimalSpec()
	odd.Name = "odd-paths"
	odd.Machine = "pc"
	odd.CPUs, odd.MemoryMiB = 1, 256
	odd.ConsoleLog = "/tmp/a,b/console.log"
	odd.ChannelSocket = "/tmp/a,b/c.sock"
	odd.Disks = []vmm.Disk{{ID: "d1", Path: "/tmp/a,b/disk,1.img"}}
	odd.Shares = []vmm.Share{{Tag: "w", HostPath: "/tmp/a,b/w"}}
	fw := minimalSpec()
	fw.Name = "qboot"
	fw.Firmware = FastFirmware
	saving := minimalSpec()
	saving.Name = "monitor"
	saving.Monitor = true
	restoring := minimalSpec()
	restoring.Name = "restore"
	restoring.RestoreFrom = "/assets/boot-states/k.state"
	both := restoring
	both.Name = "monitor-restore"
	both.Monitor = true
	ports := both
	ports.Name = "ports"
	ports.Ports = []string{"org.capsem.workspace", "second"}
	tcgCache := minimalSpec()
	tcgCache.Name = "tcg-cache"
	tcgCache.TCGCacheMiB = 64
	kvmHost := Accel{Name: vmm.AccelKVM, CPU: "host"}
	kvmNested := Accel{Name: vmm.AccelKVM, CPU: kvmCPUs[1].Model}
	tcgMax := tcg("test", false)
	return map[string]struct {
		spec  vmm.Spec
		accel Accel
	}{
		"minimal-tcg":        {minimalSpec(), tcgMax},
		"minimal-kvm":        {minimalSpec(), kvmHost},
		"minimal-kvm-nested": {minimalSpec(), kvmNested},
		"tcg-cache":          {tcgCache, tcgMax},
		"tcg-cache-kvm":      {tcgCache, kvmHost}, // no TCG: no tb-size
		"with-disks":         {disks, tcgMax},
		"with-share":         {share, tcgMax},
		"odd-paths":          {odd, kvmHost},
		"qboot":              {fw, tcgMax},
		// fd 3 is the monitor when there is one, the state file after it.
		"monitor":         {saving, tcgMax},
		"restore":         {restoring, tcgMax},
		"monitor-restore": {both, tcgMax},
		// Then one socket per port.
		"ports": {ports, tcgMax},
	}
}

func TestArgsGolden(t *testing.T) {
	dir := filepath.Join(testkit.ModuleRoot(t), "testdata", "qemu")
	for name, g := range goldenSpecs() {
		t.Run(name, func(t *testing.T) {
			args, err := Args(g.spec, g.accel)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(args, "\n") + "\n"
			path := filepath.Join(dir, name+".args")
			if *update {
				os.MkdirAll(dir, 0o755)
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./vmm/qemu -run TestArgsGolden -update)", err)
			}
			if got != string(want) {
				t.Errorf("argv differs from %s (rerun with -update if intended):\n got: %q\nwant: %q", path, args, strings.Split(strings.TrimSpace(string(want)), "\n"))
			}
			// Pure: the same input gives the same argv.
			again, _ := Args(g.spec, g.accel)
			if !slices.Equal(args, again) {
				t.Error("Args is not deterministic")
			}
		})
	}
}

// TestArgsInvariants checks what must hold for every spec, beyond goldens.
func TestArgsInvariants(t *testing.T) {
	for name, g := range goldenSpecs() {
		args, _ := Args(g.spec, g.accel)
		joined := " " + strings.Join(args, " ") + " "
		for _, want := range []string{" -nodefaults ", " -no-user-config ", " -nographic ", " -no-reboot ", " -nic none ",
			"name=org.capsem.channel", ",server=off", " -sandbox on,"} {
			if !strings.Contains(joined, want) {
				t.Errorf("%s: argv lacks %q", name, want)
			}
		}
		for _, bad := range []string{"-netdev", "virtio-net", "-boot ", "microvm", "server=on"} {
			if strings.Contains(joined, bad) {
				t.Errorf("%s: argv has %q", name, bad)
			}
		}
		// The firmware is the spec's, or QEMU's default when it names none.
		if hasBios := strings.Contains(joined, " -bios "); hasBios != (g.spec.Firmware != "") ||
			(hasBios && !strings.Contains(joined, " -bios "+g.spec.Firmware+" ")) {
			t.Errorf("%s: firmware %q but argv %q", name, g.spec.Firmware, joined)
		}
		// The accelerator, with a bounded translation cache only under TCG.
		wantAccel := g.accel.Name
		if g.accel.Name == vmm.AccelTCG && g.spec.TCGCacheMiB > 0 {
			wantAccel += ",tb-size=" + strconv.Itoa(g.spec.TCGCacheMiB)
		}
		if i := slices.Index(args, "-accel"); i < 0 || args[i+1] != wantAccel {
			t.Errorf("%s: -accel is not %s", name, wantAccel)
		}
		if i := slices.Index(args, "-cpu"); i < 0 || args[i+1] != g.accel.CPU {
			t.Errorf("%s: -cpu is not %s for %s", name, g.accel.CPU, g.accel.Name)
		}
		// TCG's clock parameter goes on the kernel's command line, and
		// only under TCG.
		i := slices.Index(args, "-append")
		if has := strings.Contains(args[i+1], TCGKernelParams); has != (g.accel.Name == vmm.AccelTCG) {
			t.Errorf("%s: %s on the command line %q under %s", name, TCGKernelParams, args[i+1], g.accel.Name)
		}
	}
}

func TestArgsRejects(t *testing.T) {
	good := minimalSpec()
	for _, a := range []Accel{{Name: "hvf", CPU: "host"}, {Name: vmm.AccelKVM}, {Name: vmm.AccelKVM, CPU: "host -s"}} {
		if _, err := Args(good, a); err == nil {
			t.Errorf("accelerator %+v accepted", a)
		}
	}
	mutate := map[string]func(*vmm.Spec){
		"empty name":        func(s *vmm.Spec) { s.Name = "" },
		"comma in name":     func(s *vmm.Spec) { s.Name = "a,b" },
		"relative kernel":   func(s *vmm.Spec) { s.Kernel = "vmlinuz" },
		"no initramfs":      func(s *vmm.Spec) { s.Initramfs = "" },
		"zero cpus":         func(s *vmm.Spec) { s.CPUs = 0 },
		"tiny memory":       func(s *vmm.Spec) { s.MemoryMiB = 16 },
		"bad accel":         func(s *vmm.Spec) { s.Accel = "xen" },
		"microvm":           func(s *vmm.Spec) { s.Machine = "microvm" },
		"relative firmware": func(s *vmm.Spec) { s.Firmware = "qboot.rom" },
		"newline cmdline":   func(s *vmm.Spec) { s.Cmdline = "a\nb" },
		"bad disk id":       func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "1x", Path: "/d"}} },
		"disk id too long":  func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "abcdefghijklmnopqrstu", Path: "/d"}} },
		"comma in disk id":  func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "a,b", Path: "/d"}} },
		"duplicate disk":    func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "a", Path: "/d"}, {ID: "a", Path: "/e"}} },
		"relative disk":     func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "a", Path: "d.img"}} },
		"bad share tag":     func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "a b", HostPath: "/w"}} },
		"duplicate tag":     func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "/w"}, {Tag: "w", HostPath: "/x"}} },
		"bad security":      func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "/w", SecurityModel: "passthrough"}} },
		"long socket path":  func(s *vmm.Spec) { s.ChannelSocket = "/" + strings.Repeat("s", 120) },
		"no console log":    func(s *vmm.Spec) { s.ConsoleLog = "" },
		"relative share":    func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "w"}} },
		"NUL in share path": func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "/w\x00"}} },
	}
	for name, f := range mutate {
		s := minimalSpec()
		f(&s)
		_, err := Args(s, tcg("test", false))
		if !errors.Is(err, vmm.ErrInvalidSpec) {
			t.Errorf("%s: %v, want ErrInvalidSpec", name, err)
		}
	}
}

// TestMarkerBootArgsGolden pins the probe's and the bare boot's argv (a
// pure function, like Args) for both accelerators.
func TestMarkerBootArgsGolden(t *testing.T) {
	files := BootFiles{Kernel: "/assets/vmlinux", Initramfs: "/assets/initramfs.cpio", Firmware: FastFirmware}
	for name, accel := range map[string]Accel{
		"marker-kvm": {Name: vmm.AccelKVM, CPU: "host"},
		"marker-tcg": tcg("test", false),
	} {
		t.Run(name, func(t *testing.T) {
			args := MarkerBoot{Files: files, Accel: accel, CPUs: 2, MemoryMiB: 1024}.Args()
			got := strings.Join(args, "\n") + "\n"
			path := filepath.Join(testkit.ModuleRoot(t), "testdata", "qemu", name+".args")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./vmm/qemu -run TestMarkerBootArgsGolden -args -update)", err)
			}
			if got != string(want) {
				t.Errorf("argv differs from %s:\n got: %q", path, args)
			}
		})
	}
}

// TestStateKeyIgnoresTheTCGCache: a saved state holds no translated code,
// so VMs that differ only in the TCG cache's size share saved boots;
// anything else that changes QEMU's argv keys apart.
func TestStateKeyIgnoresTheTCGCache(t *testing.T) {
	b := &Backend{Binary: "/bin/true"}
	key := func(mutate func(*vmm.Spec)) []string {
		t.Helper()
		spec := minimalSpec()
		mutate(&spec)
		m, err := b.CreateWithAccel(spec, tcg("test", false))
		if err != nil {
			t.Fatal(err)
		}
		return m.(vmm.StateKeyer).StateKey()
	}
	plain := key(func(*vmm.Spec) {})
	if cached := key(func(s *vmm.Spec) { s.TCGCacheMiB = 16 }); !slices.Equal(plain, cached) {
		t.Errorf("the TCG cache size changes the state key:\n%q\n%q", plain, cached)
	}
	if bigger := key(func(s *vmm.Spec) { s.MemoryMiB = 1024 }); slices.Equal(plain, bigger) {
		t.Error("more guest memory keeps the same state key")
	}
}
