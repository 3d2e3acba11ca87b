package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/rawjson/rawjsontest"
)

func call(method, name string, args string) *Call {
	c := &Call{Method: method, Name: name, Arguments: json.RawMessage(args)}
	c.Server, _, _ = strings.Cut(name, "__")
	if !strings.Contains(name, "__") {
		c.Server = ""
	}
	return c
}

func allow(src Rank) Entry { return Entry{Decision: Allow, Rank: src} }
func block(src Rank) Entry { return Entry{Decision: Block, Rank: src} }
func warn(src Rank) Entry  { return Entry{Decision: Warn, Rank: src} }

func TestEngineRequestPrecedence(t *testing.T) {
	e := &Engine{
		Default:        allow(RankUser),
		BlockedServers: map[string]string{"evil": "corp.toml"},
		Tools:          map[string]Entry{"everything__get-env": block(RankUser), "everything__add": warn(RankUser)},
		Rules: []Rule{
			{Name: "no-bad-message", Action: Block, Tool: "everything__echo", Argument: "message", Equals: json.RawMessage(`"forbidden"`)},
			{Name: "no-keys", Action: Block, Argument: "auth.token", Matches: regexp.MustCompile(`^sk-[A-Za-z0-9]+`)},
			{Name: "allow-echo", Action: Allow, Rank: RankUser, Tool: "everything__echo"},
			{Name: "allow-env-for-debug", Action: Allow, Rank: RankUser, Tool: "everything__get-env", Argument: "debug", Equals: json.RawMessage(`true`)},
			{Name: "no-static", Action: Block, ResourceURI: "capsem://everything/demo://resource/static/*"},
			{Name: "no-pad-arg", Action: Block, Argument: "pad"},
			{Name: "num", Action: Block, Tool: "everything__add", Argument: "a", Equals: json.RawMessage(`5.0`)},
			{Name: "nested-object", Action: Block, Argument: "cfg", Equals: json.RawMessage(`{"b":[1,2],"a":true}`)},
		},
	}
	big := `{"message":"hi","pad":"` + strings.Repeat("x", 900<<10) + `"}`
	cases := []struct {
		name     string
		call     *Call
		decision Decision
		rule     string
	}{
		{"blocked server beats every allow", call("tools/call", "evil__echo", `{}`), Block, "blocked_servers"},
		{"unnamespaced tool", call("tools/call", "echo", `{}`), Block, "namespace"},
		{"per-tool block", call("tools/call", "everything__get-env", `{}`), Block, "tools.everything__get-env"},
		{"per-tool warn", call("tools/call", "everything__add", `{"a":1}`), Warn, "tools.everything__add"},
		{"default allow", call("tools/call", "everything__other", `{}`), Allow, "default"},
		{"argument value rule", call("tools/call", "everything__echo", `{"message":"forbidden"}`), Block, "no-bad-message"},
		{"allow rule when no deny", call("tools/call", "everything__echo", `{"message":"fine"}`), Allow, "allow-echo"},
		{"allow rule overrides per-tool block of its rank", call("tools/call", "everything__get-env", `{"debug":true}`), Allow, "allow-env-for-debug"},
		{"allow rule needs its condition", call("tools/call", "everything__get-env", `{"debug":false}`), Block, "tools.everything__get-env"},
		{"regex on a nested argument", call("tools/call", "everything__x", `{"auth":{"token":"sk-abc123"}}`), Block, "no-keys"},
		{"regex needs a string", call("tools/call", "everything__x", `{"auth":{"token":42}}`), Allow, "default"},
		{"argument name at any size", call("tools/call", "everything__x", big), Block, "no-pad-arg"},
		{"JSON number equality ignores notation", call("tools/call", "everything__add", `{"a":5}`), Block, "num"},
		{"JSON object equality ignores key order", call("tools/call", "everything__x", `{"cfg":{"a":true,"b":[1,2]}}`), Block, "nested-object"},
		{"JSON equality is exact", call("tools/call", "everything__x", `{"cfg":{"a":true,"b":[2,1]}}`), Allow, "default"},
		{"resource URI glob", &Call{Method: "resources/read", Server: "everything", URI: "capsem://everything/demo://resource/static/document/a.md"}, Block, "no-static"},
		{"resource URI outside the glob", &Call{Method: "resources/read", Server: "everything", URI: "capsem://everything/demo://resource/dynamic/1"}, Allow, "default"},
		{"lists are not calls", &Call{Method: "tools/list"}, Allow, "default"},
		{"invalid JSON arguments match no argument rule", call("tools/call", "everything__x", `{"pad":`), Allow, "default"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := e.CheckRequest(context.Background(), tc.call)
			if v.Decision != tc.decision || v.Rule != tc.rule {
				t.Fatalf("got %s by %q, want %s by %q", v.Decision, v.Rule, tc.decision, tc.rule)
			}
			if v.Decision == Block && strings.Contains(v.Reason, "forbidden") {
				t.Fatalf("the reason repeats the blocked data: %q", v.Reason)
			}
		})
	}
	wl := &Engine{AllowedServers: map[string]string{"everything": "user.toml"}}
	if v := wl.CheckRequest(context.Background(), call("tools/call", "other__x", `{}`)); v.Decision != Block || v.Rule != "allowed_servers" {
		t.Fatalf("whitelist: %+v", v)
	}
	if v := wl.CheckRequest(context.Background(), call("tools/call", "everything__x", `{}`)); v.Decision != Allow {
		t.Fatalf("whitelisted server: %+v", v)
	}
	blockAll := &Engine{Default: block(RankUser)}
	if v := blockAll.CheckRequest(context.Background(), call("tools/call", "a__b", `{}`)); v.Decision != Block || v.Rule != "default" {
		t.Fatalf("default block: %+v", v)
	}
}

