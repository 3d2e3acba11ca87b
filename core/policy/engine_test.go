package policy

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

func call(method, name string, args string) *Call {
	c := &Call{Method: method, Name: name, Arguments: json.RawMessage(args)}
	c.Server, _, _ = strings.Cut(name, "__")
	if !strings.Contains(name, "__") {
		c.Server = ""
	}
	return c
}

func TestEngineRequestPrecedence(t *testing.T) {
	e := &Engine{
		Default:        Allow,
		BlockedServers: map[string]bool{"evil": true},
		Tools:          map[string]Decision{"everything__get-env": Block, "everything__add": Warn},
		Rules: []Rule{
			{Name: "no-forbidden", Action: Block, Tool: "everything__echo", Argument: "message", Equals: json.RawMessage(`"forbidden"`)},
			{Name: "no-keys", Action: Block, Argument: "auth.token", Matches: regexp.MustCompile(`^sk-[A-Za-z0-9]+`)},
			{Name: "allow-echo", Action: Allow, Tool: "everything__echo"},
			{Name: "allow-env-for-debug", Action: Allow, Tool: "everything__get-env", Argument: "debug", Equals: json.RawMessage(`true`)},
			{Name: "no-static", Action: Block, ResourceURI: "capsem://everything/demo://resource/static/*"},
			{Name: "no-pad-arg", Action: Block, Argument: "pad"},
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
		{"argument value rule", call("tools/call", "everything__echo", `{"message":"forbidden"}`), Block, "no-forbidden"},
		{"deny over allow", call("tools/call", "everything__echo", `{"message":"forbidden"}`), Block, "no-forbidden"},
		{"allow rule when no deny", call("tools/call", "everything__echo", `{"message":"fine"}`), Allow, "allow-echo"},
		{"allow rule overrides per-tool block", call("tools/call", "everything__get-env", `{"debug":true}`), Allow, "allow-env-for-debug"},
		{"regex on a nested argument", call("tools/call", "everything__x", `{"auth":{"token":"sk-abc123"}}`), Block, "no-keys"},
		{"regex needs a string", call("tools/call", "everything__x", `{"auth":{"token":42}}`), Allow, "default"},
		{"argument name at any size", call("tools/call", "everything__x", big), Block, "no-pad-arg"},
		{"resource URI glob", &Call{Method: "resources/read", Server: "everything", URI: "capsem://everything/demo://resource/static/document/a.md"}, Block, "no-static"},
		{"resource URI outside the glob", &Call{Method: "resources/read", Server: "everything", URI: "capsem://everything/demo://resource/dynamic/1"}, Allow, "default"},
		{"lists are not calls", &Call{Method: "tools/list"}, Allow, "default"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := e.CheckRequest(context.Background(), tc.call)
			if v.Decision != tc.decision || v.Rule != tc.rule {
				t.Fatalf("got %s by %q, want %s by %q", v.Decision, v.Rule, tc.decision, tc.rule)
			}
		})
	}
	wl := &Engine{Default: Allow, AllowedServers: map[string]bool{"everything": true}}
	if v := wl.CheckRequest(context.Background(), call("tools/call", "other__x", `{}`)); v.Decision != Block || v.Rule != "allowed_servers" {
		t.Fatalf("whitelist: %+v", v)
	}
	if v := wl.CheckRequest(context.Background(), call("tools/call", "everything__x", `{}`)); v.Decision != Allow {
		t.Fatalf("whitelisted server: %+v", v)
	}
	blockAll := &Engine{Default: Block}
	if v := blockAll.CheckRequest(context.Background(), call("tools/call", "a__b", `{}`)); v.Decision != Block || v.Rule != "default" {
		t.Fatalf("default block: %+v", v)
	}
}

func TestEngineResponseRules(t *testing.T) {
	e := &Engine{Rules: []Rule{
		{Name: "no-passwords", Action: Block, Tool: "everything__*", Returns: "content.0.text", ReturnsMatches: regexp.MustCompile(`(?i)password`)},
		{Name: "no-secret-field", Action: Block, Returns: "structuredContent.secret"},
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
	r := Redact([]byte(`{"arguments":{"token":"sk-live-123"}}`))
	if strings.Contains(r, "sk-live") || !strings.Contains(r, `"redacted_by_policy":true`) || !json.Valid([]byte(r)) {
		t.Fatalf("redaction %s", r)
	}
	if Redact([]byte("a")) == Redact([]byte("b")) {
		t.Fatal("different data must hash differently")
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
		e := &Engine{Rules: []Rule{{Name: "r", Action: Block, Argument: dotPath, Equals: json.RawMessage(equals), Matches: re},
			{Name: "ret", Action: Block, Returns: dotPath, ReturnsMatches: re}}}
		c := &Call{Method: "tools/call", Server: "s", Name: "s__t", Arguments: json.RawMessage(args)}
		v := e.CheckRequest(context.Background(), c)
		if v.Decision != Block && v.Decision != Allow {
			t.Fatalf("decision %v", v.Decision)
		}
		_ = e.CheckResponse(context.Background(), c, json.RawMessage(args))
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
