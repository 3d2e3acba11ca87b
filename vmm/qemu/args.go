// Package qemu is the QEMU backend of vmm for Linux hosts:
// qemu-system-x86_64 with direct kernel boot, no firmware menus, and the
// guest channel on one virtio-serial port. The guest has a NIC only when
// the spec asks for one (vmm.Spec.Network): a virtio-net device on a stream
// netdev whose other end, one of a socket pair this package makes, is the
// caller's (Machine.NetworkConn), so QEMU itself reaches no network.
//
// The accelerator is chosen by proof (Backend.ChooseAccel), in one place
// for every QEMU this project starts: KVM only once the guest's own kernel
// and initramfs have booted under it to a line printed from userspace
// (MarkerBoot), TCG otherwise, with the reason logged. The verdict is
// cached per host boot, QEMU binary and version, and kernel (Verdict). The
// KVM CPU models are tried in order, each after the failure it exists for:
//   - host: a /dev/kvm that is fine runs the host's own CPU model.
//   - host,-arch-capabilities: after QEMU aborts with "failed to set MSR
//     0x10a" (a nested host that refuses IA32_ARCH_CAPABILITIES). On PVM
//     nested virtualization it starts, but a stock kernel never reaches
//     userspace: the verdict there is TCG.
//
// A VM that fails under a proven KVM before its guest answers is the
// caller's to retry under TCG, after Backend.DemoteKVM.
//
// Channel socket roles: the host (this package) listens on Spec.ChannelSocket
// (mode 0600) before QEMU starts, and QEMU connects to it as a client
// (chardev socket,server=off). Listening first means QEMU either connects at
// once or fails to start with a clear error, there is no window in which the
// socket exists with QEMU's default permissions, and the connection is
// checked to come from our QEMU's PID. Once connected the socket file is
// removed. On the connection the host is the yamux server and the guest
// agent the client (guestchan.Server / guestchan.Client).
package qemu

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/vmm"
)

// Identifiers QEMU and the guest see.
const (
	channelChardevID  = "chan"
	consoleChardevID  = "console"
	consoleFDSet      = "1"
	memoryBackendID   = "ram"
	monitorChardevID  = "qmp"
	netdevID          = "net0"
	portChardevPrefix = "port"
	serialBusID       = "vser0"
)

// inheritedKind is what a descriptor QEMU inherits carries.
type inheritedKind int

const (
	inheritConsole  inheritedKind = iota + 1 // write end of the console pipe
	inheritMonitor                           // QEMU's end of the QMP socket pair
	inheritIncoming                          // the state file to restore from
	inheritPort                              // QEMU's end of a port's socket pair
	inheritNetwork                           // QEMU's end of the NIC's socket pair
	inheritMemory                            // the guest's RAM: a memfd the Machine keeps too
)

// inheritedFD is one descriptor QEMU inherits: its kind and, for a port,
// the port's name.
type inheritedFD struct {
	kind inheritedKind
	name string
}

// firstInheritedFD is QEMU's number for the first of exec.Cmd.ExtraFiles.
const firstInheritedFD = 3

// inheritedFDs lists the descriptors QEMU inherits for spec, in order: the
// i-th is QEMU's descriptor firstInheritedFD+i. It is the one place that
// order is declared: Args numbers the descriptors from it (fdNumbers) and
// Machine.extraFiles opens them walking it.
func inheritedFDs(spec vmm.Spec) []inheritedFD {
	fds := []inheritedFD{{kind: inheritConsole}}
	if spec.Monitor {
		fds = append(fds, inheritedFD{kind: inheritMonitor})
	}
	if spec.RestoreFrom != "" {
		fds = append(fds, inheritedFD{kind: inheritIncoming})
	}
	for _, name := range spec.Ports {
		fds = append(fds, inheritedFD{kind: inheritPort, name: name})
	}
	if spec.Network != nil {
		fds = append(fds, inheritedFD{kind: inheritNetwork})
	}
	return append(fds, inheritedFD{kind: inheritMemory})
}

// incomingURI is the migrate-incoming URI of a spec that restores a state:
// its inherited state file.
func incomingURI(spec vmm.Spec) (string, error) {
	fds := &fdNumbers{list: inheritedFDs(spec)}
	uri := "fd:" + fds.of(inheritIncoming, "")
	return uri, fds.err
}

// fdNumbers gives QEMU's number of each inherited descriptor. A descriptor
// missing from the list is an error kept for Args to return, not a number
// that would name some other file.
type fdNumbers struct {
	list []inheritedFD
	err  error
}

func (n *fdNumbers) of(kind inheritedKind, name string) string {
	for i, fd := range n.list {
		if fd.kind == kind && fd.name == name {
			return strconv.Itoa(firstInheritedFD + i)
		}
	}
	if n.err == nil {
		n.err = fmt.Errorf("qemu: no inherited descriptor of kind %d named %q", kind, name)
	}
	return "-1"
}

