package ledger

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// MaxFieldBytes caps every TEXT value written to the ledger (previews,
// messages, names). One oversized tool result must not balloon session.db or
// the memory of whoever reads it back.
const MaxFieldBytes = 256 << 10

// TimeLayout is the layout of every timestamp column: RFC 3339 in UTC with a
// fixed nine-digit fraction. time.RFC3339Nano drops trailing zeros, which
// breaks the lexical order that the timestamp indexes and ORDER BY rely on
// ("…05.1Z" would sort after "…05.12Z").
const TimeLayout = "2006-01-02T15:04:05.000000000Z07:00"

// CapField returns s cut to at most MaxFieldBytes bytes without splitting a
// UTF-8 sequence: a valid UTF-8 input always yields a valid UTF-8 prefix.
func CapField(s string) string { return capString(s, MaxFieldBytes) }

func capString(s string, limit int) string {
	if limit < 0 {
		limit = 0
	}
	if len(s) <= limit {
		return s
	}
	cut := limit
	// s[cut] is the first byte dropped. If it continues a sequence, step back
	// to the sequence's lead byte so the whole rune goes. A valid sequence has
	// at most UTFMax-1 continuation bytes, so the walk is bounded even for
	// invalid input (whose stray bytes are not runes and may be cut anywhere).
	for i := 0; i < utf8.UTFMax-1 && cut > 0 && !utf8.RuneStart(s[cut]); i++ {
		cut--
	}
	return s[:cut]
}

// NewEventID returns 12 lowercase hex digits from 6 random bytes, the
// event_id format of every ledger table.
func NewEventID() string {
	var b [6]byte
	// crypto/rand.Read never returns an error (it crashes the program on an
	// unusable entropy source, since Go 1.24).
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validEventID(s string) bool {
	if len(s) != 12 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// RequestIDText renders a JSON-RPC id for the request_id column: a string id
// verbatim (decoded), a number as its JSON text, and an absent or null id
// (a notification) as "", which is stored as NULL.
func RequestIDText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			return s
		}
	}
	return string(raw)
}

// Decision is the outcome recorded in mcp_calls.decision.
type Decision string

// The values the mcp_calls.decision CHECK constraint accepts.
const (
	DecisionAllowed Decision = "allowed"
	DecisionWarned  Decision = "warned"
	DecisionDenied  Decision = "denied"
	DecisionError   Decision = "error"
)

// Valid reports whether d is one of the four decisions.
func (d Decision) Valid() bool {
	switch d {
	case DecisionAllowed, DecisionWarned, DecisionDenied, DecisionError:
		return true
	}
	return false
}

// Row is one ledger row: *MCPCall, *NetEvent, *ExecEvent, *FSEvent or
// *ModelCall. The interface is sealed so that every row has a table and a
// validated column list.
//
// Conventions shared by all row types: an empty EventID is replaced by
// NewEventID() and a zero Timestamp by the current time, on the caller's
// struct before the row is queued, so the caller can correlate the row
// afterwards. Empty optional strings are stored as NULL, nil *int64 as NULL,
// other integers verbatim, and every string is cut with CapField.
type Row interface {
	table() tableID
	// fill applies defaults and validates; it runs on the caller's goroutine.
	fill(now time.Time) error
	// fields lists columns and their SQL values in INSERT order.
	fields() []field
}

type field struct {
	name  string
	value any
}

// MCPCall is one MCP message in mcp_calls (the per-message ledger). RequestID holds string ids verbatim and numbers as their JSON
// text; see RequestIDText. StreamID is the frame stream of the guest
// transport; Transport says which path carried the call (e.g. "frame",
// "host").
type MCPCall struct {
	EventID         string
	Timestamp       time.Time
	TraceID         string
	ServerName      string
	Method          string
	ToolName        string
	RequestID       string
	RequestPreview  string
	ResponsePreview string
	Decision        Decision
	DurationMS      int64
	ErrorMessage    string
	ErrorCode       *int64
	ProcessName     string
	BytesSent       int64
	BytesReceived   int64
	PolicyMode      string
	PolicyAction    string
	PolicyRule      string
	PolicyReason    string
	StreamID        *int64
	Transport       string
	// Pending marks a call recorded before it is dispatched: its answer
	// writes the same EventID again, completing the row. A row still
	// pending is a call whose answer never came (the gateway died).
	Pending bool
	// RequestDigest and ResponseDigest identify the whole request and
	// response, however much of them the previews keep: "sha256:<hex>",
	// or "hmac-sha256:<hex>" (keyed by a secret of the session) for what
	// policy withheld, so that a guess cannot be confirmed.
	RequestDigest  string
	ResponseDigest string
}

