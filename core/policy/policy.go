// Package policy decides, for every MCP request and every response that
// crosses the gateway, whether it is allowed, allowed with a warning, blocked,
// or (for responses) replaced. Evaluation is pure: no I/O.
package policy

import (
	"context"
	"encoding/json"
)

// Decision is the outcome of an evaluation.
type Decision int

const (
	Allow Decision = iota
	Warn
	Block
)

func (d Decision) String() string {
	switch d {
	case Warn:
		return "warn"
	case Block:
		return "block"
	default:
		return "allow"
	}
}

// Call describes one MCP request as the gateway understood it.
type Call struct {
	Method      string          // JSON-RPC method
	Server      string          // namespace of the target ("" for gateway-local methods)
	Name        string          // namespaced tool or prompt name
	URI         string          // namespaced resource URI
	Arguments   json.RawMessage // tools/call and prompts/get arguments, in full
	ProcessName string          // the guest process that sent it
}

// Verdict is what the hook returns.
type Verdict struct {
	Decision Decision
	Rule     string // which rule decided (for the ledger and the error message)
	Reason   string
	// Replace, when set on a response verdict that is not Block, is sent to the
	// caller instead of the server's result (redaction).
	Replace json.RawMessage
}

// Hook is called on every request before it is dispatched and on every
// response before it is returned: CheckResponse on a result, CheckError on
// a JSON-RPC error that answers a call.
type Hook interface {
	CheckRequest(ctx context.Context, call *Call) Verdict
	CheckResponse(ctx context.Context, call *Call, result json.RawMessage) Verdict
	CheckError(ctx context.Context, call *Call, message string, data json.RawMessage) Verdict
}

// Lister is implemented by hooks that hide list entries: a tool, prompt or
// resource that policy blocks whatever the arguments is not listed. The Call
// has the method that would use the entry (tools/call, prompts/get,
// resources/read) and its server, name or URI.
type Lister interface {
	Visible(ctx context.Context, call *Call) bool
}

// AllowAll allows everything; it is the hook until a policy is configured.
type AllowAll struct{}

func (AllowAll) CheckRequest(context.Context, *Call) Verdict { return Verdict{Rule: "default"} }
func (AllowAll) CheckResponse(context.Context, *Call, json.RawMessage) Verdict {
	return Verdict{Rule: "default"}
}
func (AllowAll) CheckError(context.Context, *Call, string, json.RawMessage) Verdict {
	return Verdict{Rule: "default"}
}

// Mode is stored in the ledger's policy_mode column.
const Mode = "enforce"
