package policy

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"
)

// TestBlockRulesMatchKeysAndNamesWithoutCase: a Block rule's argument path
// and tool glob match whatever the case (a server may read them loosely);
// an Allow rule matches exactly, so it relaxes no more than it names.
func TestBlockRulesMatchKeysAndNamesWithoutCase(t *testing.T) {
	e := &Engine{
		Default: allow(RankUser),
		Rules: []Rule{
			{Name: "no-forbidden", Action: Block, Tool: "echo__echo", Argument: "text", Matches: regexp.MustCompile(`FORBIDDEN`)},
			{Name: "no-deep", Action: Block, Argument: "cfg.secret.kind", Equals: json.RawMessage(`"key"`)},
			{Name: "no-kill", Action: Block, Tool: "ops__kill-*"},
		},
	}
	ctx := context.Background()
	for _, c := range []struct {
		name, args string
		want       Decision
	}{
		{"echo__echo", `{"text":"FORBIDDEN"}`, Block},
		{"echo__echo", `{"TEXT":"FORBIDDEN"}`, Block},
		{"echo__echo", `{"Text":"FORBIDDEN"}`, Block},
		{"echo__echo", `{"te\u0058t":"FORBIDDEN"}`, Block},          // an escaped key
		{"echo__echo", `{"text":"fine","TEXT":"FORBIDDEN"}`, Block}, // any of the variants
		{"echo__echo", `{"TEXT":"FORBIDDEN","text":"fine"}`, Block},
		{"ECHO__Echo", `{"text":"FORBIDDEN"}`, Block}, // the tool name too
		{"echo__echo", `{"text":"fine"}`, Allow},
		{"echo__echo", `{"texts":"FORBIDDEN"}`, Allow},
		{"x__y", `{"CFG":{"Secret":{"KIND":"key"}}}`, Block},
		{"x__y", `{"cfg":{"secret":[{"kind":"key"}]}}`, Allow}, // an array is not an object
		{"x__y", `{"cfg":{"ſecret":{"kind":"key"}}}`, Block},   // U+017F folds to s, as encoding/json folds it
		{"ops__KILL-all", `{}`, Block},
		{"ops__kill-all", `{}`, Block},
		{"ops__skill", `{}`, Allow},
	} {
		if v := e.CheckRequest(ctx, call("tools/call", c.name, c.args)); v.Decision != c.want {
			t.Errorf("%s %s: %v (%s), want %v", c.name, c.args, v.Decision, v.Rule, c.want)
		}
	}
	// An Allow rule names exactly what it relaxes.
	e = &Engine{
		Default: block(RankUser),
		Rules: []Rule{
			{Name: "allow-debug", Action: Allow, Rank: RankUser, Tool: "echo__echo", Argument: "debug", Equals: json.RawMessage(`true`)},
		},
	}
	for args, want := range map[string]Decision{`{"debug":true}`: Allow, `{"DEBUG":true}`: Block, `{"Debug":true}`: Block} {
		if v := e.CheckRequest(ctx, call("tools/call", "echo__echo", args)); v.Decision != want {
			t.Errorf("allow rule on %s: %v, want %v", args, v.Decision, want)
		}
	}
	if v := e.CheckRequest(ctx, call("tools/call", "ECHO__echo", `{"debug":true}`)); v.Decision != Block {
		t.Errorf("an allow rule relaxed a name it does not name exactly: %v", v.Decision)
	}
}

// TestResourceRulesMatchCanonicalURIs: a rule's pattern is canonical, so
// it matches the canonical URIs the endpoint passes whatever the spelling
// of the pattern itself.
func TestResourceRulesMatchCanonicalURIs(t *testing.T) {
	e := &Engine{Default: allow(RankUser), Rules: []Rule{
		{Name: "no-static", Action: Block, ResourceURI: "capsem://everything/DEMO://Resource/./static/*"},
	}}
	read := func(uri string) Decision {
		return e.CheckRequest(context.Background(), &Call{Method: "resources/read", Server: "everything", URI: uri}).Decision
	}
	if d := read("capsem://everything/demo://resource/static/document/1"); d != Block {
		t.Errorf("canonical URI under a non-canonical pattern: %v", d)
	}
	if d := read("capsem://everything/demo://resource/dynamic/1"); d != Allow {
		t.Errorf("another resource: %v", d)
	}
}

// TestCheckError: a return rule keeps out of an error what it keeps out of
// a result: in the message, at its path in the data, or anywhere in the
// data for a regular expression.
func TestCheckError(t *testing.T) {
	e := &Engine{Default: allow(RankUser), Rules: []Rule{
		{Name: "no-password", Action: Block, Tool: "srv__*", Returns: "content.0.text", ReturnsMatches: regexp.MustCompile(`password-\d+`)},
		{Name: "no-code", Action: Block, Tool: "other__*", Returns: "detail.code", ReturnsEquals: json.RawMessage(`42`)},
		{Name: "allowing", Action: Allow, Tool: "srv__*", Returns: "content.0.text", ReturnsMatches: regexp.MustCompile(`.`)},
	}}
	ctx := context.Background()
	for _, c := range []struct {
		name, msg, data string
		want            Decision
	}{
		{"srv__t", "failed: password-123", ``, Block},
		{"srv__t", "failed", `{"content":[{"text":"password-9"}]}`, Block},
		{"srv__t", "failed", `{"trace":["x",{"y":"the password-77"}]}`, Block},
		{"srv__t", "failed", `{"password-1":"key, not value"}`, Allow},
		{"srv__t", "failed: nothing to see", `{"n":1}`, Allow},
		{"SRV__t", "PASSWORD-1 password-2", ``, Block},
		{"other__t", "42", ``, Allow}, // the message is the string "42", not the number 42
		{"other__t", "x", `{"detail":{"code":42}}`, Block},
		{"other__t", "x", `{"detail":{"code":41}}`, Allow},
		{"third__t", "password-1", ``, Allow},
	} {
		v := e.CheckError(ctx, call("tools/call", c.name, `{}`), c.msg, json.RawMessage(c.data))
		if v.Decision != c.want {
			t.Errorf("%s %q %s: %v (%s), want %v", c.name, c.msg, c.data, v.Decision, v.Rule, c.want)
		}
	}
}