// TestEngineRanks: a lower-ranked source can tighten but never relax what a
// higher-ranked one decided.
func TestEngineRanks(t *testing.T) {
	cases := []struct {
		name     string
		engine   *Engine
		tool     string
		decision Decision
		rule     string
	}{
		{"user per-tool allow cannot relax corp default block",
			&Engine{Default: block(RankCorp), Tools: map[string]Entry{"s__t": allow(RankUser)}}, "s__t", Block, "default"},
		{"user per-tool block tightens corp default allow",
			&Engine{Default: allow(RankCorp), Tools: map[string]Entry{"s__t": block(RankUser)}}, "s__t", Block, "tools.s__t"},
		{"user per-tool warn tightens corp default allow",
			&Engine{Default: allow(RankCorp), Tools: map[string]Entry{"s__t": warn(RankUser)}}, "s__t", Warn, "tools.s__t"},
		{"corp per-tool allow relaxes corp default block",
			&Engine{Default: block(RankCorp), Tools: map[string]Entry{"s__t": allow(RankCorp)}}, "s__t", Allow, "tools.s__t"},
		{"user allow rule cannot relax corp per-tool block",
			&Engine{Tools: map[string]Entry{"s__t": block(RankCorp)}, Rules: []Rule{{Name: "u", Action: Allow, Rank: RankUser, Tool: "s__*"}}}, "s__t", Block, "tools.s__t"},
		{"user allow rule cannot relax corp default block",
			&Engine{Default: block(RankCorp), Rules: []Rule{{Name: "u", Action: Allow, Rank: RankUser, Tool: "s__t"}}}, "s__t", Block, "default"},
		{"corp allow rule relaxes corp default block",
			&Engine{Default: block(RankCorp), Rules: []Rule{{Name: "c", Action: Allow, Rank: RankCorp, Tool: "s__t"}}}, "s__t", Allow, "c"},
		{"user block rule beats corp allow rule",
			&Engine{Rules: []Rule{{Name: "c", Action: Allow, Rank: RankCorp, Tool: "s__t"}, {Name: "u", Action: Block, Rank: RankUser, Tool: "s__t"}}}, "s__t", Block, "u"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.engine.CheckRequest(context.Background(), call("tools/call", tc.tool, `{}`))
			if v.Decision != tc.decision || v.Rule != tc.rule {
				t.Fatalf("got %s by %q (%s), want %s by %q", v.Decision, v.Rule, v.Reason, tc.decision, tc.rule)
			}
		})
	}
}

