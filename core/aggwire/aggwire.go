// Package aggwire holds the messages exchanged between the MCP endpoint (in
// the gateway or per-VM process) and the mcp-aggregator child: frames of
// [u32 BE length][msgpack] on the child's stdin and stdout. Results that are
// MCP JSON travel as raw JSON bytes so the aggregator never reinterprets them.
//
// The msgp code in aggwire_gen.go is generated (make generate) and committed.
package aggwire

//go:generate go tool msgp -file aggwire.go -o aggwire_gen.go -tests=false

// ProtocolVersion is bumped on any incompatible change to these messages.
const ProtocolVersion = 1

// Methods of a Request.
const (
	MethodInit          = "init"           // Servers, Version: connect and report back
	MethodListServers   = "list_servers"   // -> Servers status
	MethodListTools     = "list_tools"     // -> Tools
	MethodListResources = "list_resources" // -> Resources
	MethodListPrompts   = "list_prompts"   // -> Prompts
	MethodCallTool      = "call_tool"      // Name, Arguments -> Result
	MethodReadResource  = "read_resource"  // URI -> Result
	MethodGetPrompt     = "get_prompt"     // Name, Arguments -> Result
	MethodRefresh       = "refresh"        // Servers: reconnect with new definitions
	MethodCancel        = "cancel"         // Target: cancel an in-flight request
	MethodShutdown      = "shutdown"
)

// Error codes in Response.Code, JSON-RPC style.
const (
	CodeInvalidParams = -32602 // unknown server/tool/resource/prompt, bad name
	CodeUpstream      = -32603 // the server failed or returned an error
	CodeCancelled     = -32800
)

// ServerDef describes one external MCP server.
type ServerDef struct {
	Name    string            `msg:"name"`
	Command string            `msg:"command,omitempty"` // set: stdio transport
	Args    []string          `msg:"args,omitempty"`
	Env     map[string]string `msg:"env,omitempty"`
	URL     string            `msg:"url,omitempty"` // set: streamable HTTP transport
	Headers map[string]string `msg:"headers,omitempty"`
	Enabled bool              `msg:"enabled"`
	// Builtin marks the server the endpoint itself defines (capsem mcp-builtin);
	// only it may use the reserved name "builtin".
	Builtin bool `msg:"builtin,omitempty"`
	// ConnectTimeoutMS bounds connect + initialize + catalog listing.
	ConnectTimeoutMS int64 `msg:"connect_timeout_ms,omitempty"`
	// ReadPaths (read and execute) and WritePaths (read, write, create)
	// are what a stdio server's own sandbox grants beyond the defaults; no
	// other server is granted them.
	ReadPaths  []string `msg:"read_paths,omitempty"`
	WritePaths []string `msg:"write_paths,omitempty"`
}

// ServerStatus reports one server's connection state.
type ServerStatus struct {
	Name          string `msg:"name"`
	Transport     string `msg:"transport"` // stdio | http
	Enabled       bool   `msg:"enabled"`
	Connected     bool   `msg:"connected"`
	Error         string `msg:"error,omitempty"`
	ToolCount     int    `msg:"tool_count"`
	ResourceCount int    `msg:"resource_count"`
	PromptCount   int    `msg:"prompt_count"`
}

// Annotations are the MCP tool hints.
type Annotations struct {
	Title           string `msg:"title,omitempty"`
	ReadOnlyHint    bool   `msg:"read_only_hint"`
	DestructiveHint bool   `msg:"destructive_hint"`
	IdempotentHint  bool   `msg:"idempotent_hint"`
	OpenWorldHint   bool   `msg:"open_world_hint"`
}

// Tool is one namespaced tool.
type Tool struct {
	Name         string       `msg:"name"` // server__tool
	OriginalName string       `msg:"original_name"`
	Server       string       `msg:"server"`
	Title        string       `msg:"title,omitempty"`
	Description  string       `msg:"description,omitempty"`
	InputSchema  []byte       `msg:"input_schema,omitempty"`  // JSON
	OutputSchema []byte       `msg:"output_schema,omitempty"` // JSON
	Annotations  *Annotations `msg:"annotations,omitempty"`
}

// Resource is one namespaced resource (capsem://server/original-uri).
type Resource struct {
	URI         string `msg:"uri"`
	OriginalURI string `msg:"original_uri"`
	Server      string `msg:"server"`
	Name        string `msg:"name,omitempty"`
	Title       string `msg:"title,omitempty"`
	Description string `msg:"description,omitempty"`
	MIMEType    string `msg:"mime_type,omitempty"`
}

// Prompt is one namespaced prompt.
type Prompt struct {
	Name         string `msg:"name"` // server__prompt
	OriginalName string `msg:"original_name"`
	Server       string `msg:"server"`
	Title        string `msg:"title,omitempty"`
	Description  string `msg:"description,omitempty"`
	Arguments    []byte `msg:"arguments,omitempty"` // JSON array
}

// NetEvent is an HTTP attempt made by the builtin server on behalf of a call.
type NetEvent struct {
	TimestampUnixNano int64  `msg:"ts"`
	Domain            string `msg:"domain"`
	Port              int    `msg:"port"`
	Method            string `msg:"method"`
	Path              string `msg:"path"`
	Query             string `msg:"query,omitempty"`
	StatusCode        int    `msg:"status_code"`
	BytesSent         int64  `msg:"bytes_sent"`
	BytesReceived     int64  `msg:"bytes_received"`
	DurationMS        int64  `msg:"duration_ms"`
	Decision          string `msg:"decision"`
	MatchedRule       string `msg:"matched_rule,omitempty"`
	Error             string `msg:"error,omitempty"`
	IP                string `msg:"ip,omitempty"` // the address reached or refused
}

// Request is sent by the endpoint. ID is unique per aggregator process.
type Request struct {
	ID        uint64      `msg:"id"`
	Method    string      `msg:"method"`
	Version   int         `msg:"version,omitempty"` // init only
	Servers   []ServerDef `msg:"servers,omitempty"`
	Name      string      `msg:"name,omitempty"`
	URI       string      `msg:"uri,omitempty"`
	Arguments []byte      `msg:"arguments,omitempty"` // JSON object
	Target    uint64      `msg:"target,omitempty"`    // cancel
}

// Response answers the Request with the same ID.
type Response struct {
	ID        uint64         `msg:"id"`
	Error     string         `msg:"error,omitempty"`
	Code      int            `msg:"code,omitempty"`
	Version   int            `msg:"version,omitempty"`
	Servers   []ServerStatus `msg:"servers,omitempty"`
	Tools     []Tool         `msg:"tools,omitempty"`
	Resources []Resource     `msg:"resources,omitempty"`
	Prompts   []Prompt       `msg:"prompts,omitempty"`
	Result    []byte         `msg:"result,omitempty"` // JSON
	NetEvents []NetEvent     `msg:"net_events,omitempty"`
}
