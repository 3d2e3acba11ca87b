//go:build linux && !amd64 && !arm64

package privsep

// The seccomp filter is written for amd64 and arm64 only (other ABIs
// multiplex sockets through socketcall, which a filter cannot inspect).
// Elsewhere the first stage fails closed when it would need the filter,
// unless the policy allows best effort.
const (
	seccompSupported   = false
	seccompAuditArch   = 0
	seccompX32Bit      = 0
	sysSocket          = 0
	sysIOUringSetup    = 0
	sysIOUringEnter    = 0
	sysIOUringRegister = 0
)
