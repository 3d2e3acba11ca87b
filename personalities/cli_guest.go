//go:build capsem_guest

package personalities

import (
	"github.com/capsem/capsem/personalities/agent"
	"github.com/capsem/capsem/personalities/guestdoctor"
	"github.com/capsem/capsem/personalities/relay"
)

// CLI is the guest build's grammar (go build -tags capsem_guest, the
// CGO_ENABLED=0 bin/capsem-guest that becomes the VM's /init): only the
// personalities that run inside a VM. Leaving the host's out (gateway,
// aggregator, per-VM process, image builder and their MCP SDK, HTTP and
// SQLite code) takes the binary from 14 to 6 MB, and PID 1 starts ~65 ms sooner
// under TCG.
type CLI struct {
	LogLevel  string `name:"log-level" env:"CAPSEM_LOG_LEVEL" default:"info" enum:"debug,info,warn,error" help:"Log level."`
	LogFormat string `name:"log-format" default:"auto" enum:"auto,text,json" help:"Log lines on stderr: short text for people (auto: when stderr is a terminal) or JSON."`

	Version     VersionCmd      `cmd:"" help:"Print the version."`
	MCPRelay    relay.Cmd       `cmd:"" name:"mcp-relay" help:"The stdio MCP relay to the gateway (also installed as capsem-mcp-server)."`
	GuestDoctor guestdoctor.Cmd `cmd:"" name:"guest-doctor" help:"Check this VM's health (also installed as capsem-doctor)."`
	Agent       agent.Cmd       `cmd:"" hidden:"" help:"Internal: the guest agent (PID 1 in the VM, installed as /init)."`
}
