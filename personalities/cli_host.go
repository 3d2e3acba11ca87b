//go:build !capsem_guest

package personalities

import (
	"github.com/capsem/capsem/personalities/agent"
	"github.com/capsem/capsem/personalities/aggregator"
	"github.com/capsem/capsem/personalities/builtin"
	"github.com/capsem/capsem/personalities/cli"
	"github.com/capsem/capsem/personalities/doctor"
	"github.com/capsem/capsem/personalities/envcmd"
	"github.com/capsem/capsem/personalities/gateway"
	"github.com/capsem/capsem/personalities/guestdoctor"
	"github.com/capsem/capsem/personalities/image"
	"github.com/capsem/capsem/personalities/mcphost"
	"github.com/capsem/capsem/personalities/policycmd"
	"github.com/capsem/capsem/personalities/process"
	"github.com/capsem/capsem/personalities/relay"
	"github.com/capsem/capsem/personalities/run"
	"github.com/capsem/capsem/personalities/service"
)

// ImageCmd is `capsem image`: the build of the guest's assets, and the
// images forks make. It has no Run of its own: kong runs every Run method
// from the selected subcommand up to the root.
type ImageCmd struct {
	Build image.BuildCmd   `cmd:"" help:"Build the guest kernel, the minimal root and the root images from their recipes (cached in one store; rebuilt only when inputs change)."`
	Ls    cli.ImageLsCmd   `cmd:"" help:"List the images forks made."`
	Info  cli.ImageInfoCmd `cmd:"" help:"Describe an image."`
	Rm    cli.ImageRmCmd   `cmd:"" help:"Delete images (refused for one VMs were made from)."`
}

// CLI is the grammar shared by subcommands and symlink names: every
// personality (the host build; the guest build is cli_guest.go).
type CLI struct {
	LogLevel  string `name:"log-level" env:"CAPSEM_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level."`
	LogFormat string `name:"log-format" default:"auto" enum:"auto,text,json" help:"Log lines on stderr: short text for people (auto: when stderr is a terminal) or JSON."`

	Version       VersionCmd         `cmd:"" help:"Print the version."`
	Run           run.Cmd            `cmd:"" help:"Boot an ephemeral VM, run a command in it, and remove the VM."`
	Create        cli.CreateCmd      `cmd:"" group:"VMs" help:"Boot a VM (named: persistent) and print its id."`
	Exec          cli.ExecCmd        `cmd:"" group:"VMs" help:"Run a command in a VM, streaming its output; exit with its status."`
	Shell         cli.ShellCmd       `cmd:"" group:"VMs" help:"An interactive shell in a VM, on this terminal."`
	Ls            cli.LsCmd          `cmd:"" group:"VMs" help:"List the VMs."`
	Info          cli.InfoCmd        `cmd:"" group:"VMs" help:"Describe a VM."`
	Stop          cli.StopCmd        `cmd:"" group:"VMs" help:"Stop a VM (persistent: kept for resume; ephemeral: removed)."`
	Resume        cli.ResumeCmd      `cmd:"" group:"VMs" help:"Boot a stopped persistent VM again."`
	Suspend       cli.SuspendCmd     `cmd:"" group:"VMs" help:"Save a running persistent VM's whole state (memory, processes) and stop it; resume carries on from there."`
	Persist       cli.PersistCmd     `cmd:"" group:"VMs" help:"Name a running ephemeral VM, making it persistent."`
	Rm            cli.RmCmd          `cmd:"" group:"VMs" help:"Destroy VMs and all their state."`
	Purge         cli.PurgeCmd       `cmd:"" group:"VMs" help:"Destroy every ephemeral VM (--all: every VM)."`
	Logs          cli.LogsCmd        `cmd:"" group:"VMs" help:"A VM's serial console and process log (or --service)."`
	Inspect       cli.InspectCmd     `cmd:"" group:"VMs" help:"Run read-only SQL on a VM's session.db."`
	Timeline      cli.TimelineCmd    `cmd:"" group:"VMs" help:"A VM's ledger as one stream in time order: commands, MCP calls, DNS, connections, model calls, files."`
	Cp            cli.CpCmd          `cmd:"" group:"VMs" help:"Copy a file into or out of a VM (VM:PATH)."`
	PortForward   cli.PortForwardCmd `cmd:"" name:"port-forward" group:"VMs" help:"Publish a guest TCP port on the host while the VM runs ([ADDR:]HOST:GUEST, loopback unless ADDR is given)."`
	MCP           mcphost.Cmd        `cmd:"" name:"mcp" help:"The MCP server AI agents on the host register (stdio, or streamable HTTP with --http): sandboxes as tools, through the service."`
	Service       service.Cmd        `cmd:"" help:"The service that owns your VMs (capsem service start|stop|status; alone: serve in the foreground)."`
	Fork          cli.ForkCmd        `cmd:"" group:"VMs" help:"Make an image of a running or stopped VM: a template to create VMs from (capsem create --image NAME)."`
	Image         ImageCmd           `cmd:"" help:"Build the guest boot assets; list, describe and delete the images forks make."`
	Doctor        doctor.Cmd         `cmd:"" help:"Check whether capsem works on this host, and how to fix what does not."`
	Env           envcmd.Cmd         `cmd:"" help:"List the CAPSEM_* environment settings: what each means and its value here."`
	Gateway       gateway.Cmd        `cmd:"" help:"Run the MCP gateway on a Unix socket (policy, aggregator, ledger)."`
	MCPRelay      relay.Cmd          `cmd:"" name:"mcp-relay" help:"The stdio MCP relay to the gateway (also installed as capsem-mcp-server)."`
	Policy        policycmd.Cmd      `cmd:"" help:"Inspect, explain and reload the MCP and network policy."`
	MCPAggregator aggregator.Cmd     `cmd:"" name:"mcp-aggregator" hidden:"" help:"Internal: the sandboxed MCP aggregator."`
	MCPBuiltin    builtin.Cmd        `cmd:"" name:"mcp-builtin" hidden:"" help:"Internal: the builtin MCP tool server."`
	Process       process.Cmd        `cmd:"" hidden:"" help:"Internal: the per-VM process."`
	Agent         agent.Cmd          `cmd:"" hidden:"" help:"Internal: the guest agent (PID 1 in the VM, installed as /init)."`
	GuestDoctor   guestdoctor.Cmd    `cmd:"" name:"guest-doctor" hidden:"" help:"Inside a VM: check its health (installed there as capsem-doctor)."`
}
