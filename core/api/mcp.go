package api

import (
	"encoding/json"
	"fmt"
	"slices"
)

// MCPCallRequest is one MCP request a host agent sends through a VM's
// gateway (RouteMCP, RouteVMMCP): the endpoint, policy and ledger a
// guest's call goes through, its row saying the host made it (transport
// "host", process_name HostCaller).
type MCPCallRequest struct {
	Method  string          `json:"method"`           // one of MCPCallMethods
	Params  json.RawMessage `json:"params,omitempty"` // the request's params, as MCP has them
	TraceID string          `json:"trace_id,omitempty"`
}

// MCPCallMethods are the requests a host agent may send: the catalog and
// the calls (initialize and the notifications belong to a session, which
// the host rail does not have).
var MCPCallMethods = []string{"tools/list", "tools/call", "resources/list", "resources/read", "prompts/list", "prompts/get", "ping"}

// HostCaller is the process_name of the host's calls in mcp_calls.
const HostCaller = "host"

// MaxMCPCallBytes bounds an MCP call's request and its answer on the host
// rail (a guest's frame is bounded lower; a host agent may move more).
const MaxMCPCallBytes = 16 << 20

// Check reports what makes r unusable, naming it.
func (r MCPCallRequest) Check() error {
	if !slices.Contains(MCPCallMethods, r.Method) {
		return fmt.Errorf("method %q: want one of %v", r.Method, MCPCallMethods)
	}
	if len(r.Params) > 0 && (!json.Valid(r.Params) || r.Params[0] != '{') {
		return fmt.Errorf("params: not a JSON object")
	}
	return CheckTraceID(r.TraceID)
}

// MCPCallResult is the answer: the JSON-RPC result, or its error.
type MCPCallResult struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  *MCPError       `json:"error,omitempty"`
}

// MCPError is a JSON-RPC error of the gateway or a server.
type MCPError struct {
	Code    int64  `json:"code"`
	Message string `json:"message"`
}

// MCPServer is a configured MCP server of a VM's gateway and its state.
type MCPServer struct {
	Name      string `json:"name"`
	Transport string `json:"transport"` // stdio | http
	Enabled   bool   `json:"enabled"`
	Connected bool   `json:"connected"`
	Error     string `json:"error,omitempty"`
	Tools     int    `json:"tools"`
	Resources int    `json:"resources"`
	Prompts   int    `json:"prompts"`
}

// MCPServersResult is a VM's gateway's servers (RouteMCPServers,
// RouteVMMCPServers).
type MCPServersResult struct {
	Servers []MCPServer `json:"servers"`
}