func TestEngineVisible(t *testing.T) {
	e := &Engine{
		Default:        allow(RankUser),
		BlockedServers: map[string]string{"evil": ""},
		Tools:          map[string]Entry{"s__blocked": block(RankUser), "s__conditional": block(RankUser), "s__warned": warn(RankUser)},
		Rules: []Rule{
			{Name: "hide", Action: Block, Tool: "s__hidden*"},
			{Name: "args-only", Action: Block, Tool: "s__argcheck", Argument: "x"},
			{Name: "sometimes", Action: Allow, Rank: RankUser, Tool: "s__conditional", Argument: "debug", Equals: json.RawMessage(`true`)},
			{Name: "no-static", Action: Block, ResourceURI: "capsem://s/static/*"},
			{Name: "any-tool-with-secret", Action: Block, Argument: "secret"},
		},
	}
	cases := []struct {
		call *Call
		want bool
	}{
		{&Call{Method: "tools/call", Server: "s", Name: "s__plain"}, true},
		{&Call{Method: "tools/call", Server: "evil", Name: "evil__plain"}, false},
		{&Call{Method: "tools/call", Server: "s", Name: "s__blocked"}, false},
		{&Call{Method: "tools/call", Server: "s", Name: "s__conditional"}, true},
		{&Call{Method: "tools/call", Server: "s", Name: "s__warned"}, true},
		{&Call{Method: "tools/call", Server: "s", Name: "s__hidden-one"}, false},
		{&Call{Method: "tools/call", Server: "s", Name: "s__argcheck"}, true},
		{&Call{Method: "prompts/get", Server: "s", Name: "s__hidden-prompt"}, false},
		{&Call{Method: "resources/read", Server: "s", URI: "capsem://s/static/a"}, false},
		{&Call{Method: "resources/read", Server: "s", URI: "capsem://s/dynamic/a"}, true},
	}
	for _, tc := range cases {
		if got := e.Visible(context.Background(), tc.call); got != tc.want {
			t.Errorf("Visible(%s %s%s) = %v, want %v", tc.call.Method, tc.call.Name, tc.call.URI, got, tc.want)
		}
	}
	if (&Engine{Default: block(RankUser)}).Visible(context.Background(), &Call{Method: "tools/call", Server: "s", Name: "s__x"}) {
		t.Error("default block must hide")
	}
}

func TestRuleValidate(t *testing.T) {
	cases := []struct {
		rule Rule
		want string
	}{
		{Rule{Action: Block}, "at least one of"},
		{Rule{Action: Warn, Tool: "a"}, "action"},
		{Rule{Action: Block, Equals: json.RawMessage(`1`), Tool: "a"}, "need argument"},
		{Rule{Action: Block, ReturnsMatches: regexp.MustCompile("x"), Tool: "a"}, "need returns"},
		{Rule{Action: Block, Argument: "a", Returns: "b"}, "cannot be combined"},
		{Rule{Action: Block, Tool: "a", ResourceURI: "b"}, "never match"},
		{Rule{Action: Block, Argument: "a..b"}, "empty segment"},
		{Rule{Action: Block, Argument: "a", Equals: json.RawMessage(`{`)}, "not valid JSON"},
		{Rule{Action: Block, Argument: "a.b", Equals: json.RawMessage(`"x"`)}, ""},
	}
	for _, tc := range cases {
		err := tc.rule.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: got %v, want %q", tc.rule, err, tc.want)
		}
	}
}

