// Package endpoint is the MCP endpoint behind the guest relay: it serves framed
// MCP connections, checks every request and response against the policy hook,
// routes calls to the aggregator, and records every message in the ledger
// before the answer leaves.
package endpoint

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/jsonrpc"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/mcpframe"
	"github.com/capsem/capsem/core/mcpuri"
	"github.com/capsem/capsem/core/policy"
	"github.com/capsem/capsem/core/rawjson"
)

// Upstream performs aggregator requests. Do must return promptly when ctx is
// done (and should cancel the upstream work).
type Upstream interface {
	Do(ctx context.Context, req *aggwire.Request) (*aggwire.Response, error)
}

// Record is one ledger row for one MCP message, plus the HTTP attempts the
// builtin server made while serving it.
type Record struct {
	// EventID, when set, names the row: a pending record and the record
	// that completes it share one.
	EventID string
	Pending bool // recorded before the call is dispatched; its answer completes the row
	// RequestDigest and ResponseDigest identify the whole messages (see
	// ledger.MCPCall): "sha256:<hex>", or "hmac-sha256:<hex>" for what
	// policy withheld.
	RequestDigest  string
	ResponseDigest string
	Time           time.Time
	Transport      string // "frame" or "host"
	StreamID       uint32
	ProcessName    string
	TraceID        string // the relay's caller's, from its metadata line
	ServerName     string
	Method         string
	ToolName       string
	RequestID      string
	Request        string // preview (the ledger caps it)
	Response       string
	Decision       string // allowed | warned | denied | error
	DurationMS     int64
	ErrorCode      int64
	ErrorMessage   string
	BytesSent      int64
	BytesReceived  int64
	PolicyMode     string
	PolicyAction   string
	PolicyRule     string
	PolicyReason   string
	NetEvents      []aggwire.NetEvent
}

// Recorder persists records; Record returns only after the row is durable
// (committed), because the answer may not leave before its audit row.
type Recorder interface {
	Record(ctx context.Context, r *Record) error
}

// Config configures an Endpoint.
type Config struct {
	Upstream Upstream
	Recorder Recorder
	Policy   policy.Hook // nil: allow all
	// InFlight caps concurrently dispatched requests across all connections;
	// a full cap stops reading frames (back-pressure). A slot is held while
	// a call runs, not while its answer waits for a client to read it: a
	// connection's unanswered calls are capped per connection (the same
	// number), so a client that stops reading stalls only itself.
	InFlight int
	// Limits on what clients may hold (zero: the defaults, see Limits).
	Limits         Limits
	DefaultTimeout time.Duration            // non-tools/call methods
	ToolTimeout    time.Duration            // tools/call without an override
	ToolTimeouts   map[string]time.Duration // namespaced tool → timeout
	Version        string
	Logger         *slog.Logger
}

// Limits bound what a client can hold of the endpoint, so that no client
// can stall or starve another.
type Limits struct {
	// WriteTimeout bounds writing one answer: a client that does not read
	// its answers for that long is disconnected (its calls keep their
	// rows, written before the answers).
	WriteTimeout time.Duration
	// FrameTimeout bounds reading a frame (or the metadata line) once its
	// first byte has arrived; an idle connection may wait for ever.
	FrameTimeout time.Duration
	// MaxConns bounds open connections; one more is refused (closed at
	// once, logged).
	MaxConns int
	// MaxBuffered bounds the bytes of all frames being read at once; a
	// frame that would pass it closes its connection (logged).
	MaxBuffered int64
}

// Default limits.
const (
	DefaultWriteTimeout = 30 * time.Second
	DefaultFrameTimeout = 30 * time.Second
	DefaultMaxConns     = 256
	DefaultMaxBuffered  = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = DefaultWriteTimeout
	}
	if l.FrameTimeout <= 0 {
		l.FrameTimeout = DefaultFrameTimeout
	}
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxBuffered <= 0 {
		l.MaxBuffered = DefaultMaxBuffered
	}
	return l
}

