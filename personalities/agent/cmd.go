// Package agent is the guest agent: PID 1 (/init) inside every Capsem VM. It
// mounts the pseudo filesystems, loads the kernel modules the channel needs,
// reaps orphans, opens the guest channel to the host, says Hello on the
// control port, and then serves the host's requests: boot config, exec (with
// stdout and stderr as separate streams), file operations and shutdown. It
// also bridges guestwire.GuestMCPSocket to the host MCP port, so
// capsem-mcp-server inside the guest reaches the gateway with no setup.
//
// It builds without cgo (it is the guest binary) and runs only on Linux.
package agent

// Cmd is the agent personality.
type Cmd struct {
	// AllowNotPID1 (envvars.AgentAllowNotPID1) lets the agent run when it is
	// not PID 1 (a test inside a VM or container): it then mounts only what
	// is not mounted yet, becomes a child subreaper instead of init, and
	// exits instead of powering off.
	AllowNotPID1 bool `name:"allow-not-pid1" hidden:"" env:"CAPSEM_AGENT_ALLOW_NOT_PID1" help:"Run even when not PID 1 (tests)."`
	// KernelArgs swallows whatever the kernel passes init on its command
	// line: a parse error in PID 1 would panic the kernel.
	KernelArgs []string `arg:"" optional:"" passthrough:"" hidden:""`
}
