package qemu

import (
	"errors"
	"flag"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/guestwire"
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
	overlay := minimalSpec()
	overlay.Name = "with-overlay"
	overlay.Disks = []vmm.Disk{
		{ID: "base", Path: "/assets/base.img", ReadOnly: true},
		{ID: "upper", Path: "/var/lib/capsem/vms/dev/disk.qcow2", Format: vmm.DiskQcow2},
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
	network := minimalSpec()
	network.Name = "network"
	network.Network = &vmm.Network{MAC: guestwire.NetGuestMAC}
	networkFDs := ports
	networkFDs.Name = "network-after-ports"
	networkFDs.Network = &vmm.Network{MAC: "52-54-00-AB-CD-EF", MTU: 9000} // printed canonical
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
		"with-overlay":       {overlay, tcgMax},
		"with-share":         {share, tcgMax},
		"odd-paths":          {odd, kvmHost},
		"qboot":              {fw, tcgMax},
		// fd 3 is the monitor when there is one, the state file after it.
		"monitor":         {saving, tcgMax},
		"monitor-restore": {both, tcgMax},
		// Then one socket per port.
		"ports": {ports, tcgMax},
		// Then the NIC's socket (the default MTU when the spec has none).
		"network":             {network, tcgMax},
		"network-after-ports": {networkFDs, kvmHost},
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
		for _, want := range []string{" -nodefaults ", " -no-user-config ", " -nographic ", " -no-reboot ",
			"name=org.capsem.channel", ",server=off", " -sandbox on,"} {
			if !strings.Contains(joined, want) {
				t.Errorf("%s: argv lacks %q", name, want)
			}
		}
		for _, bad := range []string{"-boot ", "microvm", "server=on"} {
			if strings.Contains(joined, bad) {
				t.Errorf("%s: argv has %q", name, bad)
			}
		}
		// A NIC only when the spec has one, and then exactly one, with
		// no option ROM.
		nics := strings.Count(joined, " -netdev ")
		if g.spec.Network == nil && (nics != 0 || strings.Contains(joined, "virtio-net") || !strings.Contains(joined, " -nic none ")) {
			t.Errorf("%s: a NIC without spec.Network: %q", name, joined)
		}
		if g.spec.Network != nil && (nics != 1 || strings.Count(joined, "virtio-net-pci,") != 1 ||
			strings.Contains(joined, " -nic ") || !strings.Contains(joined, ",romfile= ")) {
			t.Errorf("%s: spec.Network but argv %q", name, joined)
		}
		// Every inherited descriptor is named in the argv by its number
		// (the state file's in the URI the monitor passes), each number
		// once, and no other number is named.
		inherited := inheritedFDs(g.spec)
		named := fdNumbersIn(args)
		if g.spec.RestoreFrom != "" {
			uri, _ := incomingURI(g.spec)
			maps.Copy(named, fdNumbersIn([]string{uri}))
		}
		if len(named) != len(inherited) {
			t.Errorf("%s: argv names descriptors %v; the spec makes QEMU inherit %d", name, named, len(inherited))
		}
		for i := range inherited {
			if named[firstInheritedFD+i] != 1 {
				t.Errorf("%s: descriptor %d (%+v) named %d times", name, firstInheritedFD+i, inherited[i], named[firstInheritedFD+i])
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

// fdNumbersIn counts the inherited descriptors QEMU's argv names, by
// number.
func fdNumbersIn(args []string) map[int]int {
	named := map[int]int{}
	re := regexp.MustCompile(`(?:^|,)(?:fd=|addr\.str=|mem-path=/proc/self/fd/)(\d+)(?:,|$)|^fd:(\d+)$`)
	for _, a := range args {
		for _, m := range re.FindAllStringSubmatch(a, -1) {
			n, _ := strconv.Atoi(m[1] + m[2])
			named[n]++
		}
	}
	return named
}

// TestInheritedFDsMatchArgs: the descriptor Args names for each kind is
// the one the list puts at that place, for a spec with every kind.
func TestInheritedFDsMatchArgs(t *testing.T) {
	spec := goldenSpecs()["network-after-ports"].spec
	args, err := Args(spec, tcg("test", false))
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(args, " ")
	for i, fd := range inheritedFDs(spec) {
		n := strconv.Itoa(firstInheritedFD + i)
		want := map[inheritedKind]string{
			inheritConsole:  "-add-fd fd=" + n + ",set=",
			inheritMonitor:  "socket,id=" + monitorChardevID + ",fd=" + n + " ",
			inheritIncoming: "-incoming defer",
			inheritPort:     ",fd=" + n + " -device virtserialport,bus=" + serialBusID + ".0,chardev=port" + strconv.Itoa(slices.Index(spec.Ports, fd.name)) + ",name=" + fd.name,
			inheritNetwork:  "-netdev stream,id=" + netdevID + ",server=off,addr.type=fd,addr.str=" + n + " ",
			inheritMemory:   "memory-backend-file,id=" + memoryBackendID + ",size=512M,mem-path=/proc/self/fd/" + n + ",share=on ",
		}[fd.kind]
		if want == "" || !strings.Contains(joined, want) {
			t.Errorf("descriptor %s is %+v, but argv lacks %q:\n%s", n, fd, want, joined)
		}
	}
	if got := len(inheritedFDs(spec)); got != 7 {
		t.Errorf("%d inherited descriptors, want 7 (console, monitor, state, 2 ports, NIC, RAM)", got)
	}
	// The state file is loaded through the monitor, by the number the
	// list gives it.
	if uri, err := incomingURI(spec); err != nil || uri != "fd:"+strconv.Itoa(firstInheritedFD+2) {
		t.Errorf("incomingURI = %q, %v; want the third descriptor", uri, err)
	}
	if _, err := incomingURI(minimalSpec()); err == nil {
		t.Error("incomingURI of a spec that restores nothing named a descriptor")
	}
}

// A restore without the monitor could never be started: QEMU 7.2 takes
// the capability the state was saved with only through it.
func TestArgsRestoreNeedsMonitor(t *testing.T) {
	spec := minimalSpec()
	spec.RestoreFrom = "/assets/boot-states/k.state"
	if _, err := Args(spec, tcg("test", false)); err == nil || !strings.Contains(err.Error(), "monitor") {
		t.Fatalf("Args of a restore without the monitor: %v", err)
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
		"unknown format":    func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "a", Path: "/d", Format: "vmdk"}} },
		"bad share tag":     func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "a b", HostPath: "/w"}} },
		"duplicate tag":     func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "/w"}, {Tag: "w", HostPath: "/x"}} },
		"bad security":      func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "/w", SecurityModel: "passthrough"}} },
		"long socket path":  func(s *vmm.Spec) { s.ChannelSocket = "/" + strings.Repeat("s", 120) },
		"no console log":    func(s *vmm.Spec) { s.ConsoleLog = "" },
		"relative share":    func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "w"}} },
		"NUL in share path": func(s *vmm.Spec) { s.Shares = []vmm.Share{{Tag: "w", HostPath: "/w\x00"}} },
		"multicast MAC":     func(s *vmm.Spec) { s.Network = &vmm.Network{MAC: "33:33:00:00:00:01"} },
		"option in MAC":     func(s *vmm.Spec) { s.Network = &vmm.Network{MAC: "5a:94:ef:e4:0c:ee,romfile=/x"} },
		"tiny MTU":          func(s *vmm.Spec) { s.Network = &vmm.Network{MAC: guestwire.NetGuestMAC, MTU: 576} },
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