// TCGKernelParams are added to the guest kernel's command line under TCG.
//
// tsc=reliable: TCG's CPU models do not advertise an invariant TSC, so on a
// multi-CPU guest the kernel assumes the TSCs are not synchronized, drops
// the TSC clocksource and falls back to the HPET, whose every read is an
// emulated MMIO access and which the vDSO cannot use: each clock_gettime
// becomes a system call. Under TCG every vCPU's TSC is the same host
// counter, which QEMU keeps monotonic, with no per-CPU offset unless the
// guest writes one, so it is synchronized and constant-rate. Measured here:
// exec `true` p50 18.7 → 16.4 ms. (KVM guests use kvm-clock.)
const TCGKernelParams = "tsc=reliable"

// Args returns QEMU's argv (without the program name) for spec under the
// chosen accelerator. It is a pure function of its inputs: no probes, no
// environment, no files.
func Args(spec vmm.Spec, accel Accel) ([]string, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	switch accel.Name {
	case vmm.AccelKVM, vmm.AccelTCG:
	default:
		return nil, fmt.Errorf("qemu: accelerator %q: want %q or %q", accel.Name, vmm.AccelKVM, vmm.AccelTCG)
	}
	if accel.CPU == "" || strings.ContainsAny(accel.CPU, " \x00") {
		return nil, fmt.Errorf("qemu: CPU model %q for %s", accel.CPU, accel.Name)
	}
	cmdline := spec.Cmdline
	if k := AccelKernelParams(accel); k != "" {
		cmdline = strings.TrimSpace(cmdline + " " + k)
	}
	machine := spec.Machine
	if machine == "" {
		machine = vmm.DefaultMachine
	}
	accelOpt := accel.Name
	if accel.Name == vmm.AccelTCG && spec.TCGCacheMiB > 0 {
		accelOpt += ",tb-size=" + strconv.Itoa(spec.TCGCacheMiB)
	}
	fds := &fdNumbers{list: inheritedFDs(spec)}
	a := []string{
		"-name", "guest=" + spec.Name + ",debug-threads=on",
		// The guest's RAM is a memfd of the Machine's, shared with QEMU
		// (share=on), not QEMU's own memory: a saved state then holds
		// only the devices' state (the x-ignore-shared capability leaves
		// shared RAM out of a migration), and the Machine writes the RAM
		// itself (vmm/ramfile), in a fraction of the time and without
		// walking the untouched pages; a restore fills a fresh memfd from
		// that file before QEMU starts. Opened by its /proc path: QEMU
		// takes RAM backends by path only.
		"-object", "memory-backend-file,id=" + memoryBackendID + ",size=" + strconv.Itoa(spec.MemoryMiB) + "M" +
			",mem-path=/proc/self/fd/" + fds.of(inheritMemory, "") + ",share=on",
		"-machine", machine + ",memory-backend=" + memoryBackendID,
		"-accel", accelOpt,
		"-cpu", accel.CPU,
		"-smp", strconv.Itoa(spec.CPUs),
		"-m", strconv.Itoa(spec.MemoryMiB) + "M",
		// Nothing we did not ask for: no default devices, no config files,
		// no display, and a guest reboot or panic (panic=-1) ends QEMU
		// instead of looping. A NIC only when the spec has one.
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
	}
	if nic := spec.Network; nic != nil {
		a = append(a, networkArgs(*nic, fds.of(inheritNetwork, ""))...)
	} else {
		a = append(a, "-nic", "none")
	}
	a = append(a,
		// QEMU faces guest code: confine it with seccomp (no exec, no
		// setuid, no obsolete syscalls, no scheduler/resource tweaks).
		// Measured here under TCG: no cost visible in boot or channel figures.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-kernel", spec.Kernel,
		"-initrd", spec.Initramfs,
		"-append", cmdline,
		// Serial console (ttyS0) into a pipe we made, which QEMU opens as
		// a file from fd set 1 (append=on: it would truncate the file
		// otherwise, which a pipe refuses): the Machine writes it to
		// spec.ConsoleLog, bounded and rotating, since the guest writes it
		// as fast as it likes. A pipe, not a socket: QEMU writes the
		// console a byte at a time; a pipe packs those into pages, where a
		// socket's buffer fills after a few hundred, so its reader wakes
		// for every few bytes.
		"-add-fd", "fd="+fds.of(inheritConsole, "")+",set="+consoleFDSet,
		"-chardev", "file,id="+consoleChardevID+",path=/dev/fdset/"+consoleFDSet+",append=on",
		"-serial", "chardev:"+consoleChardevID,
		// The guest channel: one virtio-serial port on a socket we listen on,
		// then one per spec.Ports. max_ports as few as that (port 0 stays
		// reserved for a console, ours start at 1): the default 31 ports
		// make the guest driver set up 64 virtqueues at probe, on the
		// boot's critical path.
		"-device", "virtio-serial-pci,id="+serialBusID+",max_ports="+strconv.Itoa(2+len(spec.Ports)),
		"-chardev", "socket,id="+channelChardevID+",path="+optValue(spec.ChannelSocket)+",server=off",
		"-device", "virtserialport,bus="+serialBusID+".0,chardev="+channelChardevID+",name="+guestchan.VirtioPortName,
	)
	if spec.Firmware != "" {
		a = append(a, "-bios", spec.Firmware)
	}
	if spec.Monitor {
		// QMP on a socket pair we made: no socket file anyone else
		// could connect to.
		a = append(a, "-chardev", "socket,id="+monitorChardevID+",fd="+fds.of(inheritMonitor, ""),
			"-mon", "chardev="+monitorChardevID+",mode=control",
			// A state is saved with the VM paused (see SaveState); without
			// this the paused run state travels in it, and every VM
			// resumed from it would wait for a "cont" instead of running.
			"-global", "migration.store-global-state=off")
	}
	if spec.RestoreFrom != "" {
		if !spec.Monitor {
			return nil, errors.New("qemu: restoring a state needs the monitor (vmm.Spec.Monitor)")
		}
		// The saved state comes in on an inherited descriptor (QEMU's
		// sandbox forbids it to spawn a reader, and we open the file),
		// once the Machine has set the capability the state was saved
		// with (x-ignore-shared), which only the monitor can: QEMU 7.2
		// has no command-line form of it.
		a = append(a, "-incoming", "defer")
	}
	for i, name := range spec.Ports {
		// A socket pair we made, connected from the start: nothing anyone
		// else could connect to.
		id := portChardevPrefix + strconv.Itoa(i)
		a = append(a, "-chardev", "socket,id="+id+",fd="+fds.of(inheritPort, name),
			"-device", "virtserialport,bus="+serialBusID+".0,chardev="+id+",name="+name)
	}
	for _, d := range spec.Disks {
		ro, extra := "off", ",discard=unmap" // deletes in the guest keep the image sparse
		if d.ReadOnly {
			ro, extra = "on", ""
		}
		id := "disk-" + d.ID
		format := "raw"
		if d.Format == vmm.DiskQcow2 {
			format = string(vmm.DiskQcow2)
		}
		a = append(a,
			// cache=writeback honours guest flushes (persistence) and works
			// on every filesystem (cache=none needs O_DIRECT).
			// file.drop-cache=off: restoring a saved state otherwise ends
			// with QEMU dropping the file's pages from the host's page
			// cache (made for storage shared between hosts), which for the
			// root image every VM shares evicts it under all of them at
			// each start. Here every QEMU is on the same host, whose page
			// cache is coherent, and the guest drops its own cache after
			// the wake.
			"-drive", "file="+optValue(d.Path)+",if=none,id="+id+",format="+format+",readonly="+ro+",cache=writeback,file.drop-cache=off"+extra,
			// One request queue: the default is one per vCPU, each set up
			// (rings, vectors) while the guest boots, for no gain on a
			// disk this small under TCG.
			"-device", "virtio-blk-pci,drive="+id+",serial="+d.ID+",num-queues=1",
		)
	}
	for i, sh := range spec.Shares {
		model := sh.SecurityModel
		if model == "" {
			model = "none"
		}
		id := "fs" + strconv.Itoa(i)
		fsdev := "local,id=" + id + ",path=" + optValue(sh.HostPath) + ",security_model=" + model
		if sh.ReadOnly {
			fsdev += ",readonly=on"
		}
		// remap: inode numbers stay unique when the share spans host
		// filesystems (otherwise QEMU warns and the guest may confuse
		// files).
		fsdev += ",multidevs=remap"
		a = append(a,
			"-fsdev", fsdev,
			"-device", "virtio-9p-pci,fsdev="+id+",mount_tag="+sh.Tag,
		)
	}
	if fds.err != nil {
		return nil, fds.err
	}
	return a, nil
}