func (*MCPCall) table() tableID { return tableMCPCalls }

func (c *MCPCall) fill(now time.Time) error {
	if err := fillMeta(&c.EventID, &c.Timestamp, now); err != nil {
		return fmt.Errorf("ledger: mcp_calls: %w", err)
	}
	// Checked here, not only by the CHECK constraint, so a bad row fails its
	// own Write instead of the group transaction it would have joined.
	if !c.Decision.Valid() {
		return fmt.Errorf("ledger: mcp_calls: decision %q is not one of allowed, warned, denied, error", c.Decision)
	}
	return nil
}

func (c *MCPCall) fields() []field {
	return []field{
		{"event_id", c.EventID},
		{"timestamp", stamp(c.Timestamp)},
		{"trace_id", optText(c.TraceID)},
		{"server_name", optText(c.ServerName)},
		{"method", optText(c.Method)},
		{"tool_name", optText(c.ToolName)},
		{"request_id", optText(c.RequestID)},
		{"request_preview", optText(c.RequestPreview)},
		{"response_preview", optText(c.ResponsePreview)},
		{"decision", string(c.Decision)},
		{"duration_ms", c.DurationMS},
		{"error_message", optText(c.ErrorMessage)},
		{"error_code", optInt(c.ErrorCode)},
		{"process_name", optText(c.ProcessName)},
		{"bytes_sent", c.BytesSent},
		{"bytes_received", c.BytesReceived},
		{"policy_mode", optText(c.PolicyMode)},
		{"policy_action", optText(c.PolicyAction)},
		{"policy_rule", optText(c.PolicyRule)},
		{"policy_reason", optText(c.PolicyReason)},
		{"stream_id", optInt(c.StreamID)},
		{"transport", optText(c.Transport)},
		{"pending", boolInt(c.Pending)},
		{"request_digest", optText(c.RequestDigest)},
		{"response_digest", optText(c.ResponseDigest)},
	}
}

// NetEvent is one proxied network request in net_events. A zero Port is
// stored as 443 and an empty ConnType as "https", the spec's defaults.
type NetEvent struct {
	EventID             string
	Timestamp           time.Time
	TraceID             string
	Domain              string
	Port                int64
	Decision            string
	ProcessName         string
	PID                 int64
	Method              string
	Path                string
	Query               string
	StatusCode          int64
	BytesSent           int64
	BytesReceived       int64
	DurationMS          int64
	MatchedRule         string
	ErrorMessage        string
	RequestHeaders      string
	ResponseHeaders     string
	RequestBodyPreview  string
	ResponseBodyPreview string
	ConnType            string
	PolicyMode          string
	PolicyAction        string
	PolicyRule          string
	PolicyReason        string
	// IP is the destination address; Source who connected: SourceGuest
	// (the guest's network), SourceBuiltin (the builtin HTTP tools) or
	// SourcePublished (a host client of a published port).
	IP     string
	Source string
	// PolicySource is the file the deciding rule came from.
	PolicySource string
}

// NetEvent.Source values.
const (
	SourceGuest   = "guest"
	SourceBuiltin = "builtin"
	// SourcePublished: a host client of a port the VM publishes, carried
	// into the guest (IP is the client's, Port the guest's).
	SourcePublished = "published"
)

func (*NetEvent) table() tableID { return tableNetEvents }

func (e *NetEvent) fill(now time.Time) error {
	if err := fillMeta(&e.EventID, &e.Timestamp, now); err != nil {
		return fmt.Errorf("ledger: net_events: %w", err)
	}
	if e.Port == 0 {
		e.Port = 443
	}
	if e.ConnType == "" {
		e.ConnType = "https"
	}
	return nil
}