// stateKeys are the saved boot's and the VM's own state keys of a machine
// of minimalSpec changed by mutate.
func stateKeys(t *testing.T, mutate func(*vmm.Spec)) (shared, own []string) {
	t.Helper()
	spec := minimalSpec()
	mutate(&spec)
	m, err := (&Backend{Binary: "/bin/true"}).CreateWithAccel(spec, tcg("test", false))
	if err != nil {
		t.Fatal(err)
	}
	return m.(vmm.StateKeyer).StateKey(), m.(vmm.StateKeyer).OwnStateKey()
}

// TestOwnStateKeyLeavesOutTheInitramfs: a VM's own state (a suspend)
// outlives an initramfs of another capsem build; the saved boot does not,
// and neither outlives another kernel.
func TestOwnStateKeyLeavesOutTheInitramfs(t *testing.T) {
	shared, own := stateKeys(t, func(*vmm.Spec) {})
	newShared, newOwn := stateKeys(t, func(s *vmm.Spec) { s.Initramfs = "/assets/other-build/initramfs.cpio" })
	if slices.Equal(shared, newShared) {
		t.Error("the saved boot's key ignores the initramfs")
	}
	if !slices.Equal(own, newOwn) {
		t.Errorf("a VM's own state's key names the initramfs:\n%q\n%q", own, newOwn)
	}
	if _, kernelOwn := stateKeys(t, func(s *vmm.Spec) { s.Kernel = "/assets/other/vmlinux" }); slices.Equal(own, kernelOwn) {
		t.Error("a VM's own state's key ignores the kernel")
	}
}