// DefaultMTU is the guest NIC's MTU when vmm.Network.MTU is 0: the
// largest (vmm.MaxMTU). Over a stream netdev QEMU offers the guest no
// checksum or segmentation offload, so the guest's TCP sends at most one
// MTU per frame and per trip through QEMU: the MTU is the throughput.
const DefaultMTU = vmm.MaxMTU

// networkArgs attach the NIC: a virtio-net device whose frames go out on
// the inherited descriptor fd, one end of a stream socket pair we made
// (nothing anyone else could connect to), each frame preceded by its
// length as 4 bytes big-endian (vmm.FramingStream4BE).
func networkArgs(nic vmm.Network, fd string) []string {
	mtu := nic.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	// Validated by Spec.Validate; printed canonical (lower case, colons),
	// the form QEMU parses.
	mac, _ := net.ParseMAC(nic.MAC)
	return []string{
		"-netdev", "stream,id=" + netdevID + ",server=off,addr.type=fd,addr.str=" + fd,
		// host_mtu: the guest's driver takes its MTU from the device.
		// romfile= (none): the option ROM is iPXE, for network boot,
		// which a direct kernel boot never does; without it the firmware
		// has nothing to load for the NIC.
		"-device", "virtio-net-pci,netdev=" + netdevID + ",mac=" + mac.String() + ",host_mtu=" + strconv.Itoa(mtu) + ",romfile=",
	}
}

// optValue escapes a value inside a QEMU "key=value,..." option string,
// where a literal comma is written twice.
func optValue(s string) string { return strings.ReplaceAll(s, ",", ",,") }
