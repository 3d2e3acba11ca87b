package hostmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
)

// The policed MCP tools: a host agent sees and calls a VM's MCP servers
// through that VM's gateway, its policy and its ledger, as a guest's agent
// would (the rows say the host made the calls).
type (
	MCPServersIn struct {
		ID string `json:"id" jsonschema:"the running VM's id or name"`
	}
	MCPServersOut struct {
		Servers []MCPServerOut `json:"servers"`
	}
	MCPServerOut struct {
		Name      string `json:"name"`
		Transport string `json:"transport" jsonschema:"stdio or http"`
		Enabled   bool   `json:"enabled"`
		Connected bool   `json:"connected"`
		Error     string `json:"error,omitempty" jsonschema:"why it is not connected"`
		Tools     int    `json:"tools"`
		Resources int    `json:"resources"`
		Prompts   int    `json:"prompts"`
	}
	MCPToolsIn struct {
		ID     string `json:"id" jsonschema:"the running VM's id or name"`
		Server string `json:"server,omitempty" jsonschema:"only this server's tools"`
	}
	MCPToolsOut struct {
		Tools []MCPToolOut `json:"tools" jsonschema:"the tools the VM's policy lets its agents see"`
	}
	MCPToolOut struct {
		Name        string         `json:"name" jsonschema:"namespaced: <server>__<tool>, as capsem_mcp_call takes it"`
		Description string         `json:"description,omitempty"`
		InputSchema map[string]any `json:"inputSchema,omitempty"`
	}
	MCPCallIn struct {
		ID      string         `json:"id" jsonschema:"the running VM's id or name"`
		Name    string         `json:"name" jsonschema:"the namespaced tool: <server>__<tool> (capsem_mcp_tools lists them)"`
		Args    map[string]any `json:"args,omitempty" jsonschema:"the tool's arguments, a JSON object"`
		TraceID string         `json:"traceId,omitempty" jsonschema:"ties the call's ledger row to a trace (capsem_timeline)"`
	}
	MCPCallOut struct {
		IsError           bool           `json:"isError,omitempty" jsonschema:"the tool itself reported an error"`
		Content           []any          `json:"content,omitempty" jsonschema:"the tool's result content, as MCP has it"`
		StructuredContent map[string]any `json:"structuredContent,omitempty"`
	}
)

// mcpService is what the policed MCP tools need of the service.
type mcpService interface {
	MCP(ctx context.Context, vm string, req api.MCPCallRequest) (api.MCPCallResult, error)
	MCPServers(ctx context.Context, vm string) (api.MCPServersResult, error)
}

func (t *tools) registerMCPTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_mcp_servers", Annotations: readOnly, Description: "The MCP servers a running VM's gateway is configured with: connected or not (and why), and how many tools, resources and prompts each offers."}, t.mcpServers)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_mcp_tools", Annotations: readOnly, Description: "The tools a running VM's agents see through its gateway (what its policy hides is left out), namespaced <server>__<tool>, with their input schemas; server keeps one server's."}, t.mcpTools)
	mcp.AddTool(s, &mcp.Tool{Name: "capsem_mcp_call", Annotations: changes, Description: "Call a tool of a running VM's MCP servers through its gateway, as its agents would: the VM's policy decides, and the call is a row of its ledger (mcp_calls, transport host). " +
		"name is namespaced <server>__<tool>; an unknown server or tool, or a call the policy blocks, is an error saying so."}, t.mcpCall)
}

func (t *tools) mcpServers(ctx context.Context, _ *mcp.CallToolRequest, in MCPServersIn) (*mcp.CallToolResult, MCPServersOut, error) {
	r, err := t.svc.MCPServers(ctx, in.ID)
	if err != nil {
		return nil, MCPServersOut{}, err
	}
	out := MCPServersOut{Servers: []MCPServerOut{}}
	for _, s := range r.Servers {
		out.Servers = append(out.Servers, MCPServerOut(s))
	}
	return nil, out, nil
}

// gateway sends one request through the VM's gateway and returns its
// result, a gateway's or server's error as an error.
func (t *tools) gateway(ctx context.Context, vm string, req api.MCPCallRequest) (json.RawMessage, error) {
	r, err := t.svc.MCP(ctx, vm, req)
	if err != nil {
		return nil, err
	}
	if r.Error != nil {
		return nil, fmt.Errorf("%s (JSON-RPC error %d)", r.Error.Message, r.Error.Code)
	}
	return r.Result, nil
}

func (t *tools) mcpTools(ctx context.Context, _ *mcp.CallToolRequest, in MCPToolsIn) (*mcp.CallToolResult, MCPToolsOut, error) {
	raw, err := t.gateway(ctx, in.ID, api.MCPCallRequest{Method: "tools/list"})
	if err != nil {
		return nil, MCPToolsOut{}, err
	}
	var list struct {
		Tools []MCPToolOut `json:"tools"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, MCPToolsOut{}, fmt.Errorf("the gateway's tools/list: %w", err)
	}
	out := MCPToolsOut{Tools: []MCPToolOut{}}
	for _, tool := range list.Tools {
		if in.Server == "" || strings.HasPrefix(tool.Name, in.Server+"__") {
			out.Tools = append(out.Tools, tool)
		}
	}
	return nil, out, nil
}

func (t *tools) mcpCall(ctx context.Context, _ *mcp.CallToolRequest, in MCPCallIn) (*mcp.CallToolResult, MCPCallOut, error) {
	if server, tool, ok := strings.Cut(in.Name, "__"); !ok || server == "" || tool == "" {
		return nil, MCPCallOut{}, fmt.Errorf("name %q is not namespaced as <server>__<tool> (capsem_mcp_tools lists them)", in.Name)
	}
	args := in.Args
	if args == nil {
		args = map[string]any{}
	}
	params, err := json.Marshal(map[string]any{"name": in.Name, "arguments": args})
	if err != nil {
		return nil, MCPCallOut{}, err
	}
	raw, err := t.gateway(ctx, in.ID, api.MCPCallRequest{Method: "tools/call", Params: params, TraceID: in.TraceID})
	if err != nil {
		return nil, MCPCallOut{}, err
	}
	var out MCPCallOut
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, MCPCallOut{}, errors.New("the tool's result is not an MCP tool result")
	}
	return nil, out, nil
}
