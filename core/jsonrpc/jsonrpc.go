// Package jsonrpc parses and builds the JSON-RPC 2.0 messages that cross the
// MCP gateway. Unlike a general client library it keeps the request id as the
// exact JSON the caller sent (the gateway echoes it untouched, and the ledger
// stores it as text), and it reports every malformed message as a JSON-RPC
// error object that names the problem.
package jsonrpc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	sdk "github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/capsem/capsem/core/rawjson"
)

// Standard codes, from the MCP SDK, plus the server-defined timeout code.
const (
	CodeParseError     = sdk.CodeParseError
	CodeInvalidRequest = sdk.CodeInvalidRequest
	CodeMethodNotFound = sdk.CodeMethodNotFound
	CodeInvalidParams  = sdk.CodeInvalidParams
	CodeInternalError  = sdk.CodeInternalError
	// CodeTimeout is returned when the gateway's deadline for a call expires.
	CodeTimeout = -32000
)

// Error is a JSON-RPC error object.
type Error = sdk.Error

// NewError returns an error object with a formatted message.
func NewError(code int64, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Message is one parsed JSON-RPC message.
type Message struct {
	// ID is the raw JSON of the id, nil when absent. "null" is treated as
	// absent, as a request cannot be answered on a null id.
	ID     json.RawMessage
	Method string
	Params json.RawMessage
	Result json.RawMessage
	Error  *Error
}

// IsNotification reports whether the message carries no id.
func (m *Message) IsNotification() bool { return m.ID == nil }

type wire struct {
	JSONRPC *string         `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   *Error          `json:"error"`
}

// ParseRequest parses a request or notification. On failure it returns the
// error object to send back and, when it could be read, the id to send it on.
// Member names match exactly, as the MCP SDKs read them ("Method" is not
// "method"; encoding/json would take either), and where one repeats the last
// counts. Params is a slice of data; ID is a copy.
func ParseRequest(data []byte) (*Message, *Error, json.RawMessage) {
	trimmed := rawjson.TrimSpace(data)
	if len(trimmed) == 0 {
		return nil, NewError(CodeParseError, "parse error: empty message"), nil
	}
	if !json.Valid(trimmed) {
		var v any
		err := json.Unmarshal(trimmed, &v)
		return nil, NewError(CodeParseError, "parse error: %v", err), nil
	}
	switch trimmed[0] {
	case '{':
	case '[':
		return nil, NewError(CodeInvalidRequest, "batch requests are not supported"), nil
	default:
		return nil, NewError(CodeInvalidRequest, "invalid JSON-RPC request: not an object"), nil
	}
	// One pass over the members, skipping the values it does not keep (the
	// params may be large). The text is valid JSON, so the scan cannot fail.
	var version, rawID, rawMethod, params, rawError []byte
	rawjson.EachMember(trimmed, func(key, value []byte) {
		switch {
		case rawjson.KeyIs(key, "error"):
			rawError = value
		case rawjson.KeyIs(key, "jsonrpc"):
			version = value
		case rawjson.KeyIs(key, "id"):
			rawID = value
		case rawjson.KeyIs(key, "method"):
			rawMethod = value
		case rawjson.KeyIs(key, "params"):
			params = value
		}
	})
	id, idErr := normalizeID(rawID)
	if idErr != nil {
		return nil, idErr, nil
	}
	if !isNull(rawError) {
		// A request has no error member; like the MCP SDK, refuse one that
		// is not an error object rather than ignore it.
		var e Error
		if err := json.Unmarshal(rawError, &e); err != nil {
			return nil, NewError(CodeInvalidRequest, "invalid JSON-RPC request: error member: %v", err), id
		}
	}
	// The literal every client sends is compared without decoding (which
	// would allocate); anything else, escapes included, is decoded.
	if string(version) != `"2.0"` {
		if v, ok := rawjson.String(version); !ok || v != "2.0" {
			return nil, NewError(CodeInvalidRequest, "unsupported JSON-RPC version (want \"2.0\")"), id
		}
	}
	method, ok := rawjson.String(rawMethod)
	if !ok || method == "" {
		return nil, NewError(CodeInvalidRequest, "missing JSON-RPC method"), id
	}
	if isNull(params) {
		params = nil
	}
	if params != nil && params[0] != '{' && params[0] != '[' {
		return nil, NewError(CodeInvalidRequest, "invalid JSON-RPC request: params must be an object or array"), id
	}
	return &Message{ID: id, Method: method, Params: params}, nil, id
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// normalizeID accepts a string or a number and returns it compacted; null and
// absent both yield nil.
func normalizeID(raw json.RawMessage) (json.RawMessage, *Error) {
	raw = bytes.TrimSpace(raw)
	if isNull(raw) {
		return nil, nil
	}
	switch c := raw[0]; {
	case c == '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, NewError(CodeInvalidRequest, "invalid JSON-RPC id")
		}
		out, _ := json.Marshal(s)
		return out, nil
	case c == '-' || (c >= '0' && c <= '9'):
		return append(json.RawMessage(nil), raw...), nil
	default:
		return nil, NewError(CodeInvalidRequest, "invalid JSON-RPC id: must be a string or a number")
	}
}

// IDText renders an id for storage: strings verbatim, numbers as their JSON
// text, absent as "".
func IDText(id json.RawMessage) string {
	if len(id) == 0 {
		return ""
	}
	if id[0] == '"' {
		var s string
		if json.Unmarshal(id, &s) == nil {
			return s
		}
	}
	return string(id)
}

// ParseResponse parses a response (result or error) as sent by a server.
func ParseResponse(data []byte) (*Message, error) {
	var w wire
	if err := json.Unmarshal(data, &w); err != nil {
		return nil, fmt.Errorf("invalid JSON-RPC response: %w", err)
	}
	if w.JSONRPC == nil || *w.JSONRPC != "2.0" {
		return nil, fmt.Errorf("invalid JSON-RPC response: version must be \"2.0\"")
	}
	id, idErr := normalizeID(w.ID)
	if idErr != nil {
		return nil, fmt.Errorf("invalid JSON-RPC response: %s", idErr.Message)
	}
	if w.Error == nil && w.Result == nil {
		return nil, fmt.Errorf("invalid JSON-RPC response: neither result nor error")
	}
	var method string
	_ = json.Unmarshal(w.Method, &method)
	return &Message{ID: id, Method: method, Result: w.Result, Error: w.Error}, nil
}

// ResultResponse builds a success response. A nil id is sent as null.
func ResultResponse(id, result json.RawMessage) []byte {
	if len(result) == 0 {
		result = json.RawMessage("{}")
	}
	b := make([]byte, 0, len(result)+len(id)+40)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = appendID(b, id)
	b = append(b, `,"result":`...)
	b = append(b, result...)
	return append(b, '}')
}

// ErrorResponse builds an error response. A nil id is sent as null.
func ErrorResponse(id json.RawMessage, e *Error) []byte {
	eb, err := json.Marshal(e)
	if err != nil {
		eb = []byte(`{"code":` + strconv.FormatInt(CodeInternalError, 10) + `,"message":"unencodable error"}`)
	}
	b := make([]byte, 0, len(eb)+len(id)+40)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = appendID(b, id)
	b = append(b, `,"error":`...)
	b = append(b, eb...)
	return append(b, '}')
}

func appendID(b []byte, id json.RawMessage) []byte {
	if len(id) == 0 {
		return append(b, "null"...)
	}
	return append(b, id...)
}