// Endpoint serves MCP for one session.
type Endpoint struct {
	cfg      Config
	sem      chan struct{}
	policy   atomic.Pointer[policyBox]
	timeouts atomic.Pointer[Timeouts]
	log      *slog.Logger
	// onlyInfoMeta is the _meta of a stateless result that had none:
	// the gateway's identity alone, encoded once.
	onlyInfoMeta []byte
	// digestKey keys the digests of what policy withheld; it lives in
	// this process only, so the ledger cannot confirm a guessed secret.
	digestKey []byte

	conns    atomic.Int64 // open connections (Serve)
	buffered atomic.Int64 // bytes of frames being read, all connections
}

// Timeouts are the endpoint's deadlines; zero fields take the defaults.
type Timeouts struct {
	Default time.Duration            // non-tools/call methods
	Tool    time.Duration            // tools/call without an override
	PerTool map[string]time.Duration // namespaced tool → timeout
}

type policyBox struct{ hook policy.Hook }

// Defaults for Config fields left zero.
const (
	DefaultTimeout     = 60 * time.Second
	DefaultToolTimeout = 300 * time.Second
)

// DefaultInFlight is the in-flight cap when none is configured.
func DefaultInFlight() int { return max(32, 8*runtime.GOMAXPROCS(0)) }

