package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Rule is a content rule: every condition that is set must match. Rules are
// evaluated after the server-level checks; among matching rules a Block wins
// over an Allow.
type Rule struct {
	Name   string
	Action Decision // Allow or Block
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
	// ReturnsEquals / ReturnsMatches the value must match too.
	Returns        string
	ReturnsEquals  json.RawMessage
	ReturnsMatches *regexp.Regexp
}

// responsePhase reports whether the rule looks at results.
func (r *Rule) responsePhase() bool { return r.Returns != "" }

// Engine is an immutable, evaluated-in-memory policy. It implements Hook.
type Engine struct {
	Default        Decision
	BlockedServers map[string]bool
	AllowedServers map[string]bool // empty: every server not blocked
	Tools          map[string]Decision
	Rules          []Rule
}

var _ Hook = (*Engine)(nil)

// CheckRequest evaluates a request: blocked servers, the allowed-servers
// whitelist, content rules (deny over allow), the per-tool decision, then
// the default.
func (e *Engine) CheckRequest(_ context.Context, c *Call) Verdict {
	if !isCall(c.Method) {
		// initialize, ping and the lists are not calls into a server; lists
		// are filtered item by item with the same rules.
		return Verdict{Rule: "default"}
	}
	if v, decided := e.serverVerdict(c); decided {
		return v
	}
	var args any
	if len(c.Arguments) > 0 {
		_ = json.Unmarshal(c.Arguments, &args)
	}
	var allow *Rule
	for i := range e.Rules {
		r := &e.Rules[i]
		if r.responsePhase() || !r.matchesRequest(c, args) {
			continue
		}
		if r.Action == Block {
			return Verdict{Decision: Block, Rule: r.Name, Reason: "content rule " + r.Name + " blocks this request"}
		}
		if allow == nil {
			allow = r
		}
	}
	if allow != nil {
		return Verdict{Decision: Allow, Rule: allow.Name, Reason: "content rule " + allow.Name + " allows this request"}
	}
	if c.Name != "" {
		if d, ok := e.Tools[c.Name]; ok {
			return Verdict{Decision: d, Rule: "tools." + c.Name, Reason: "per-tool decision"}
		}
	}
	return Verdict{Decision: e.Default, Rule: "default", Reason: "default decision"}
}

// CheckResponse evaluates the response-phase rules on a result.
func (e *Engine) CheckResponse(_ context.Context, c *Call, result json.RawMessage) Verdict {
	var res any
	parsed := false
	var allow *Rule
	for i := range e.Rules {
		r := &e.Rules[i]
		if !r.responsePhase() || !r.matchesTarget(c) {
			continue
		}
		if !parsed {
			_ = json.Unmarshal(result, &res)
			parsed = true
		}
		v, ok := lookup(res, r.Returns)
		if !ok || !valueMatches(v, r.ReturnsEquals, r.ReturnsMatches) {
			continue
		}
		if r.Action == Block {
			return Verdict{Decision: Block, Rule: r.Name, Reason: "content rule " + r.Name + " blocks this response"}
		}
		if allow == nil {
			allow = r
		}
	}
	if allow != nil {
		return Verdict{Decision: Allow, Rule: allow.Name}
	}
	return Verdict{Rule: "default"}
}

func isCall(method string) bool {
	return method == "tools/call" || method == "prompts/get" || method == "resources/read"
}

// serverVerdict applies the checks nothing can override.
func (e *Engine) serverVerdict(c *Call) (Verdict, bool) {
	if c.Server == "" {
		return Verdict{Decision: Block, Rule: "namespace", Reason: "unnamespaced names are blocked"}, true
	}
	if e.BlockedServers[c.Server] {
		return Verdict{Decision: Block, Rule: "blocked_servers", Reason: "server " + c.Server + " is blocked"}, true
	}
	if len(e.AllowedServers) > 0 && !e.AllowedServers[c.Server] {
		return Verdict{Decision: Block, Rule: "allowed_servers", Reason: "server " + c.Server + " is not in allowed_servers"}, true
	}
	return Verdict{}, false
}

func (r *Rule) matchesTarget(c *Call) bool {
	if r.Tool != "" {
		if c.Name == "" {
			return false
		}
		if !globMatch(r.Tool, c.Name) {
			return false
		}
	}
	if r.ResourceURI != "" {
		if c.URI == "" {
			return false
		}
		if !globMatch(r.ResourceURI, c.URI) {
			return false
		}
	}
	return true
}

func (r *Rule) matchesRequest(c *Call, args any) bool {
	if !r.matchesTarget(c) {
		return false
	}
	if r.Argument == "" {
		return r.Tool != "" || r.ResourceURI != ""
	}
	v, ok := lookup(args, r.Argument)
	return ok && valueMatches(v, r.Equals, r.Matches)
}

// valueMatches: no condition means presence is enough.
func valueMatches(v any, equals json.RawMessage, re *regexp.Regexp) bool {
	if len(equals) > 0 {
		var want any
		if json.Unmarshal(equals, &want) != nil {
			return false
		}
		a, _ := json.Marshal(v)
		b, _ := json.Marshal(want)
		if !bytes.Equal(a, b) {
			return false
		}
	}
	if re != nil {
		s, ok := v.(string)
		if !ok || !re.MatchString(s) {
			return false
		}
	}
	return true
}

// lookup follows a dot path (object keys and array indexes) through a
// decoded JSON value, in full: nothing is truncated before matching.
func lookup(v any, dotPath string) (any, bool) {
	if dotPath == "" {
		return v, true
	}
	for _, part := range strings.Split(dotPath, ".") {
		switch cur := v.(type) {
		case map[string]any:
			next, ok := cur[part]
			if !ok {
				return nil, false
			}
			v = next
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(cur) {
				return nil, false
			}
			v = cur[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// Redact is the ledger marker for a blocked request's arguments: it proves
// what was sent (by hash) without storing it.
func Redact(params []byte) string {
	sum := sha256.Sum256(params)
	return fmt.Sprintf(`{"redacted_by_policy":true,"sha256":%q}`, hex.EncodeToString(sum[:]))
}

// globMatch matches s against a pattern where '*' is any run of characters
// and '?' is one character, in linear time (no backtracking blow-up).
func globMatch(pattern, s string) bool {
	p, i := []rune(pattern), []rune(s)
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(i) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == i[si]):
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
