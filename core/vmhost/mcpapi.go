package vmhost

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/endpoint"
	"github.com/capsem/capsem/core/jsonrpc"
)

// handleMCP runs one MCP request of the host's through the gateway's
// endpoint: the policy, the servers and the ledger a guest's call meets,
// its row saying the host made it.
func (v *VM) handleMCP(w http.ResponseWriter, r *http.Request) {
	var req api.MCPCallRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, api.MaxMCPCallBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("invalid request body: %w", err))
		return
	}
	if err := req.Check(); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	msg := &jsonrpc.Message{ID: json.RawMessage("1"), Method: req.Method, Params: req.Params}
	resp := v.gw.Endpoint.Handle(r.Context(), endpoint.CallMeta{Transport: "host", ProcessName: api.HostCaller, TraceID: req.TraceID,
		BytesIn: len(req.Params), MaxResponse: api.MaxMCPCallBytes}, msg)
	answer, err := jsonrpc.ParseResponse(resp)
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Errorf("the gateway's answer: %w", err))
		return
	}
	out := api.MCPCallResult{Result: answer.Result}
	if answer.Error != nil {
		out.Error = &api.MCPError{Code: answer.Error.Code, Message: answer.Error.Message}
	}
	writeJSON(w, http.StatusOK, out)
}

// handleMCPServers lists the gateway's servers and their state.
func (v *VM) handleMCPServers(w http.ResponseWriter, r *http.Request) {
	resp, err := v.gw.Aggregator.Do(r.Context(), &aggwire.Request{Method: aggwire.MethodListServers})
	if err == nil && resp.Error != "" {
		err = fmt.Errorf("%s", resp.Error)
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Errorf("the gateway's servers: %w", err))
		return
	}
	out := api.MCPServersResult{Servers: []api.MCPServer{}}
	for _, s := range resp.Servers {
		out.Servers = append(out.Servers, api.MCPServer{Name: s.Name, Transport: s.Transport, Enabled: s.Enabled, Connected: s.Connected,
			Error: s.Error, Tools: s.ToolCount, Resources: s.ResourceCount, Prompts: s.PromptCount})
	}
	writeJSON(w, http.StatusOK, out)
}