func TestEngineResponseRules(t *testing.T) {
	e := &Engine{Rules: []Rule{
		{Name: "no-passwords", Action: Block, Tool: "everything__*", Returns: "content.0.text", ReturnsMatches: regexp.MustCompile(`(?i)password`)},
		{Name: "no-secret-field", Action: Block, Returns: "structuredContent.secret"},
		{Name: "no-secret-text", Action: Block, Returns: "content.0.text.secret"},
		{Name: "ok-status", Action: Allow, Returns: "structuredContent.status", ReturnsEquals: json.RawMessage(`"ok"`)},
	}}
	cases := []struct {
		name, result string
		decision     Decision
		rule         string
	}{
		{"text match", `{"content":[{"type":"text","text":"the Password is x"}]}`, Block, "no-passwords"},
		{"text without match", `{"content":[{"type":"text","text":"hello"}]}`, Allow, "default"},
		{"structured field present", `{"content":[],"structuredContent":{"secret":1,"status":"ok"}}`, Block, "no-secret-field"},
		{"allow by equality", `{"content":[],"structuredContent":{"status":"ok"}}`, Allow, "ok-status"},
		{"missing path", `{"content":[]}`, Allow, "default"},
		{"not JSON", `garbage`, Allow, "default"},
		{"into JSON held as text", `{"content":[{"type":"text","text":"{\"secret\":1}"}]}`, Block, "no-secret-text"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := e.CheckResponse(context.Background(), call("tools/call", "everything__echo", `{}`), json.RawMessage(tc.result))
			if v.Decision != tc.decision || v.Rule != tc.rule {
				t.Fatalf("got %s by %q, want %s by %q", v.Decision, v.Rule, tc.decision, tc.rule)
			}
		})
	}
	// Request-phase evaluation ignores response rules.
	if v := e.CheckRequest(context.Background(), call("tools/call", "everything__echo", `{"secret":1}`)); v.Decision != Allow {
		t.Fatalf("response rule applied to a request: %+v", v)
	}
}

func TestRedactHidesTheData(t *testing.T) {
	key := []byte("the session's key")
	secret := []byte(`{"arguments":{"token":"sk-live-123"}}`)
	r := Redact(key, secret)
	if strings.Contains(r, "sk-live") || !strings.Contains(r, `"redacted_by_policy":true`) || !json.Valid([]byte(r)) {
		t.Fatalf("redaction %s", r)
	}
	if Redact(key, []byte("a")) == Redact(key, []byte("b")) {
		t.Fatal("different data must digest differently")
	}
	// Keyed: the plain SHA-256 of a guess does not confirm it, and
	// another session's key gives another digest.
	plain := sha256.Sum256(secret)
	if strings.Contains(r, hex.EncodeToString(plain[:])) {
		t.Fatal("the marker carries the plain SHA-256: a guess can be confirmed")
	}
	if Redact([]byte("another session"), secret) == r {
		t.Fatal("the digest does not depend on the key")
	}
}

func FuzzRuleMatch(f *testing.F) {
	f.Add(`{"a":{"b":[1,{"c":"sk-x"}]}}`, "a.b.1.c", `"sk-x"`, "^sk-")
	f.Add(`[]`, "0", `null`, "")
	f.Fuzz(func(t *testing.T, args, dotPath, equals, pattern string) {
		re, err := regexp.Compile(pattern)
		if err != nil {
			re = nil
		}
		rules := []Rule{{Name: "r", Action: Block, Argument: dotPath, Equals: json.RawMessage(equals), Matches: re},
			{Name: "ret", Action: Block, Returns: dotPath, ReturnsMatches: re}}
		for _, r := range rules {
			if r.Validate() != nil {
				return
			}
		}
		e := &Engine{Rules: rules}
		c := &Call{Method: "tools/call", Server: "s", Name: "s__t", Arguments: json.RawMessage(args)}
		v := e.CheckRequest(context.Background(), c)
		if v.Decision != Block && v.Decision != Allow {
			t.Fatalf("decision %v", v.Decision)
		}
		_ = e.CheckResponse(context.Background(), c, json.RawMessage(args))
		// Presence alone (no value condition) must agree with a direct decode.
		var doc any
		if json.Unmarshal([]byte(args), &doc) == nil {
			_, present := rawjsontest.Lookup(doc, strings.Split(dotPath, "."))
			presence := &Engine{Rules: []Rule{{Name: "p", Action: Block, Argument: dotPath}}}
			if got := presence.CheckRequest(context.Background(), c).Decision == Block; got != present {
				t.Fatalf("presence of %q in %s: rule says %v, lookup says %v", dotPath, args, got, present)
			}
		}
	})
}

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"everything__*", "everything__echo", true},
		{"everything__*", "other__echo", false},
		{"*__get-env", "a__get-env", true},
		{"capsem://x/demo://r/static/*", "capsem://x/demo://r/static/doc/a.md", true},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"*", "", true},
		{"", "", true},
		{"", "a", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"é*", "été", true},
	}
	for _, tc := range cases {
		if got := globMatch(tc.pattern, tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v", tc.pattern, tc.s, got)
		}
	}
}
