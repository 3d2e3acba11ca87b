package api

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/capsem/capsem/vmm"
)

// VMConfigVersion is the version of VMConfig's form. A VM's record carries
// the version it was written with: a record of a newer version (written by
// a newer capsem) is refused rather than read wrong.
const VMConfigVersion = 1

// VMConfig is what a user chooses about a VM, each setting declared once:
// its JSON name here is the service API's and the VM record's, its flag
// (the kong tags) is `capsem create`'s, `capsem run`'s and the per-VM
// process's, and capsem_create's argument is the JSON name in camelCase
// (or the mcp tag's name), described by the mcphelp tag or else the help
// tag. A zero field takes the default
// (WithDefaults); Check refuses what no VM can have, naming the setting.
type VMConfig struct {
	// Version is VMConfigVersion when written; 0 in a request.
	Version int `json:"config_version,omitempty" kong:"-"`

	CPUs  int `json:"cpus,omitempty" name:"cpus" mcp:"cpuCount" help:"Virtual CPUs (default 2)."`
	RAMMB int `json:"ram_mb,omitempty" name:"ram-mb" help:"Guest memory in MB (MiB) (default 1024)."`
	// DiskGB is a pointer: 0 (no disk) differs from unset (the default).
	DiskGB *int `json:"disk_gb,omitempty" name:"disk-gb" help:"Size of the VM's disk in GB (GiB), sparse (default 8); 0: none, the guest runs from RAM (base minimal only)."`
	// Base is the VM's root: BaseFull (Debian with the AI CLIs, from
	// capsem image build) or BaseMinimal (busybox only).
	Base string `json:"base,omitempty" name:"base" enum:"full,minimal," default:"" help:"The VM's root: full (Debian with Node, Python, git and the AI CLIs wired to the gateway; the default) or minimal (busybox only; boots on a bare host)."`
	// Workspace is an absolute host directory shared read-write as the
	// guest's workspace and its commands' working directory; "": the
	// VM's own, in its session directory.
	Workspace string `json:"workspace,omitempty" name:"workspace" type:"path" help:"An absolute host directory shared read-write as the VM's workspace (/root/workspace) and its commands' working directory (not / or your home); default: the VM's own."`
	// WorkspaceMiB bounds what the workspace may take on the host; the
	// guest gets ENOSPC at the bound.
	WorkspaceMiB int `json:"workspace_mib,omitempty" name:"workspace-mib" help:"Bound on what the VM's workspace may take on the host, in MiB (default 16384); the guest gets ENOSPC at it."`
	// Config is the absolute path of a TOML file with the VM's [mcp] and
	// [net] policy and servers, in place of the user's user.toml
	// (corp.toml still applies); it is read again on every boot and
	// policy reload.
	Config string `json:"config,omitempty" name:"config" type:"path" help:"TOML with the VM's [mcp] and [net] policy and [[mcp.servers]], in place of $CAPSEM_HOME/user.toml (corp.toml still applies; read again on every boot and policy reload)."`
	// NoAutodetect keeps the mcpServers of Claude Code and Gemini CLI
	// settings out of this VM's gateway.
	NoAutodetect bool `json:"no_autodetect,omitempty" name:"no-autodetect" help:"Do not add the mcpServers of Claude Code and Gemini CLI settings to the VM's gateway."`
	// NoNetwork gives the VM no network interface at all.
	NoNetwork bool `json:"no_network,omitempty" name:"no-network" help:"Give the VM no network interface at all (by default it has one, behind the [net] policy)."`
	// NetMTU is the MTU of the VM's interface (0: the fastest, 65520).
	NetMTU int `json:"net_mtu,omitempty" name:"net-mtu" help:"MTU of the VM's network interface (default 65520, the fastest; 1280 to 65520)."`
	// Env is given to every command run in the VM.
	Env map[string]string `json:"env,omitempty" name:"env" short:"e" mapsep:"none" placeholder:"KEY=VALUE" mcphelp:"Environment variables for every command in the VM, {\"KEY\": \"VALUE\"}." help:"Environment variable for every command in the VM (repeatable)."`
	// Ports are published on the host at every start of the VM (a
	// persistent VM's resume too); a host port that is taken fails the
	// start.
	Ports []PortMapping `json:"ports,omitempty" name:"publish" short:"p" sep:"none" placeholder:"[ADDR:]HOST:GUEST" mcphelp:"Guest TCP ports to publish on the host at every start of the VM: [{\"host\": 8080, \"guest\": 3000}]; a host port that is taken fails the start." help:"Publish the guest's TCP port GUEST on the host's port HOST (repeatable), on loopback unless ADDR is given: 8080:3000, 0.0.0.0:8080:3000, [::1]:8080:3000. Again at every start."`
}

