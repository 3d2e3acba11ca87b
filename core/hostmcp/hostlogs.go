package hostmcp

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
)

// hostLogs are the host logs capsem_host_logs reads, by the only names it
// takes: never a path, so no argument can reach another file.
var hostLogs = map[string]func() (string, error){
	"service": paths.ServiceLog, // the service (JSON lines)
	"mcp":     paths.MCPLog,     // capsem mcp itself (JSON lines)
}

// Bounds of capsem_host_logs' answer.
const (
	defaultHostLogBytes = 64 << 10
	maxHostLogBytes     = 1 << 20
)

type (
	HostLogsIn struct {
		Name     string `json:"name" jsonschema:"which log: service (the capsem service) or mcp (this MCP server); a name, not a path"`
		Grep     string `json:"grep,omitempty" jsonschema:"keep only lines containing this text"`
		Tail     int    `json:"tail,omitempty" jsonschema:"only the last N lines (default 200)"`
		MaxBytes int    `json:"maxBytes,omitempty" jsonschema:"at most this many bytes, the last ones (default 65536, at most 1048576)"`
	}
	HostLogsOut struct {
		Name      string `json:"name"`
		Text      string `json:"text"`
		Truncated bool   `json:"truncated,omitempty" jsonschema:"lines were left out at the start to keep within maxBytes"`
	}
)

func hostLogNames() string { return strings.Join(slices.Sorted(maps.Keys(hostLogs)), ", ") }

func (t *tools) hostLogsTool(_ context.Context, _ *mcp.CallToolRequest, in HostLogsIn) (*mcp.CallToolResult, HostLogsOut, error) {
	where, ok := hostLogs[in.Name]
	if !ok {
		return nil, HostLogsOut{}, fmt.Errorf("log %q: want one of %s (a name, not a path)", in.Name, hostLogNames())
	}
	max := in.MaxBytes
	if max == 0 {
		max = defaultHostLogBytes
	}
	if max < 1 || max > maxHostLogBytes {
		return nil, HostLogsOut{}, fmt.Errorf("maxBytes %d: want 1 to %d", in.MaxBytes, maxHostLogBytes)
	}
	path, err := where()
	if err != nil {
		return nil, HostLogsOut{}, err
	}
	text, err := logs.Tail(path, in.Tail, in.Grep)
	if errors.Is(err, fs.ErrNotExist) {
		text, err = "", nil // nothing logged yet
	}
	if err != nil {
		return nil, HostLogsOut{}, err
	}
	out := HostLogsOut{Name: in.Name, Text: text}
	if len(text) > max {
		// Whole lines from the end.
		cut := text[len(text)-max:]
		if i := strings.IndexByte(cut, '\n'); i >= 0 && i+1 < len(cut) {
			cut = cut[i+1:]
		}
		out.Text, out.Truncated = cut, true
	}
	return nil, out, nil
}
