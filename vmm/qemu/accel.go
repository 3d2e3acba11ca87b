package qemu

import (
	"fmt"
	"os"
	"syscall"

	"github.com/capsem/capsem/vmm"
)

// AccelEnv forces the accelerator when a spec leaves it empty.
const AccelEnv = "CAPSEM_ACCEL"

// ProbeKVM reports whether /dev/kvm opens read-write, which is what QEMU
// needs to use it; the error says why not.
func ProbeKVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// ResolveAccel picks the accelerator: the spec's when set, else the
// CAPSEM_ACCEL value when set, else kvm when probe succeeds and tcg
// otherwise. reason says why, for the log. Asking for kvm when probe fails
// is an error: silently running 10-50x slower would hide a broken host.
func ResolveAccel(specAccel, env string, probe func() error) (accel, reason string, err error) {
	forced, source := specAccel, "spec"
	if forced == "" && env != "" {
		forced, source = env, AccelEnv
	}
	switch forced {
	case vmm.AccelTCG:
		return vmm.AccelTCG, "forced by " + source, nil
	case vmm.AccelKVM:
		if perr := probe(); perr != nil {
			return "", "", fmt.Errorf("qemu: kvm forced by %s but /dev/kvm is not usable: %w", source, perr)
		}
		return vmm.AccelKVM, "forced by " + source, nil
	case "":
		if perr := probe(); perr != nil {
			return vmm.AccelTCG, fmt.Sprintf("/dev/kvm not usable (%v); falling back to TCG emulation", perr), nil
		}
		return vmm.AccelKVM, "/dev/kvm opens read-write", nil
	default:
		return "", "", fmt.Errorf("qemu: accelerator %q from %s: want %q or %q", forced, source, vmm.AccelKVM, vmm.AccelTCG)
	}
}