func (e *NetEvent) fields() []field {
	return []field{
		{"event_id", e.EventID},
		{"timestamp", stamp(e.Timestamp)},
		{"trace_id", optText(e.TraceID)},
		{"domain", optText(e.Domain)},
		{"port", e.Port},
		{"decision", optText(e.Decision)},
		{"process_name", optText(e.ProcessName)},
		{"pid", e.PID},
		{"method", optText(e.Method)},
		{"path", optText(e.Path)},
		{"query", optText(e.Query)},
		{"status_code", e.StatusCode},
		{"bytes_sent", e.BytesSent},
		{"bytes_received", e.BytesReceived},
		{"duration_ms", e.DurationMS},
		{"matched_rule", optText(e.MatchedRule)},
		{"error_message", optText(e.ErrorMessage)},
		{"request_headers", optText(e.RequestHeaders)},
		{"response_headers", optText(e.ResponseHeaders)},
		{"request_body_preview", optText(e.RequestBodyPreview)},
		{"response_body_preview", optText(e.ResponseBodyPreview)},
		{"conn_type", CapField(e.ConnType)},
		{"policy_mode", optText(e.PolicyMode)},
		{"policy_action", optText(e.PolicyAction)},
		{"policy_rule", optText(e.PolicyRule)},
		{"policy_reason", optText(e.PolicyReason)},
		{"ip", optText(e.IP)},
		{"source", optText(e.Source)},
		{"policy_source", optText(e.PolicySource)},
	}
}

// ExecEvent is one command run in the sandbox, in exec_events. ExitCode is
// nil when the process never exited normally (killed, timed out). An empty
// Source is stored as "api".
//
// Pending marks a command recorded before it starts: writing the same
// EventID again when it ends completes that row, so a per-VM process killed
// meanwhile still leaves the command in the ledger, pending.
type ExecEvent struct {
	EventID       string
	Timestamp     time.Time
	TraceID       string
	ExecID        string
	Command       string
	ExitCode      *int64
	DurationMS    int64
	StdoutPreview string
	StderrPreview string
	StdoutBytes   int64
	StderrBytes   int64
	Truncated     bool
	TimedOut      bool
	Source        string
	ProcessName   string
	PID           int64
	Pending       bool
}

func (*ExecEvent) table() tableID { return tableExecEvents }

func (e *ExecEvent) fill(now time.Time) error {
	if err := fillMeta(&e.EventID, &e.Timestamp, now); err != nil {
		return fmt.Errorf("ledger: exec_events: %w", err)
	}
	if e.Source == "" {
		e.Source = "api"
	}
	return nil
}

func (e *ExecEvent) fields() []field {
	return []field{
		{"event_id", e.EventID},
		{"timestamp", stamp(e.Timestamp)},
		{"trace_id", optText(e.TraceID)},
		{"exec_id", optText(e.ExecID)},
		{"command", optText(e.Command)},
		{"exit_code", optInt(e.ExitCode)},
		{"duration_ms", e.DurationMS},
		{"stdout_preview", optText(e.StdoutPreview)},
		{"stderr_preview", optText(e.StderrPreview)},
		{"stdout_bytes", e.StdoutBytes},
		{"stderr_bytes", e.StderrBytes},
		{"truncated", boolInt(e.Truncated)},
		{"timed_out", boolInt(e.TimedOut)},
		{"source", CapField(e.Source)},
		{"process_name", optText(e.ProcessName)},
		{"pid", e.PID},
		{"pending", boolInt(e.Pending)},
	}
}

// FSEvent is one file operation or change in fs_events. Operation is what
// happened: the host's operations in a guest (read, write, stat, mkdir) or
// a change seen in the workspace (created, modified, deleted, restored).
// Direction is FromGuest or ToGuest for bytes that crossed the boundary;
// Digest is the SHA-256 (hex) of the bytes that crossed; Outcome is
// OutcomeOK or OutcomeError (with ErrorMessage).
type FSEvent struct {
	EventID      string
	Timestamp    time.Time
	TraceID      string
	Operation    string
	Path         string
	Size         int64
	Direction    string
	Digest       string
	Outcome      string
	ErrorMessage string
}

// FSEvent directions and outcomes.
const (
	FromGuest    = "from_guest"
	ToGuest      = "to_guest"
	OutcomeOK    = "ok"
	OutcomeError = "error"
)

func (*FSEvent) table() tableID { return tableFSEvents }

func (e *FSEvent) fill(now time.Time) error {
	if err := fillMeta(&e.EventID, &e.Timestamp, now); err != nil {
		return fmt.Errorf("ledger: fs_events: %w", err)
	}
	if e.Operation == "" || e.Path == "" {
		return fmt.Errorf("ledger: fs_events: operation and path are required (got operation %q, path %q)", e.Operation, e.Path)
	}
	return nil
}