// TestStateKeyIgnoresTheTCGCache: a saved state holds no translated code,
// so VMs that differ only in the TCG cache's size share saved boots;
// anything else that changes QEMU's argv keys apart.
func TestStateKeyIgnoresTheTCGCache(t *testing.T) {
	key := func(mutate func(*vmm.Spec)) []string {
		t.Helper()
		shared, _ := stateKeys(t, mutate)
		return shared
	}
	plain := key(func(*vmm.Spec) {})
	if cached := key(func(s *vmm.Spec) { s.TCGCacheMiB = 16 }); !slices.Equal(plain, cached) {
		t.Errorf("the TCG cache size changes the state key:\n%q\n%q", plain, cached)
	}
	disk := key(func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "upper", Path: "/s1/disk.img"}} })
	if layer := key(func(s *vmm.Spec) {
		s.Disks = []vmm.Disk{{ID: "upper", Path: "/s2/disk.qcow2", Format: vmm.DiskQcow2}}
	}); !slices.Equal(disk, layer) {
		t.Errorf("a writable disk's file and format change the state key:\n%q\n%q", disk, layer)
	}
	if slices.Equal(plain, disk) {
		t.Error("a disk keeps the same state key")
	}
	if other := key(func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "base", Path: "/root-a.erofs", ReadOnly: true}} }); slices.Equal(other,
		key(func(s *vmm.Spec) { s.Disks = []vmm.Disk{{ID: "base", Path: "/root-b.erofs", ReadOnly: true}} })) {
		t.Error("two read-only root images share a state key")
	}
	if bigger := key(func(s *vmm.Spec) { s.MemoryMiB = 1024 }); slices.Equal(plain, bigger) {
		t.Error("more guest memory keeps the same state key")
	}
	// A NIC is part of the machine a state resumes in; its settings are
	// the same in every VM, so VMs with one share saved boots.
	withNIC := key(func(s *vmm.Spec) { s.Network = &vmm.Network{MAC: guestwire.NetGuestMAC} })
	if slices.Equal(plain, withNIC) {
		t.Error("a NIC keeps the same state key")
	}
	if again := key(func(s *vmm.Spec) { s.Network = &vmm.Network{MAC: guestwire.NetGuestMAC} }); !slices.Equal(withNIC, again) {
		t.Errorf("two VMs with the same NIC key apart:\n%q\n%q", withNIC, again)
	}
}

// FuzzArgsNetwork: whatever MAC and MTU a spec carries, Args refuses it or
// gives the NIC exactly its options, the MAC in canonical form: nothing a
// spec says can add an option to QEMU's NIC.
func FuzzArgsNetwork(f *testing.F) {
	for _, seed := range []struct {
		mac string
		mtu int
	}{
		{guestwire.NetGuestMAC, 0}, {"52-54-00-AB-CD-EF", 9000}, {"0000.5e00.5301", 1500},
		{guestwire.NetGuestMAC + ",romfile=/x", 0}, {"01:00:5e:00:00:01", 0}, {"", -1}, {"00:00:00:00:00:00", vmm.MaxMTU},
	} {
		f.Add(seed.mac, seed.mtu)
	}
	macOpt := regexp.MustCompile(`^mac=([0-9a-f]{2}:){5}[0-9a-f]{2}$`)
	f.Fuzz(func(t *testing.T, mac string, mtu int) {
		spec := minimalSpec()
		spec.Network = &vmm.Network{MAC: mac, MTU: mtu}
		args, err := Args(spec, tcg("test", false))
		if err != nil {
			if !errors.Is(err, vmm.ErrInvalidSpec) {
				t.Fatalf("MAC %q MTU %d: %v, want ErrInvalidSpec", mac, mtu, err)
			}
			return
		}
		i := slices.Index(args, "-netdev")
		if i < 0 || i+3 >= len(args) || args[i+2] != "-device" {
			t.Fatalf("no NIC in %q", args)
		}
		opts := strings.Split(args[i+3], ",")
		if len(opts) != 5 || opts[0] != "virtio-net-pci" || opts[1] != "netdev="+netdevID || !macOpt.MatchString(opts[2]) ||
			!strings.HasPrefix(opts[3], "host_mtu=") || opts[4] != "romfile=" {
			t.Fatalf("MAC %q MTU %d: device %q", mac, mtu, args[i+3])
		}
		hw, _ := net.ParseMAC(strings.TrimPrefix(opts[2], "mac="))
		want, _ := net.ParseMAC(mac)
		if !slices.Equal(hw, want) || hw[0]&1 != 0 {
			t.Errorf("MAC %q became %s", mac, opts[2])
		}
		if n, _ := strconv.Atoi(strings.TrimPrefix(opts[3], "host_mtu=")); n < vmm.MinMTU || n > vmm.MaxMTU || (mtu != 0 && n != mtu) {
			t.Errorf("MTU %d became %s", mtu, opts[3])
		}
	})
}
