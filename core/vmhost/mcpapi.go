package vmhost

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/endpoint"
	"github.com/capsem/capsem/core/jsonrpc"
)

// mcpCall runs one MCP request of the host's through the gateway's
// endpoint: the policy, the servers and the ledger a guest's call meets,
// its row saying the host made it.
func (v *VM) mcpCall(ctx context.Context, _ string, req api.MCPCallRequest) (api.MCPCallResult, error) {
	if err := req.Check(); err != nil {
		return api.MCPCallResult{}, &refusal{status: http.StatusBadRequest, err: err}
	}
	msg := &jsonrpc.Message{ID: json.RawMessage("1"), Method: req.Method, Params: req.Params}
	resp := v.gw.Endpoint.Handle(ctx, endpoint.CallMeta{Transport: "host", ProcessName: api.HostCaller, TraceID: req.TraceID,
		BytesIn: len(req.Params), MaxResponse: api.MaxMCPCallBytes}, msg)
	answer, err := jsonrpc.ParseResponse(resp)
	if err != nil {
		return api.MCPCallResult{}, &refusal{status: http.StatusBadGateway, err: fmt.Errorf("the gateway's answer: %w", err)}
	}
	out := api.MCPCallResult{Result: answer.Result}
	if answer.Error != nil {
		out.Error = &api.MCPError{Code: answer.Error.Code, Message: answer.Error.Message}
	}
	return out, nil
}

// mcpServers lists the gateway's servers with their status and counts.
func (v *VM) mcpServers(ctx context.Context, _ string, _ api.None) (api.MCPServersResult, error) {
	resp, err := v.gw.Aggregator.Do(ctx, &aggwire.Request{Method: aggwire.MethodListServers})
	if err == nil && resp.Error != "" {
		err = fmt.Errorf("%s", resp.Error)
	}
	if err != nil {
		return api.MCPServersResult{}, &refusal{status: http.StatusBadGateway, err: fmt.Errorf("the gateway's servers: %w", err)}
	}
	out := api.MCPServersResult{Servers: []api.MCPServer{}}
	for _, s := range resp.Servers {
		out.Servers = append(out.Servers, api.MCPServer{Name: s.Name, Transport: s.Transport, Enabled: s.Enabled, Connected: s.Connected,
			Error: s.Error, Tools: s.ToolCount, Resources: s.ResourceCount, Prompts: s.PromptCount})
	}
	return out, nil
}
