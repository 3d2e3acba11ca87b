// Command echoserver is the benchmark's stdio MCP server: one `echo` tool,
// served by a single loop that reads newline-delimited JSON-RPC from stdin
// and answers on stdout, flushing when no further request is already
// buffered. It does as little per call as an MCP server can, so the
// gateway benchmark's figures are the gateway's, not a heavy server's
// competing for the same cores. (testdata/mcpecho, on the MCP SDK's server,
// is the test peer with more tools.)
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
)

// protocolVersions are the revisions it speaks, newest first.
var protocolVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

type request struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

type response struct {
	JSONRPC string    `json:"jsonrpc"`
	ID      any       `json:"id"`
	Result  any       `json:"result,omitempty"`
	Error   *rpcError `json:"error,omitempty"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type text struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

var echoTool = map[string]any{
	"name":        "echo",
	"description": "Echo the text back.",
	"inputSchema": map[string]any{
		"type":       "object",
		"properties": map[string]any{"text": map[string]any{"type": "string", "description": "text to echo back"}},
		"required":   []string{"text"},
	},
	"annotations": map[string]any{"readOnlyHint": true, "openWorldHint": false},
}

func main() {
	if err := serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "echoserver:", err)
		os.Exit(1)
	}
}

func serve(in io.Reader, out io.Writer) error {
	r := bufio.NewReaderSize(in, 64<<10)
	w := bufio.NewWriterSize(out, 64<<10)
	enc := json.NewEncoder(w)
	for {
		line, err := r.ReadSlice('\n')
		if err == io.EOF {
			return w.Flush()
		}
		if err != nil {
			return fmt.Errorf("reading a request: %w", err)
		}
		var req request
		if err := json.Unmarshal(line, &req); err != nil {
			return fmt.Errorf("request is not JSON-RPC: %w", err)
		}
		if len(req.ID) == 0 {
			continue // a notification
		}
		resp := answer(&req)
		resp.JSONRPC, resp.ID = "2.0", req.ID
		if err := enc.Encode(resp); err != nil {
			return fmt.Errorf("writing an answer: %w", err)
		}
		// Requests already read are answered in the same write.
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return fmt.Errorf("writing an answer: %w", err)
			}
		}
	}
}

func answer(req *request) *response {
	switch req.Method {
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(req.Params, &p)
		version := protocolVersions[0]
		if slices.Contains(protocolVersions, p.ProtocolVersion) {
			version = p.ProtocolVersion
		}
		return &response{Result: map[string]any{
			"protocolVersion": version,
			"capabilities":    map[string]any{"tools": map[string]any{}},
			"serverInfo":      map[string]any{"name": "echoserver", "version": "1"},
		}}
	case "ping":
		return &response{Result: struct{}{}}
	case "tools/list":
		return &response{Result: map[string]any{"tools": []any{echoTool}}}
	case "tools/call":
		var p struct {
			Name      string `json:"name"`
			Arguments struct {
				Text string `json:"text"`
			} `json:"arguments"`
		}
		if err := json.Unmarshal(req.Params, &p); err != nil {
			return &response{Error: &rpcError{Code: -32602, Message: "invalid params: " + err.Error()}}
		}
		if p.Name != "echo" {
			return &response{Error: &rpcError{Code: -32602, Message: fmt.Sprintf("unknown tool %q", p.Name)}}
		}
		return &response{Result: map[string]any{"content": []text{{Type: "text", Text: p.Arguments.Text}}}}
	default:
		return &response{Error: &rpcError{Code: -32601, Message: "method not found: " + req.Method}}
	}
}