// Defaults and bounds of VMConfig.
const (
	DefaultCPUs         = 2
	MaxCPUs             = 64
	DefaultRAMMB        = 1024
	MinRAMMB            = 128
	MaxRAMMB            = 64 << 10
	DefaultDiskGB       = 8
	MaxDiskGB           = 4096
	DefaultBase         = BaseFull
	DefaultWorkspaceMiB = 16 << 10
	MinWorkspaceMiB     = 1
	MaxWorkspaceMiB     = 1 << 30 // 1 PiB: no bound a host could reach
	// MaxEnv bounds the variables of a VM's environment.
	MaxEnv = 256
)

// WithDefaults is c with every unset setting at its default and the
// current version.
func (c VMConfig) WithDefaults() VMConfig {
	c.Version = VMConfigVersion
	c.CPUs = cmp.Or(c.CPUs, DefaultCPUs)
	c.RAMMB = cmp.Or(c.RAMMB, DefaultRAMMB)
	if c.DiskGB == nil {
		c.DiskGB = new(DefaultDiskGB)
	}
	c.Base = cmp.Or(c.Base, DefaultBase)
	c.WorkspaceMiB = cmp.Or(c.WorkspaceMiB, DefaultWorkspaceMiB)
	c.Env = maps.Clone(c.Env)
	c.Ports = slices.Clone(c.Ports)
	for i, m := range c.Ports {
		c.Ports[i] = m.Normalized()
	}
	return c
}

// Disk is the disk size c asks for (DefaultDiskGB when unset).
func (c VMConfig) Disk() int {
	if c.DiskGB == nil {
		return DefaultDiskGB
	}
	return *c.DiskGB
}

// Check reports the first setting of c that no VM can have, naming it and
// what it may be. Unset settings are checked as their defaults. What needs
// the host to judge (the workspace directory, the policy file, the
// environment's names) is the service's and the process's to check.
func (c VMConfig) Check() error {
	d := c.WithDefaults()
	if c.Version > VMConfigVersion {
		return fmt.Errorf("config_version %d: this capsem reads up to %d (a newer capsem wrote it)", c.Version, VMConfigVersion)
	}
	switch {
	case d.CPUs < 1 || d.CPUs > MaxCPUs:
		return fmt.Errorf("cpus %d: want 1 to %d", d.CPUs, MaxCPUs)
	case d.RAMMB < MinRAMMB || d.RAMMB > MaxRAMMB:
		return fmt.Errorf("ram_mb %d (guest memory in MB): want %d to %d", d.RAMMB, MinRAMMB, MaxRAMMB)
	case *d.DiskGB < 0 || *d.DiskGB > MaxDiskGB:
		return fmt.Errorf("disk_gb %d (disk size in GB): want 0 (no disk) to %d", *d.DiskGB, MaxDiskGB)
	case d.Base != BaseFull && d.Base != BaseMinimal:
		return fmt.Errorf("base %q: want %q (Debian with the AI CLIs) or %q (busybox only)", d.Base, BaseFull, BaseMinimal)
	case d.Base != BaseMinimal && *d.DiskGB == 0:
		return fmt.Errorf("base %q needs a disk for what the VM writes: disk_gb 0 leaves only base %q", d.Base, BaseMinimal)
	case d.WorkspaceMiB < MinWorkspaceMiB || d.WorkspaceMiB > MaxWorkspaceMiB:
		return fmt.Errorf("workspace_mib %d (workspace bound in MiB): want %d to %d (0: the default, %d)", d.WorkspaceMiB, MinWorkspaceMiB, MaxWorkspaceMiB, DefaultWorkspaceMiB)
	case d.NetMTU != 0 && (d.NetMTU < vmm.MinMTU || d.NetMTU > vmm.MaxMTU):
		return fmt.Errorf("net_mtu %d: want 0 (the default) or %d to %d", d.NetMTU, vmm.MinMTU, vmm.MaxMTU)
	case d.NoNetwork && len(d.Ports) > 0:
		return fmt.Errorf("ports %s: the VM has no network (no_network)", d.Ports[0])
	case d.Workspace != "" && !strings.HasPrefix(d.Workspace, "/"):
		return fmt.Errorf("workspace %q: want an absolute path", d.Workspace)
	case d.Config != "" && !strings.HasPrefix(d.Config, "/"):
		return fmt.Errorf("config %q: want an absolute path (the service does not share the client's working directory)", d.Config)
	case len(d.Env) > MaxEnv:
		return fmt.Errorf("env has %d variables, more than %d", len(d.Env), MaxEnv)
	}
	for _, k := range slices.Sorted(maps.Keys(d.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(d.Env[k], "\x00") {
			return fmt.Errorf("env %q: a name must be non-empty without '=' or NUL, a value without NUL", k)
		}
	}
	return CheckPorts(c.Ports)
}
