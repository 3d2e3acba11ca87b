package policy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"github.com/capsem/capsem/core/mcpuri"
	"github.com/capsem/capsem/core/rawjson"
)

// Rank orders where a decision came from. A decision can only be relaxed by
// one of the same or a higher rank: a user file can tighten what corp set but
// never loosen it.
type Rank int

const (
	RankBuiltin Rank = iota // the engine's own default (allow)
	RankAuto                // servers auto-detected from AI CLI settings
	RankUser                // user.toml (or --config)
	RankCorp                // corp.toml
)

func (r Rank) String() string {
	switch r {
	case RankAuto:
		return "auto-detected"
	case RankUser:
		return "user"
	case RankCorp:
		return "corp"
	default:
		return "built-in"
	}
}

// Entry is a decision with its provenance.
type Entry struct {
	Decision Decision
	Rank     Rank
	Source   string // file that set it ("" for built-in)
}

// Rule is a content rule: every condition that is set must match. Among the
// rules that match, a Block wins over an Allow.
type Rule struct {
	Name   string
	Action Decision // Allow or Block
	Rank   Rank
	Source string
	// Tool and ResourceURI are globs on the namespaced tool or prompt name
	// and the namespaced resource URI: '*' matches any run of characters
	// (slashes included, since URIs nest), '?' any one character.
	Tool        string
	ResourceURI string
	// Argument is a dot path (a.b.0.c) that must be present in the call's
	// arguments; with Equals its value must be JSON-equal, with Matches a
	// string value must match the regular expression.
	Argument string
	Equals   json.RawMessage
	Matches  *regexp.Regexp
	// Returns is a dot path into the result, evaluated on the response; with
	// ReturnsEquals / ReturnsMatches the value must match too. A path may
	// continue into a text item that holds JSON (content.0.text.field).
	Returns        string
	ReturnsEquals  json.RawMessage
	ReturnsMatches *regexp.Regexp

	argPath, retPath  []string
	equals, retEquals *any   // decoded once; nil: no equality condition
	uriPattern        string // ResourceURI in canonical form (mcpuri), as calls are matched
}

// responsePhase reports whether the rule looks at results.
func (r *Rule) responsePhase() bool { return r.Returns != "" }

// Validate reports why a rule cannot be used.
func (r *Rule) Validate() error {
	if r.Action != Allow && r.Action != Block {
		return fmt.Errorf("action must be allow or block")
	}
	if r.Tool == "" && r.ResourceURI == "" && r.Argument == "" && r.Returns == "" {
		return fmt.Errorf("needs at least one of tool, resource_uri, argument, returns")
	}
	if r.Tool != "" && r.ResourceURI != "" {
		return fmt.Errorf("tool and resource_uri never match the same call; use two rules")
	}
	if r.Argument == "" && (len(r.Equals) > 0 || r.Matches != nil) {
		return fmt.Errorf("equals and matches need argument")
	}
	if r.Returns == "" && (len(r.ReturnsEquals) > 0 || r.ReturnsMatches != nil) {
		return fmt.Errorf("returns_equals and returns_matches need returns")
	}
	if r.Argument != "" && r.Returns != "" {
		return fmt.Errorf("argument (request phase) and returns (response phase) cannot be combined in one rule")
	}
	for _, raw := range []json.RawMessage{r.Equals, r.ReturnsEquals} {
		if len(raw) > 0 && !json.Valid(raw) {
			return fmt.Errorf("equality value is not valid JSON")
		}
	}
	for _, p := range []string{r.Argument, r.Returns} {
		if p != "" && strings.Contains("."+p+".", "..") {
			return fmt.Errorf("dot path %q has an empty segment", p)
		}
	}
	return nil
}

func (r *Rule) prepare() {
	// A pattern is canonical like the URIs it is matched against ('*' and
	// '?' survive canonicalisation); one that cannot be stays as written.
	r.uriPattern = r.ResourceURI
	if c, err := mcpuri.CanonicalNamespaced(r.ResourceURI); err == nil {
		r.uriPattern = c
	}
	if r.Argument != "" {
		r.argPath = strings.Split(r.Argument, ".")
	}
	if r.Returns != "" {
		r.retPath = strings.Split(r.Returns, ".")
	}
	decode := func(raw json.RawMessage) *any {
		if len(raw) == 0 {
			return nil
		}
		var v any
		if json.Unmarshal(raw, &v) != nil {
			// Validate refuses this; an unusable value must never match.
			v = unmatchable{}
		}
		return &v
	}
	r.equals, r.retEquals = decode(r.Equals), decode(r.ReturnsEquals)
}

type unmatchable struct{}

// Engine is an immutable, in-memory policy; it implements Hook and Lister.
// Build it, then share it: evaluation never writes to it.
type Engine struct {
	Default        Entry
	BlockedServers map[string]string // server → source that blocked it
	AllowedServers map[string]string // empty: every server not blocked
	Tools          map[string]Entry  // namespaced tool or prompt → decision
	Rules          []Rule

	once          sync.Once
	requestRules  []*Rule
	responseRules []*Rule
}

