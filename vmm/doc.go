// Package vmm is Capsem's VM engine: a plain-data Spec, a Backend that turns
// it into a Machine, and (in vmm/qemu) the QEMU backend used on Linux.
package vmm