// New returns an Endpoint.
func New(cfg Config) *Endpoint {
	if cfg.InFlight <= 0 {
		cfg.InFlight = DefaultInFlight()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.withDefaults()
	e := &Endpoint{cfg: cfg, sem: make(chan struct{}, cfg.InFlight), log: cfg.Logger, digestKey: make([]byte, 32)}
	rand.Read(e.digestKey) // the session's secret for keyed digests; never stored
	e.onlyInfoMeta, _ = json.Marshal(map[string]any{metaServerInfo: e.serverInfo()})
	e.SetPolicy(cfg.Policy)
	e.SetTimeouts(Timeouts{Default: cfg.DefaultTimeout, Tool: cfg.ToolTimeout, PerTool: cfg.ToolTimeouts})
	return e
}

// SetTimeouts atomically replaces the deadlines; requests already running
// keep theirs.
func (e *Endpoint) SetTimeouts(t Timeouts) {
	if t.Default <= 0 {
		t.Default = DefaultTimeout
	}
	if t.Tool <= 0 {
		t.Tool = DefaultToolTimeout
	}
	e.timeouts.Store(&t)
}

// SetPolicy atomically replaces the policy; open connections see it on their
// next request.
func (e *Endpoint) SetPolicy(h policy.Hook) {
	if h == nil {
		h = policy.AllowAll{}
	}
	e.policy.Store(&policyBox{hook: h})
}

func (e *Endpoint) hook() policy.Hook { return e.policy.Load().hook }

// Supported protocol versions, newest first.
var protocolVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

// DiscoverVersion is the stateless protocol revision whose server/discover we answer.
const DiscoverVersion = "2026-07-28"

const instructions = "Capsem MCP gateway. Tools are namespaced as <server>__<tool>; " +
	"every call is checked against policy and recorded in the session ledger."

// outcome is the result of handling one request.
type outcome struct {
	result    json.RawMessage
	err       *jsonrpc.Error
	decision  string
	verdict   policy.Verdict
	redactReq bool
	redactRes bool
	checked   bool   // policy judged the request (CheckRequest ran)
	eventID   string // set when a pending row was written: the answer completes it
	withheld  []byte // what policy kept from the caller (a blocked or replaced answer), for its keyed digest
	server    string
	tool      string
	netEvents []aggwire.NetEvent
}

// errRecordFailed is what the caller sees when the audit row could not be written.
var errRecordFailed = jsonrpc.NewError(jsonrpc.CodeInternalError, "audit ledger write failed; the result was withheld")

// Handle runs one parsed request through policy, dispatch and the ledger and
// returns the response bytes. It is the shared rail of the framed path and the
// host-initiated path (no framing).
func (e *Endpoint) Handle(ctx context.Context, meta CallMeta, msg *jsonrpc.Message) []byte {
	start := time.Now()
	out := e.handle(ctx, msg, func(out *outcome) error {
		// A tool call that is about to reach a server is on the record
		// first: if the gateway dies before the answer, the row remains,
		// pending. The answer's row completes it (same event id).
		out.eventID = ledger.NewEventID()
		rec := e.record(start, meta, msg, out, nil)
		rec.Pending = true
		return e.cfg.Recorder.Record(context.WithoutCancel(ctx), rec)
	})
	resp := e.render(msg.ID, out, meta.MaxResponse)
	rec := e.record(start, meta, msg, out, resp)
	if err := e.cfg.Recorder.Record(context.WithoutCancel(ctx), rec); err != nil {
		e.log.Error("ledger write failed", "method", msg.Method, "err", err)
		resp = jsonrpc.ErrorResponse(msg.ID, errRecordFailed)
	}
	return resp
}

// CallMeta describes where a request came from.
type CallMeta struct {
	Transport   string
	StreamID    uint32
	ProcessName string
	TraceID     string
	BytesIn     int
	// MaxResponse bounds the encoded response; larger results become an error.
	MaxResponse int
}

func (e *Endpoint) render(id json.RawMessage, out *outcome, max int) []byte {
	if out.err != nil {
		return jsonrpc.ErrorResponse(id, out.err)
	}
	resp := jsonrpc.ResultResponse(id, out.result)
	if max > 0 && len(resp) > max {
		size := len(resp)
		out.err = jsonrpc.NewError(jsonrpc.CodeInternalError, "response too large for an MCP frame: %d bytes (max %d)", size, max)
		out.decision = "error"
		out.result = nil
		return jsonrpc.ErrorResponse(id, out.err)
	}
	return resp
}

func (e *Endpoint) record(start time.Time, meta CallMeta, msg *jsonrpc.Message, out *outcome, resp []byte) *Record {
	r := &Record{
		EventID:       out.eventID,
		Time:          start.UTC(),
		Transport:     meta.Transport,
		StreamID:      meta.StreamID,
		ProcessName:   meta.ProcessName,
		TraceID:       meta.TraceID,
		ServerName:    out.server,
		Method:        msg.Method,
		ToolName:      out.tool,
		RequestID:     jsonrpc.IDText(msg.ID),
		Decision:      out.decision,
		DurationMS:    time.Since(start).Milliseconds(),
		BytesSent:     int64(meta.BytesIn),
		BytesReceived: int64(len(resp)),
		PolicyMode:    policy.Mode,
		PolicyAction:  out.verdict.Decision.String(),
		PolicyRule:    out.verdict.Rule,
		PolicyReason:  out.verdict.Reason,
		NetEvents:     out.netEvents,
	}
	withheldReq := out.redactReq
	switch {
	case out.redactReq:
		r.Request = policy.Redact(e.digestKey, msg.Params)
	case !out.checked:
		// Refused before policy ran (bad params): stored only as policy
		// would let it through.
		r.Request, withheldReq = e.vetPreview(context.Background(), msg.Method, msg.Params)
	default:
		r.Request = string(msg.Params)
	}
	r.RequestDigest = e.digest(msg.Params, withheldReq)
	if out.redactRes {
		r.ResponseDigest = e.digest(out.withheld, true)
	} else if resp != nil {
		r.ResponseDigest = e.digest(resp, false)
	}
	switch {
	case out.redactRes:
		r.Response = `{"redacted_by_policy":true}`
	case out.err != nil:
		eb, _ := json.Marshal(out.err)
		r.Response = string(eb)
	default:
		r.Response = string(out.result)
	}
	if out.err != nil {
		r.ErrorCode = out.err.Code
		r.ErrorMessage = out.err.Message
	}
	return r
}

// handle runs one request; beforeCall, when a tools/call has passed policy,
// runs before it is dispatched, and its error stops the call.
func (e *Endpoint) handle(ctx context.Context, msg *jsonrpc.Message, beforeCall func(*outcome) error) *outcome {
	out := &outcome{decision: "allowed", server: "gateway"}
	call := &policy.Call{Method: msg.Method}
	var req *aggwire.Request
	switch msg.Method {
	case "initialize", "server/discover", "ping":
	case "tools/list", "resources/list", "resources/templates/list", "prompts/list":
		out.server = "*"
	case "tools/call", "prompts/get":
		if perr := objectParams(msg.Params); perr != nil {
			return out.fail(perr)
		}
		kind := "tool"
		if msg.Method == "prompts/get" {
			kind = "prompt"
		}
		name, perr := stringParam(msg.Params, "name")
		if perr != nil {
			return out.fail(perr)
		}
		if name == "" {
			return out.fail(jsonrpc.NewError(jsonrpc.CodeInvalidParams, "missing %s name", kind))
		}
		args, _, _ := rawjson.Member(msg.Params, "arguments")
		if len(args) == 0 || string(args) == "null" {
			args = json.RawMessage(`{}`)
		}
		if args[0] != '{' {
			return out.fail(jsonrpc.NewError(jsonrpc.CodeInvalidParams, "%s arguments must be a JSON object", kind))
		}
		server, _, ok := strings.Cut(name, "__")
		if !ok || server == "" {
			out.tool = name
			return out.fail(jsonrpc.NewError(jsonrpc.CodeInvalidParams, "%s name %q is not namespaced as <server>__<name>", kind, name))
		}
		out.server, out.tool = server, name
		call.Server, call.Name, call.Arguments = server, name, args
		method := aggwire.MethodCallTool
		if msg.Method == "prompts/get" {
			method = aggwire.MethodGetPrompt
		}
		req = &aggwire.Request{Method: method, Name: name, Arguments: args}
	case "resources/read":
		if perr := objectParams(msg.Params); perr != nil {
			return out.fail(perr)
		}
		uri, perr := stringParam(msg.Params, "uri")
		if perr != nil {
			return out.fail(perr)
		}
		if uri == "" {
			return out.fail(jsonrpc.NewError(jsonrpc.CodeInvalidParams, "missing resource URI"))
		}
		// Policy decides on, and the server gets, the canonical form:
		// what the server will read, however the caller spelled it.
		canon, cerr := mcpuri.CanonicalNamespaced(uri)
		if cerr != nil {
			return out.fail(jsonrpc.NewError(jsonrpc.CodeInvalidParams, "%v", cerr))
		}
		uri = canon
		server, ok := ResourceServer(uri)
		if !ok {
			return out.fail(jsonrpc.NewError(jsonrpc.CodeInvalidParams, "resource URI %q is not namespaced as capsem://<server>/<uri>", uri))
		}
		out.server, out.tool = server, uri
		call.Server, call.URI = server, uri
		req = &aggwire.Request{Method: aggwire.MethodReadResource, URI: uri}
	default:
		return out.fail(jsonrpc.NewError(jsonrpc.CodeMethodNotFound, "method not found: %s", msg.Method))
	}

	hook := e.hook()
	out.verdict = hook.CheckRequest(ctx, call)
	out.checked = true
	switch out.verdict.Decision {
	case policy.Block:
		out.redactReq = true
		out.decision = "denied"
		out.err = jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "MCP request blocked by policy rule %q", out.verdict.Rule)
		return out
	case policy.Warn:
		out.decision = "warned"
		e.log.Warn("MCP request allowed with a policy warning", "method", msg.Method, "target", out.tool, "rule", out.verdict.Rule)
	}

	ctx, cancel := context.WithTimeout(ctx, e.timeoutFor(msg.Method, call.Name))
	defer cancel()
	if msg.Method == "tools/call" && beforeCall != nil {
		if err := beforeCall(out); err != nil {
			e.log.Error("ledger write failed; the call is not dispatched", "method", msg.Method, "target", out.tool, "err", err)
			out.decision = "error"
			out.err = errRecordFailed
			return out
		}
	}
	result, netEvents, rerr := e.dispatch(ctx, msg, req, hook)
	out.netEvents = netEvents
	if rerr != nil {
		// An error carries a server's words too: what a rule keeps out
		// of a result it keeps out of an error.
		if v := hook.CheckError(ctx, call, rerr.Message, rerr.Data); v.Decision == policy.Block {
			out.verdict = v
			out.redactRes = true
			out.withheld, _ = json.Marshal(rerr)
			out.decision = "denied"
			out.err = jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "MCP response blocked by policy rule %q", v.Rule)
			return out
		}
		out.decision = "error"
		out.err = rerr
		return out
	}
	respVerdict := hook.CheckResponse(ctx, call, result)
	switch respVerdict.Decision {
	case policy.Block:
		out.verdict = respVerdict
		out.redactRes = true
		out.withheld = result
		out.decision = "denied"
		out.err = jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "MCP response blocked by policy rule %q", respVerdict.Rule)
		return out
	case policy.Warn:
		out.verdict = respVerdict
		out.decision = "warned"
		e.log.Warn("MCP response passed with a policy warning", "method", msg.Method, "target", out.tool, "rule", respVerdict.Rule)
	}
	if respVerdict.Replace != nil {
		out.verdict = respVerdict
		out.redactRes = true
		out.withheld = result
		result = respVerdict.Replace
	}
	if statelessRequest(msg.Params) {
		result = e.decorateStateless(result)
	}
	out.result = result
	return out
}