func (e *FSEvent) fields() []field {
	return []field{
		{"event_id", e.EventID},
		{"timestamp", stamp(e.Timestamp)},
		{"trace_id", optText(e.TraceID)},
		{"operation", CapField(e.Operation)},
		{"path", CapField(e.Path)},
		{"size", e.Size},
		{"direction", optText(e.Direction)},
		{"digest", optText(e.Digest)},
		{"outcome", optText(e.Outcome)},
		{"error_message", optText(CapField(e.ErrorMessage))},
	}
}

// ModelCall is one LLM API call in model_calls.
type ModelCall struct {
	EventID       string
	Timestamp     time.Time
	TraceID       string
	Provider      string
	Model         string
	ProcessName   string
	RequestBytes  int64
	ResponseBytes int64
	InputTokens   int64
	OutputTokens  int64
	DurationMS    int64
	StatusCode    int64
}

func (*ModelCall) table() tableID { return tableModelCalls }

func (m *ModelCall) fill(now time.Time) error {
	if err := fillMeta(&m.EventID, &m.Timestamp, now); err != nil {
		return fmt.Errorf("ledger: model_calls: %w", err)
	}
	return nil
}

func (m *ModelCall) fields() []field {
	return []field{
		{"event_id", m.EventID},
		{"timestamp", stamp(m.Timestamp)},
		{"trace_id", optText(m.TraceID)},
		{"provider", optText(m.Provider)},
		{"model", optText(m.Model)},
		{"process_name", optText(m.ProcessName)},
		{"request_bytes", m.RequestBytes},
		{"response_bytes", m.ResponseBytes},
		{"input_tokens", m.InputTokens},
		{"output_tokens", m.OutputTokens},
		{"duration_ms", m.DurationMS},
		{"status_code", m.StatusCode},
	}
}

func fillMeta(eventID *string, ts *time.Time, now time.Time) error {
	if *eventID == "" {
		*eventID = NewEventID()
	} else if !validEventID(*eventID) {
		return fmt.Errorf("event_id %q is not 12 lowercase hex digits", capString(*eventID, 64))
	}
	if ts.IsZero() {
		*ts = now
	}
	return nil
}

func stamp(t time.Time) string { return t.UTC().Format(TimeLayout) }

func optText(s string) any {
	if s == "" {
		return nil
	}
	return CapField(s)
}

func optInt(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// DNSEvent is one query the guest's resolver (the per-VM process) answered,
// in dns_events. Answers are the addresses given, comma-separated; Decision
// is allowed, denied (the policy refused the name or its address) or error
// (a malformed query).
type DNSEvent struct {
	EventID      string
	Timestamp    time.Time
	TraceID      string
	Name         string
	QType        string
	Answers      string
	RCode        string
	Decision     string
	Server       string
	DurationMS   int64
	PolicyRule   string
	PolicySource string
	PolicyReason string
}

func (*DNSEvent) table() tableID { return tableDNSEvents }

func (e *DNSEvent) fill(now time.Time) error {
	if err := fillMeta(&e.EventID, &e.Timestamp, now); err != nil {
		return fmt.Errorf("ledger: dns_events: %w", err)
	}
	switch e.Decision {
	case "allowed", "denied", "error":
	default:
		return fmt.Errorf("ledger: dns_events: decision %q: want allowed, denied or error", e.Decision)
	}
	if e.RCode == "" {
		return errors.New("ledger: dns_events: empty rcode")
	}
	return nil
}

func (e *DNSEvent) fields() []field {
	return []field{
		{"event_id", e.EventID},
		{"timestamp", stamp(e.Timestamp)},
		{"trace_id", optText(e.TraceID)},
		{"name", CapField(e.Name)},
		{"qtype", optText(e.QType)},
		{"answers", CapField(e.Answers)},
		{"rcode", e.RCode},
		{"decision", e.Decision},
		{"server", optText(e.Server)},
		{"duration_ms", e.DurationMS},
		{"policy_rule", optText(e.PolicyRule)},
		{"policy_source", optText(e.PolicySource)},
		{"policy_reason", CapField(e.PolicyReason)},
	}
}