var (
	_ Hook   = (*Engine)(nil)
	_ Lister = (*Engine)(nil)
)

func (e *Engine) prepare() {
	e.once.Do(func() {
		for i := range e.Rules {
			r := &e.Rules[i]
			r.prepare()
			if r.responsePhase() {
				e.responseRules = append(e.responseRules, r)
			} else {
				e.requestRules = append(e.requestRules, r)
			}
		}
	})
}

// CheckRequest evaluates a request: blocked servers, the allowed-servers
// whitelist, then the per-tool decision or the default, then the content
// rules (a matching Block always wins; a matching Allow relaxes the decision
// only when it comes from the same or a higher rank).
func (e *Engine) CheckRequest(_ context.Context, c *Call) Verdict {
	if !isCall(c.Method) {
		// initialize, ping and the lists are not calls into a server; lists
		// are filtered item by item (Visible).
		return Verdict{Rule: "default"}
	}
	e.prepare()
	if v, decided := e.serverVerdict(c); decided {
		return v
	}
	base := e.base(c)
	var allow *Rule
	for _, r := range e.requestRules {
		if !r.matchesRequest(c, c.Arguments) {
			continue
		}
		if r.Action == Block {
			return Verdict{Decision: Block, Rule: r.Name, Reason: "content rule " + r.Name + " blocks this request" + from(r.Source)}
		}
		if allow == nil && r.Rank >= base.entry.Rank {
			allow = r
		}
	}
	if allow != nil {
		return Verdict{Decision: Allow, Rule: allow.Name, Reason: "content rule " + allow.Name + " allows this request" + from(allow.Source)}
	}
	return Verdict{Decision: base.entry.Decision, Rule: base.rule, Reason: base.reason}
}

// CheckResponse evaluates the response-phase rules on a result.
func (e *Engine) CheckResponse(_ context.Context, c *Call, result json.RawMessage) Verdict {
	e.prepare()
	var allow *Rule
	for _, r := range e.responseRules {
		if !r.matchesTarget(c) {
			continue
		}
		v, ok := rawjson.FindPath(result, r.retPath)
		if !ok || !valueMatches(v, r.retEquals, r.ReturnsMatches) {
			continue
		}
		if r.Action == Block {
			return Verdict{Decision: Block, Rule: r.Name, Reason: "content rule " + r.Name + " blocks this response" + from(r.Source)}
		}
		if allow == nil {
			allow = r
		}
	}
	if allow != nil {
		return Verdict{Decision: Allow, Rule: allow.Name, Reason: "content rule " + allow.Name + " allows this response"}
	}
	return Verdict{Rule: "default"}
}

// CheckError evaluates the response-phase rules on a JSON-RPC error that
// answers the call: what a rule keeps out of a result it keeps out of an
// error too. A rule's condition is tried on the error's message, on the
// value at its path in the error's data, and (for a regular expression) on
// every string in the data.
func (e *Engine) CheckError(_ context.Context, c *Call, message string, data json.RawMessage) Verdict {
	e.prepare()
	msg, _ := json.Marshal(message)
	for _, r := range e.responseRules {
		if r.Action != Block || !r.matchesTarget(c) {
			continue
		}
		hit := valueMatches(msg, r.retEquals, r.ReturnsMatches) && (r.retEquals != nil || r.ReturnsMatches != nil)
		if !hit && len(data) > 0 {
			if v, ok := rawjson.FindPath(data, r.retPath); ok && valueMatches(v, r.retEquals, r.ReturnsMatches) {
				hit = true
			} else if r.ReturnsMatches != nil {
				hit = rawjson.EachString(data, func(s string) bool { return r.ReturnsMatches.MatchString(s) })
			}
		}
		if hit {
			return Verdict{Decision: Block, Rule: r.Name, Reason: "content rule " + r.Name + " blocks this error response" + from(r.Source)}
		}
	}
	return Verdict{Rule: "default"}
}

// Visible reports whether a listed tool, prompt or resource may be shown:
// false when policy blocks it whatever the arguments (hide and deny).
func (e *Engine) Visible(_ context.Context, c *Call) bool {
	e.prepare()
	if _, decided := e.serverVerdict(c); decided {
		return false
	}
	base := e.base(c)
	relaxable := false
	for _, r := range e.requestRules {
		if !r.matchesTarget(c) || (r.Tool == "" && r.ResourceURI == "") {
			continue // rules on arguments alone depend on the call
		}
		if r.Action == Block && r.Argument == "" {
			return false
		}
		if r.Action == Allow && r.Rank >= base.entry.Rank {
			relaxable = true
		}
	}
	return base.entry.Decision != Block || relaxable
}

type baseDecision struct {
	entry        Entry
	rule, reason string
}

