// Package vmm is Capsem's VM engine: a plain-data Spec, a Backend that turns
// it into a Machine, and (in vmm/qemu) the QEMU backend used on Linux.
//
// The Machine gives the host side of the guest channel
// (guestchan.Channel); asking the guest to shut down nicely goes over that
// channel and is the caller's job. Machine.Stop only terminates the VM.
package vmm
