//go:build !capsem_guest

package personalities

import (
	"github.com/capsem/capsem/personalities/agent"
	"github.com/capsem/capsem/personalities/aggregator"
	"github.com/capsem/capsem/personalities/builtin"
	"github.com/capsem/capsem/personalities/doctor"
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

// CLI is the grammar shared by subcommands and symlink names: every
// personality (the host build; the guest build is cli_guest.go).
type CLI struct {
	LogLevel string `name:"log-level" env:"CAPSEM_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level."`

	Version       VersionCmd      `cmd:"" help:"Print the version."`
	Run           run.Cmd         `cmd:"" help:"Boot an ephemeral VM, run a command in it, and remove the VM."`
	MCP           mcphost.Cmd     `cmd:"" name:"mcp" help:"The MCP server AI agents on the host register (stdio): sandboxes as tools, through the service."`
	Service       service.Cmd     `cmd:"" help:"The service that owns your VMs (capsem service start|stop|status; alone: serve in the foreground)."`
	Image         image.Cmd       `cmd:"" help:"Build the guest boot assets."`
	Doctor        doctor.Cmd      `cmd:"" help:"Check whether capsem works on this host, and how to fix what does not."`
	Gateway       gateway.Cmd     `cmd:"" help:"Run the MCP gateway on a Unix socket (policy, aggregator, ledger)."`
	MCPRelay      relay.Cmd       `cmd:"" name:"mcp-relay" help:"The stdio MCP relay to the gateway (also installed as capsem-mcp-server)."`
	Policy        policycmd.Cmd   `cmd:"" help:"Inspect, explain and reload the MCP policy."`
	MCPAggregator aggregator.Cmd  `cmd:"" name:"mcp-aggregator" hidden:"" help:"Internal: the sandboxed MCP aggregator."`
	MCPBuiltin    builtin.Cmd     `cmd:"" name:"mcp-builtin" hidden:"" help:"Internal: the builtin MCP tool server."`
	Process       process.Cmd     `cmd:"" hidden:"" help:"Internal: the per-VM process."`
	Agent         agent.Cmd       `cmd:"" hidden:"" help:"Internal: the guest agent (PID 1 in the VM, installed as /init)."`
	GuestDoctor   guestdoctor.Cmd `cmd:"" name:"guest-doctor" hidden:"" help:"Inside a VM: check its health (installed there as capsem-doctor)."`
}