// vetPreview is the preview of a request's params that policy did not
// judge on its way (the endpoint refused the message first): the params as
// they are when policy would let the call through, else Redact's marker
// (withheld true). The call is read from the params as loosely as a hostile
// sender could mean it: no namespace, a bad URI or unreadable params count
// as blocked.
func (e *Endpoint) vetPreview(ctx context.Context, method string, params json.RawMessage) (preview string, withheld bool) {
	if len(params) == 0 || !isCallMethod(method) {
		return string(params), false
	}
	call := &policy.Call{Method: method}
	name, _ := stringParam(params, "name")
	call.Server, _, _ = strings.Cut(name, "__")
	call.Name = name
	call.Arguments, _, _ = rawjson.Member(params, "arguments")
	if uri, err := stringParam(params, "uri"); err == nil && uri != "" {
		canon, cerr := mcpuri.CanonicalNamespaced(uri)
		if cerr != nil {
			return policy.Redact(e.digestKey, params), true
		}
		call.URI = canon
		call.Server, _ = ResourceServer(canon)
	}
	if !json.Valid(params) || e.hook().CheckRequest(ctx, call).Decision == policy.Block {
		return policy.Redact(e.digestKey, params), true
	}
	return string(params), false
}

// digest identifies data in a ledger row: its SHA-256, or for what policy
// withheld an HMAC under the session's key (a digest of a blocked secret
// must not confirm a guess of it).
func (e *Endpoint) digest(data []byte, withheld bool) string {
	if withheld {
		return "hmac-sha256:" + policy.KeyedDigest(e.digestKey, data)
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func isCallMethod(method string) bool {
	return method == "tools/call" || method == "prompts/get" || method == "resources/read"
}

// Keys of the stateless protocol revision (SEP-2575).
const (
	metaProtocolVersion = "io.modelcontextprotocol/protocolVersion"
	metaServerInfo      = "io.modelcontextprotocol/serverInfo"
)

// statelessRequest reports whether the request speaks the stateless revision,
// whose results carry resultType and the server's identity in _meta.
func statelessRequest(params json.RawMessage) bool {
	// Most requests never mention the key: skip the scan for them. The scan
	// reads only _meta (params holds the call's arguments, of any size).
	if len(params) == 0 || !bytes.Contains(params, []byte(metaProtocolVersion)) {
		return false
	}
	meta, _, ok := rawjson.Member(params, "_meta")
	if !ok {
		return false
	}
	raw, _, ok := rawjson.Member(meta, metaProtocolVersion)
	var v string
	return ok && json.Unmarshal(raw, &v) == nil && v >= DiscoverVersion
}

// decorateStateless adds resultType (unless present) and the gateway's
// identity in _meta (keeping the other _meta keys) to a result object. It
// splices them into the result's text rather than decoding and re-encoding
// the whole result (a tool's output, of any size); a repeated key's last
// occurrence is the one that counts, as in JSON.parse. Anything but a
// valid JSON object is returned unchanged.
func (e *Endpoint) decorateStateless(result json.RawMessage) json.RawMessage {
	out := rawjson.TrimSpace(result)
	if len(out) == 0 || out[0] != '{' || !json.Valid(out) {
		return result
	}
	rawMeta, at, hasMeta := rawjson.Member(out, "_meta")
	newMeta := e.onlyInfoMeta // the usual case: no _meta, or one that is not an object
	if hasMeta && rawMeta[0] == '{' {
		meta := map[string]json.RawMessage{}
		if json.Unmarshal(rawMeta, &meta) == nil {
			info, err := json.Marshal(e.serverInfo())
			if err != nil {
				return result
			}
			meta[metaServerInfo] = info
			if newMeta, err = json.Marshal(meta); err != nil {
				return result
			}
		}
	}
	if hasMeta {
		spliced := make([]byte, 0, len(out)-len(rawMeta)+len(newMeta))
		spliced = append(spliced, out[:at]...)
		spliced = append(spliced, newMeta...)
		out = append(spliced, out[at+len(rawMeta):]...)
	} else {
		out = appendMember(out, "_meta", newMeta)
	}
	if _, _, ok := rawjson.Member(out, "resultType"); !ok {
		out = appendMember(out, "resultType", []byte(`"complete"`))
	}
	return out
}

// appendMember returns obj, a JSON object with no space around it, with
// "key":value added as its last member.
func appendMember(obj []byte, key string, value []byte) []byte {
	k, _ := json.Marshal(key)
	body := bytes.TrimSpace(obj[1 : len(obj)-1])
	out := make([]byte, 0, len(obj)+len(k)+len(value)+2)
	out = append(out, obj[:len(obj)-1]...)
	if len(body) > 0 {
		out = append(out, ',')
	}
	out = append(out, k...)
	out = append(out, ':')
	out = append(out, value...)
	return append(out, '}')
}

func (o *outcome) fail(err *jsonrpc.Error) *outcome {
	o.err = err
	o.decision = "error"
	return o
}

// objectParams checks that a request carries params and that they are an
// object (ParseRequest has already checked they are valid JSON).
func objectParams(raw json.RawMessage) *jsonrpc.Error {
	if len(raw) == 0 {
		return jsonrpc.NewError(jsonrpc.CodeInvalidParams, "missing params")
	}
	if raw[0] != '{' {
		return jsonrpc.NewError(jsonrpc.CodeInvalidParams, "params must be an object")
	}
	return nil
}

// stringParam returns the string member key of params, an object; "" when
// it is absent or null. Keys match exactly, as the MCP SDKs decode them
// (encoding/json would also take "Name" for "name"), and where a key
// repeats the last one counts. The value is read off the params' text
// rather than by decoding the whole object, whose arguments may be large.
func stringParam(params json.RawMessage, key string) (string, *jsonrpc.Error) {
	raw, _, ok := rawjson.Member(params, key)
	if !ok || string(raw) == "null" {
		return "", nil
	}
	s, ok := rawjson.String(raw)
	if !ok {
		return "", jsonrpc.NewError(jsonrpc.CodeInvalidParams, "invalid params: %s must be a string", key)
	}
	return s, nil
}

// ResourceServer returns the server of a namespaced resource URI.
func ResourceServer(uri string) (string, bool) {
	rest, ok := strings.CutPrefix(uri, "capsem://")
	if !ok {
		return "", false
	}
	server, orig, ok := strings.Cut(rest, "/")
	return server, ok && server != "" && orig != ""
}

func (e *Endpoint) timeoutFor(method, tool string) time.Duration {
	t := e.timeouts.Load()
	if method != "tools/call" {
		return t.Default
	}
	if d, ok := t.PerTool[tool]; ok && d > 0 {
		return d
	}
	return t.Tool
}

func (e *Endpoint) dispatch(ctx context.Context, msg *jsonrpc.Message, req *aggwire.Request, hook policy.Hook) (json.RawMessage, []aggwire.NetEvent, *jsonrpc.Error) {
	switch msg.Method {
	case "initialize":
		return e.initialize(msg.Params), nil, nil
	case "server/discover":
		return e.discover(), nil, nil
	case "ping":
		return json.RawMessage(`{}`), nil, nil
	case "resources/templates/list":
		return json.RawMessage(`{"resourceTemplates":[]}`), nil, nil
	case "tools/list":
		req = &aggwire.Request{Method: aggwire.MethodListTools}
	case "resources/list":
		req = &aggwire.Request{Method: aggwire.MethodListResources}
	case "prompts/list":
		req = &aggwire.Request{Method: aggwire.MethodListPrompts}
	}
	start := time.Now()
	resp, err := e.cfg.Upstream.Do(ctx, req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, nil, jsonrpc.NewError(jsonrpc.CodeTimeout, "MCP request timed out after %d ms", time.Since(start).Milliseconds())
		}
		if ctx.Err() != nil {
			return nil, nil, jsonrpc.NewError(jsonrpc.CodeInternalError, "%s cancelled: %v", msg.Method, context.Cause(ctx))
		}
		return nil, nil, jsonrpc.NewError(jsonrpc.CodeInternalError, "%s failed: %v", msg.Method, err)
	}
	if resp.Error != "" {
		code := int64(jsonrpc.CodeInternalError)
		if resp.Code == aggwire.CodeInvalidParams {
			code = jsonrpc.CodeInvalidParams
		}
		return nil, resp.NetEvents, jsonrpc.NewError(code, "%s failed: %s", msg.Method, resp.Error)
	}
	// Lists hide what policy blocks whatever the arguments (hide and deny).
	lister, _ := hook.(policy.Lister)
	visible := func(c policy.Call) bool { return lister == nil || lister.Visible(ctx, &c) }
	switch msg.Method {
	case "tools/list":
		return toolsList(slices.DeleteFunc(resp.Tools, func(t aggwire.Tool) bool {
			return !visible(policy.Call{Method: "tools/call", Server: t.Server, Name: t.Name})
		})), nil, nil
	case "resources/list":
		return resourcesList(slices.DeleteFunc(resp.Resources, func(r aggwire.Resource) bool {
			// Judged as a read of it would be: canonical, and hidden
			// when a read would be refused.
			canon, err := mcpuri.CanonicalNamespaced(r.URI)
			return err != nil || !visible(policy.Call{Method: "resources/read", Server: r.Server, URI: canon})
		})), nil, nil
	case "prompts/list":
		return promptsList(slices.DeleteFunc(resp.Prompts, func(p aggwire.Prompt) bool {
			return !visible(policy.Call{Method: "prompts/get", Server: p.Server, Name: p.Name})
		})), nil, nil
	}
	if len(resp.Result) == 0 {
		return json.RawMessage(`{}`), resp.NetEvents, nil
	}
	return resp.Result, resp.NetEvents, nil
}

func (e *Endpoint) initialize(params json.RawMessage) json.RawMessage {
	var p struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	_ = json.Unmarshal(params, &p)
	version := protocolVersions[0]
	for _, v := range protocolVersions {
		if v == p.ProtocolVersion {
			version = v
		}
	}
	b, _ := json.Marshal(map[string]any{
		"protocolVersion": version,
		"capabilities":    capabilities(),
		"serverInfo":      e.serverInfo(),
		"instructions":    instructions,
	})
	return b
}

func (e *Endpoint) discover() json.RawMessage {
	b, _ := json.Marshal(map[string]any{
		"_meta":             map[string]any{metaServerInfo: e.serverInfo()},
		"ttlMs":             0,
		"supportedVersions": append([]string{DiscoverVersion}, protocolVersions...),
		"capabilities":      capabilities(),
		"serverInfo":        e.serverInfo(),
		"instructions":      instructions,
	})
	return b
}

func capabilities() map[string]any {
	return map[string]any{
		"tools":     map[string]any{"listChanged": false},
		"resources": map[string]any{"subscribe": false, "listChanged": false},
		"prompts":   map[string]any{"listChanged": false},
	}
}

func (e *Endpoint) serverInfo() map[string]any {
	return map[string]any{"name": "capsem-gateway", "title": "Capsem MCP gateway", "version": e.cfg.Version}
}

func toolsList(tools []aggwire.Tool) json.RawMessage {
	type annotations struct {
		Title           string `json:"title,omitempty"`
		ReadOnlyHint    bool   `json:"readOnlyHint"`
		DestructiveHint bool   `json:"destructiveHint"`
		IdempotentHint  bool   `json:"idempotentHint"`
		OpenWorldHint   bool   `json:"openWorldHint"`
	}
	type tool struct {
		Name         string          `json:"name"`
		Title        string          `json:"title,omitempty"`
		Description  string          `json:"description,omitempty"`
		InputSchema  json.RawMessage `json:"inputSchema"`
		OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
		Annotations  *annotations    `json:"annotations,omitempty"`
	}
	list := make([]tool, 0, len(tools))
	for _, t := range tools {
		out := tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema, OutputSchema: t.OutputSchema}
		if len(out.InputSchema) == 0 {
			out.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		if a := t.Annotations; a != nil {
			out.Annotations = &annotations{a.Title, a.ReadOnlyHint, a.DestructiveHint, a.IdempotentHint, a.OpenWorldHint}
		}
		list = append(list, out)
	}
	b, _ := json.Marshal(map[string]any{"tools": list})
	return b
}

func resourcesList(res []aggwire.Resource) json.RawMessage {
	type resource struct {
		URI         string `json:"uri"`
		Name        string `json:"name"`
		Title       string `json:"title,omitempty"`
		Description string `json:"description,omitempty"`
		MIMEType    string `json:"mimeType,omitempty"`
	}
	list := make([]resource, 0, len(res))
	for _, r := range res {
		name := r.Name
		if name == "" {
			name = r.OriginalURI
		}
		list = append(list, resource{r.URI, name, r.Title, r.Description, r.MIMEType})
	}
	b, _ := json.Marshal(map[string]any{"resources": list})
	return b
}

func promptsList(prompts []aggwire.Prompt) json.RawMessage {
	type prompt struct {
		Name        string          `json:"name"`
		Title       string          `json:"title,omitempty"`
		Description string          `json:"description,omitempty"`
		Arguments   json.RawMessage `json:"arguments,omitempty"`
	}
	list := make([]prompt, 0, len(prompts))
	for _, p := range prompts {
		list = append(list, prompt{p.Name, p.Title, p.Description, p.Arguments})
	}
	b, _ := json.Marshal(map[string]any{"prompts": list})
	return b
}

// MaxFramedResponse is the largest JSON-RPC response that fits a frame with
// the given process name.
func MaxFramedResponse(name string) int { return mcpframe.MaxBodyLen - mcpframe.HeaderLen - len(name) }