// base is the per-tool decision when there is one that may stand against the
// default, else the default. A per-tool entry from a lower rank than the
// default can tighten it but not relax it.
func (e *Engine) base(c *Call) baseDecision {
	def := baseDecision{entry: e.Default, rule: "default", reason: "default decision (" + e.Default.Decision.String() + ")" + from(e.Default.Source)}
	if c.Name == "" {
		return def
	}
	t, ok := e.Tools[c.Name]
	if !ok {
		return def
	}
	if t.Rank < e.Default.Rank && t.Decision < e.Default.Decision {
		return def
	}
	return baseDecision{entry: t, rule: "tools." + c.Name, reason: "per-tool decision (" + t.Decision.String() + ")" + from(t.Source)}
}

func from(source string) string {
	if source == "" {
		return ""
	}
	return " (set in " + source + ")"
}

func isCall(method string) bool {
	return method == "tools/call" || method == "prompts/get" || method == "resources/read"
}

// serverVerdict applies the checks nothing can override.
func (e *Engine) serverVerdict(c *Call) (Verdict, bool) {
	if c.Server == "" {
		return Verdict{Decision: Block, Rule: "namespace", Reason: "unnamespaced names are blocked"}, true
	}
	if src, ok := e.BlockedServers[c.Server]; ok {
		return Verdict{Decision: Block, Rule: "blocked_servers", Reason: "server " + c.Server + " is blocked" + from(src)}, true
	}
	if len(e.AllowedServers) > 0 {
		if _, ok := e.AllowedServers[c.Server]; !ok {
			return Verdict{Decision: Block, Rule: "allowed_servers", Reason: "server " + c.Server + " is not in allowed_servers"}, true
		}
	}
	return Verdict{}, false
}

// matchesTarget: a Block rule matches names without regard to case (fail
// closed: a server may look names up as loosely), an Allow rule exactly.
// URIs are compared in the canonical form both sides are in.
func (r *Rule) matchesTarget(c *Call) bool {
	if r.Tool != "" {
		if c.Name == "" {
			return false
		}
		if r.Action == Block {
			if !globMatch(strings.ToLower(r.Tool), strings.ToLower(c.Name)) {
				return false
			}
		} else if !globMatch(r.Tool, c.Name) {
			return false
		}
	}
	if r.ResourceURI != "" && (c.URI == "" || !globMatch(r.uriPattern, c.URI)) {
		return false
	}
	return true
}

// matchesRequest: a Block rule's argument path matches keys without regard
// to case, and any of the values so found may match (a Go server decoding
// with encoding/json takes {"TEXT": ...} for text, and others may too); an
// Allow rule's path matches keys exactly, so that it relaxes no more than
// it names.
func (r *Rule) matchesRequest(c *Call, args []byte) bool {
	if !r.matchesTarget(c) {
		return false
	}
	if r.argPath == nil {
		return true // Validate guarantees a tool or resource condition
	}
	if r.Action == Block {
		return rawjson.FindPathFold(args, r.argPath, func(v []byte) bool { return valueMatches(v, r.equals, r.Matches) })
	}
	v, ok := rawjson.FindPath(args, r.argPath)
	return ok && valueMatches(v, r.equals, r.Matches)
}

// valueMatches tests a raw JSON value; no condition means presence is
// enough. Only the value itself is decoded, never the document around it.
func valueMatches(raw []byte, equals *any, re *regexp.Regexp) bool {
	if equals != nil {
		var v any
		if json.Unmarshal(raw, &v) != nil || !reflect.DeepEqual(v, *equals) {
			return false
		}
	}
	if re != nil {
		if len(raw) < 2 || raw[0] != '"' {
			return false
		}
		var s string
		if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 {
			s = string(inner)
		} else if json.Unmarshal(raw, &s) != nil {
			return false
		}
		if !re.MatchString(s) {
			return false
		}
	}
	return true
}

// Redact is the ledger marker for a blocked request's arguments: it tells
// what was sent apart (by a digest) without storing it. The digest is an
// HMAC under key, a secret of the session never written anywhere, so that
// a guessable secret cannot be confirmed from the ledger by hashing guesses.
func Redact(key, params []byte) string {
	return fmt.Sprintf(`{"redacted_by_policy":true,"hmac_sha256":%q}`, KeyedDigest(key, params))
}

// KeyedDigest is HMAC-SHA256 of data under key, in hex.
func KeyedDigest(key, data []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(data)
	return hex.EncodeToString(m.Sum(nil))
}

// globMatch matches s against a pattern where '*' is any run of characters
// and '?' is one character, in linear time (no backtracking blow-up).
func globMatch(pattern, s string) bool {
	if !strings.ContainsAny(pattern, "*?") {
		return pattern == s
	}
	if isASCII(pattern) && isASCII(s) {
		return globMatchUnits([]byte(pattern), []byte(s))
	}
	return globMatchUnits([]rune(pattern), []rune(s))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func globMatchUnits[T byte | rune](p, s []T) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == s[si]):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
