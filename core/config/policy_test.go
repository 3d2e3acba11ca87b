package config

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/policy"
)

const examplePolicy = `
[mcp]
default = "allow"
blocked_servers = ["evil"]
allowed_servers = []
[mcp.tools]
"everything__get-env" = "block"
"everything__add" = "warn"
[[mcp.rules]]
name = "no-forbidden-echo"
action = "block"
tool = "everything__echo"
argument = "message"
equals = "forbidden"
[[mcp.rules]]
action = "block"
argument = "auth.token"
matches = "^sk-[A-Za-z0-9]+"
[[mcp.rules]]
action = "block"
resource_uri = "capsem://everything/demo://resource/static/*"
[[mcp.rules]]
action = "block"
tool = "everything__*"
returns = "content.0.text"
returns_matches = "password"
[[mcp.rules]]
action = "block"
tool = "everything__add"
argument = "opts"
equals = { a = 1, b = [true, "x"] }
`

func mustParse(t *testing.T, name, text string) *File {
	t.Helper()
	f, err := Parse(name, []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func check(e *policy.Engine, name, args string) policy.Verdict {
	server, _, _ := strings.Cut(name, "__")
	return e.CheckRequest(context.Background(), &policy.Call{Method: "tools/call", Server: server, Name: name, Arguments: json.RawMessage(args)})
}

func TestPolicyFromTOML(t *testing.T) {
	m := Merge([]Layer{{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", examplePolicy)}})
	cases := []struct {
		tool, args string
		want       policy.Decision
		rule       string
	}{
		{"evil__x", `{}`, policy.Block, "blocked_servers"},
		{"everything__get-env", `{}`, policy.Block, "tools.everything__get-env"},
		{"everything__add", `{"a":1}`, policy.Warn, "tools.everything__add"},
		{"everything__add", `{"opts":{"b":[true,"x"],"a":1.0}}`, policy.Block, "rules[4]"},
		{"everything__echo", `{"message":"forbidden"}`, policy.Block, "no-forbidden-echo"},
		{"everything__echo", `{"message":"fine"}`, policy.Allow, "default"},
		{"other__x", `{"auth":{"token":"sk-abc"}}`, policy.Block, "user.rules[1]"},
	}
	for _, tc := range cases {
		v := check(m.Policy, tc.tool, tc.args)
		if v.Decision != tc.want || !strings.HasSuffix(v.Rule, tc.rule) {
			t.Errorf("%s %s: got %s by %q, want %s by %q", tc.tool, tc.args, v.Decision, v.Rule, tc.want, tc.rule)
		}
	}
	if v := m.Policy.CheckResponse(context.Background(), &policy.Call{Method: "tools/call", Server: "everything", Name: "everything__echo"},
		json.RawMessage(`{"content":[{"type":"text","text":"my password"}]}`)); v.Decision != policy.Block {
		t.Errorf("return rule: %+v", v)
	}
}

func TestPolicyRejects(t *testing.T) {
	cases := []struct{ name, toml, want string }{
		{"bad default", "[mcp]\ndefault = \"maybe\"\n", `mcp.default: "maybe" is not a decision`},
		{"bad tool decision", "[mcp.tools]\n\"a__b\" = \"ask\"\n", `mcp.tools."a__b": "ask" is not a decision`},
		{"unnamespaced tool", "[mcp.tools]\n\"ab\" = \"block\"\n", `"ab" is not a namespaced name`},
		{"bad blocked server", "[mcp]\nblocked_servers = [\"a__b\"]\n", "mcp.blocked_servers"},
		{"rule without action", "[[mcp.rules]]\ntool = \"a__b\"\n", "mcp.rules[0]: action: missing"},
		{"rule bad action", "[[mcp.rules]]\naction = \"warn\"\ntool = \"a__b\"\n", `action: "warn" is not allow or block`},
		{"rule without condition", "[[mcp.rules]]\naction = \"block\"\n", "needs at least one of"},
		{"equals without argument", "[[mcp.rules]]\naction = \"block\"\ntool = \"a__b\"\nequals = 1\n", "need argument"},
		{"bad regex", "[[mcp.rules]]\naction = \"block\"\nargument = \"a\"\nmatches = \"(\"\n", "matches: error parsing regexp"},
		{"unknown rule key", "[[mcp.rules]]\naction = \"block\"\ntool = \"a\"\nargs = \"x\"\n", "mcp.rules.args"},
		{"duplicate rule name", "[[mcp.rules]]\nname = \"r\"\naction = \"block\"\ntool = \"a\"\n[[mcp.rules]]\nname = \"r\"\naction = \"block\"\ntool = \"b\"\n", "duplicate rule name"},
		{"both phases", "[[mcp.rules]]\naction = \"block\"\nargument = \"a\"\nreturns = \"b\"\n", "cannot be combined"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.toml", []byte(tc.toml))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "t.toml") {
				t.Fatalf("got %v, want an error naming the file and containing %q", err, tc.want)
			}
		})
	}
}

func TestCorpOverUser(t *testing.T) {
	corp := `
[mcp]
default = "block"
blocked_servers = ["evil"]
allowed_servers = ["everything", "evil", "corpsrv"]
[mcp.tools]
"everything__echo" = "allow"
"everything__add" = "warn"
[[mcp.rules]]
name = "corp-no-secrets"
action = "block"
argument = "secret"
[[mcp.servers]]
name = "corpsrv"
url = "https://corp.example/mcp"
enabled = false
[mcp.builtin]
domain_block = ["corp-bad.example"]
allow_private_networks = false
`
	user := `
[mcp]
default = "allow"
allowed_servers = ["everything", "evil", "mine"]
[mcp.tools]
"everything__echo" = "block"
"everything__add" = "allow"
"everything__print" = "allow"
[[mcp.rules]]
name = "user-allows-zzz"
action = "allow"
tool = "everything__zzz"
[[mcp.rules]]
name = "user-allows-add"
action = "allow"
tool = "everything__add"
[[mcp.servers]]
name = "corpsrv"
url = "https://user.example/mcp"
[[mcp.servers]]
name = "evil"
command = "/bin/evil"
[mcp.builtin]
domain_block = ["user-bad.example"]
domain_allow = ["*.example"]
allow_private_networks = true
`
	m := Merge([]Layer{
		{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", user)},
		{Path: "corp.toml", Rank: policy.RankCorp, File: mustParse(t, "corp.toml", corp)},
	})
	cases := []struct {
		name, tool, args string
		want             policy.Decision
		rule             string
	}{
		{"corp default block beats user default allow", "everything__other", `{}`, policy.Block, "default"},
		{"user per-tool allow cannot relax corp default", "everything__print", `{}`, policy.Block, "default"},
		{"user may tighten a corp per-tool allow", "everything__echo", `{}`, policy.Block, "tools.everything__echo"},
		{"user cannot relax a corp per-tool warn, not even by a rule", "everything__add", `{}`, policy.Warn, "tools.everything__add"},
		{"user allow rule cannot relax corp default", "everything__zzz", `{}`, policy.Block, "default"},
		{"corp block rule beats user allow rule", "everything__add", `{"secret":1}`, policy.Block, "corp-no-secrets"},
		{"corp-blocked server stays blocked though the user defines it", "evil__x", `{}`, policy.Block, "blocked_servers"},
		{"whitelists intersect: user-only entry is not allowed", "mine__x", `{}`, policy.Block, "allowed_servers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := check(m.Policy, tc.tool, tc.args)
			if v.Decision != tc.want || v.Rule != tc.rule {
				t.Fatalf("got %s by %q (%s), want %s by %q", v.Decision, v.Rule, v.Reason, tc.want, tc.rule)
			}
		})
	}
	defs := m.File.ServerDefs()
	byName := map[string]bool{}
	for _, d := range defs {
		byName[d.Name] = d.Enabled
		if d.Name == "corpsrv" && d.URL != "https://corp.example/mcp" {
			t.Errorf("user redefined corp's server: %+v", d)
		}
	}
	if byName["corpsrv"] || byName["evil"] {
		t.Errorf("a corp-disabled or corp-blocked server would start: %v", byName)
	}
	if byName["builtin"] {
		t.Errorf("builtin is outside the corp whitelist but would start")
	}
	b := m.File.MCP.Builtin
	if b.AllowPrivateNetworks || strings.Join(b.DomainBlock, ",") != "corp-bad.example,user-bad.example" || strings.Join(b.DomainAllow, ",") != "*.example" {
		t.Errorf("builtin merge: %+v", b)
	}
	if m.ServerSources["corpsrv"] != "corp.toml" || len(m.Notes) == 0 {
		t.Errorf("sources %v notes %v", m.ServerSources, m.Notes)
	}
}

func TestDisjointWhitelistsAllowNothing(t *testing.T) {
	m := Merge([]Layer{
		{Path: "corp.toml", Rank: policy.RankCorp, File: mustParse(t, "corp.toml", "[mcp]\nallowed_servers = [\"a\"]\n[[mcp.servers]]\nname = \"a\"\ncommand = \"/x\"\n")},
		{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", "[mcp]\nallowed_servers = [\"b\"]\n")},
	})
	if v := check(m.Policy, "a__x", `{}`); v.Decision != policy.Block {
		t.Fatalf("disjoint whitelists allowed a: %+v", v)
	}
	for _, d := range m.File.ServerDefs() {
		if d.Enabled {
			t.Fatalf("%s would start", d.Name)
		}
	}
}

func TestLoadHierarchy(t *testing.T) {
	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	write := func(rel, text string) string {
		p := filepath.Join(dir, rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	corp := write("corp.toml", "[mcp]\nblocked_servers = [\"fromclaude\"]\n[net]\nblock = [\"*.evil.example\"]\nports = [443]\n")
	user := write("capsem/user.toml", "[[mcp.servers]]\nname = \"gem\"\ncommand = \"/usr/bin/true\"\n[net]\nallow = [\"pypi.org\", \"x.evil.example\"]\n")
	write("home/.claude.json", `{"mcpServers":{
		"fromclaude":{"command":"npx","args":["-y","x"],"env":{"K":"V"}},
		"remote":{"type":"http","url":"https://r.example/mcp","headers":{"X":"1"}},
		"capsem":{"command":"/usr/local/bin/capsem","args":["mcp"]},
		"relay":{"command":"/opt/bin/capsem-mcp-server"},
		"old":{"type":"sse","url":"https://s.example/sse"},
		"bad__name":{"command":"x"}}}`)
	write("home/.claude/settings.json", `{"mcpServers":{"remote":{"url":"https://dup.example/mcp"}}}`)
	write("home/.gemini/settings.json", `{"mcpServers":{"gem":{"command":"gemini-tool"}}}`)

	env := map[string]string{"CAPSEM_CORP_CONFIG": corp}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	src, err := DefaultSources(lookup, filepath.Join(dir, "capsem"), home, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if src.UserPath != user || src.CorpPath != corp || !src.CorpRequired {
		t.Fatalf("sources %+v", src)
	}
	m, err := LoadHierarchy(src)
	if err != nil {
		t.Fatal(err)
	}
	sources := func(capsemHome, configPath string, autodetect bool) Sources {
		t.Helper()
		s, err := DefaultSources(lookup, capsemHome, home, configPath, autodetect)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	got := map[string]string{}
	for _, s := range m.File.MCP.Servers {
		got[s.Name] = s.Command + s.URL
	}
	want := map[string]string{"gem": "/usr/bin/true", "fromclaude": "npx", "remote": "https://r.example/mcp"}
	if len(got) != len(want) {
		t.Fatalf("servers %v, want %v (notes %v)", got, want, m.Notes)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("servers %v, want %v", got, want)
		}
	}
	if m.ServerSources["gem"] != user {
		t.Errorf("user.toml must win over gemini settings: %v", m.ServerSources)
	}
	notes := strings.Join(m.Notes, "\n")
	for _, want := range []string{`"capsem" skipped`, `"relay" skipped: it is capsem itself`, `"old" skipped: SSE`, `"bad__name" skipped`, `"remote" skipped: already detected`, `"gem" from ` + home} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	if v := check(m.Policy, "fromclaude__x", `{}`); v.Decision != policy.Block {
		t.Errorf("corp block of an auto-detected server: %+v", v)
	}
	if v := m.Net.Name("pypi.org"); !v.Allowed || v.Source != user {
		t.Errorf("the user's allow: %+v", v)
	}
	if v := m.Net.Name("x.evil.example"); v.Allowed || v.Source != corp {
		t.Errorf("corp's block: %+v", v)
	}
	if v := m.Net.Port(80); v.Allowed || v.Source != corp {
		t.Errorf("corp's ports: %+v", v)
	}
	// Explicitly named files must exist; an absent default user.toml is fine.
	env["CAPSEM_CORP_CONFIG"] = filepath.Join(dir, "missing.toml")
	if _, err := LoadHierarchy(sources(dir, "", false)); err == nil || !strings.Contains(err.Error(), "missing.toml") {
		t.Errorf("missing corp file: %v", err)
	}
	// Set but empty would drop the corp layer without a word: refused.
	env["CAPSEM_CORP_CONFIG"] = ""
	if _, err := DefaultSources(lookup, dir, home, "", false); err == nil || !strings.Contains(err.Error(), "CAPSEM_CORP_CONFIG is set but empty") {
		t.Errorf("empty CAPSEM_CORP_CONFIG: %v", err)
	}
	// An empty corp file is how to say "no corp policy".
	env["CAPSEM_CORP_CONFIG"] = write("empty-corp.toml", "")
	if _, err := LoadHierarchy(sources(filepath.Join(dir, "nohome"), "", false)); err != nil {
		t.Errorf("an empty corp file, no user file: %v", err)
	}
	if _, err := LoadHierarchy(sources(dir, filepath.Join(dir, "nope.toml"), false)); err == nil {
		t.Error("a missing --config file must be an error")
	}
	// A broken settings file of another tool is a note, not a failure.
	write("home/.gemini/settings.json", `{not json`)
	m, err = LoadHierarchy(sources(dir, "", true))
	if err != nil || !strings.Contains(strings.Join(m.Notes, "\n"), "not valid JSON") {
		t.Errorf("broken settings: %v %v", err, m.Notes)
	}
}

// TestREADMEExamplesParse keeps the documented configuration honest: every
// TOML block in the README is a valid configuration.
func TestREADMEExamplesParse(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(data), "```toml\n")[1:]
	if len(blocks) < 2 {
		t.Fatalf("found %d TOML examples in the README, want the gateway and the policy examples", len(blocks))
	}
	for i, b := range blocks {
		text, _, _ := strings.Cut(b, "```")
		f, err := Parse("README example", []byte(text))
		if err != nil {
			t.Errorf("README TOML block %d: %v", i, err)
			continue
		}
		Merge([]Layer{{Path: "README", Rank: policy.RankUser, File: f}})
	}
}

// TestNetCorpOverUser: the [net] tables of corp.toml and user.toml merge so
// that the user file can only tighten corp's.
func TestNetCorpOverUser(t *testing.T) {
	corp := `
[net]
default = "block"
allow = ["*.github.com", "pypi.org", "llm.internal", "*.corp.example"]
block = ["gist.github.com"]
ports = [80, 443, 8443]
allow_private = ["*.internal"]
hosts = { "llm.internal" = "10.0.0.9" }
`
	user := `
[net]
default = "allow"
allow = ["gist.github.com", "news.example"]
block = ["*.corp.example"]
ports = [443, 8443, 22]
allow_private = ["llm.internal", "nas.lan"]
hosts = { "LLM.internal" = "127.0.0.1", "mine.test" = "127.0.0.2" }
`
	m := Merge([]Layer{
		{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", user)},
		{Path: "corp.toml", Rank: policy.RankCorp, File: mustParse(t, "corp.toml", corp)},
	})
	p := m.Net
	cases := []struct {
		name, host   string
		allowed      bool
		rule, source string
	}{
		{"corp allows", "api.github.com", true, "*.github.com", "corp.toml"},
		{"user allow cannot relax a corp block", "gist.github.com", false, "gist.github.com", "corp.toml"},
		{"user allow cannot relax a corp default block", "news.example", false, "net.default", "corp.toml"},
		{"user default allow cannot relax a corp default block", "other.example", false, "net.default", "corp.toml"},
		{"user block tightens", "x.corp.example", false, "*.corp.example", "user.toml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := p.Name(tc.host)
			if v.Allowed != tc.allowed || v.Rule != tc.rule || v.Source != tc.source {
				t.Fatalf("Name(%q) = %+v, want allowed %v by %q from %s", tc.host, v, tc.allowed, tc.rule, tc.source)
			}
		})
	}
	if got := p.Ports(); len(got) != 2 || got[0] != 443 || got[1] != 8443 {
		t.Errorf("ports %v, want the intersection [443 8443]", got)
	}
	if v := p.Port(22); v.Allowed || v.Source != "corp.toml" {
		t.Errorf("port 22 (only the user allows it): %+v", v)
	}
	if !p.PrivateAllowed("llm.internal") || p.PrivateAllowed("db.internal") || p.PrivateAllowed("nas.lan") {
		t.Errorf("allow_private: llm %v db %v nas %v", p.PrivateAllowed("llm.internal"), p.PrivateAllowed("db.internal"), p.PrivateAllowed("nas.lan"))
	}
	if addr, _ := p.FixedHost("llm.internal"); addr.String() != "10.0.0.9" {
		t.Errorf("corp's fixed answer must win: %v", addr)
	}
	if addr, _ := p.FixedHost("mine.test"); addr.String() != "127.0.0.2" {
		t.Errorf("the user's own fixed answer: %v", addr)
	}
	var shadowed bool
	for _, e := range p.Entries() {
		if e.Key == "net.hosts" && e.Source == "user.toml" && e.Value == "llm.internal = 127.0.0.1" {
			shadowed = e.Note == "shadowed by the answer in corp.toml"
		}
	}
	if !shadowed {
		t.Errorf("the user's llm.internal answer is not shown as shadowed: %+v", p.Entries())
	}
}

func TestNetDisjointPortsNoted(t *testing.T) {
	m := Merge([]Layer{
		{Path: "corp.toml", Rank: policy.RankCorp, File: mustParse(t, "corp.toml", "[net]\nports = [443]\n")},
		{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", "[net]\nports = [80]\n")},
	})
	if len(m.Net.Ports()) != 0 || !strings.Contains(strings.Join(m.Notes, "\n"), "net.ports lists have no port in common") {
		t.Errorf("ports %v, notes %v", m.Net.Ports(), m.Notes)
	}
}

// TestNetBuiltInCodeFailsClosed: Parse refuses a [net] table that does not
// compile, so only a File built in code can reach Merge with one; Merge then
// refuses everything rather than dropping that file's block list.
func TestNetBuiltInCodeFailsClosed(t *testing.T) {
	bad := &File{Net: Net{Default: "allow", Block: []string{"https://evil.example/"}}}
	m := Merge([]Layer{{Path: "code", Rank: policy.RankUser, File: bad}})
	if v := m.Net.Name("anything.example"); v.Allowed {
		t.Errorf("an uncompilable [net] allowed %+v", v)
	}
	if v := m.Net.Port(443); v.Allowed {
		t.Errorf("an uncompilable [net] allowed port 443: %+v", v)
	}
	if !strings.Contains(strings.Join(m.Notes, "\n"), "[net] does not compile, so the guest network refuses everything: code: net.block") {
		t.Errorf("notes %v", m.Notes)
	}
	// Built in code, empty lists are "not set" (auto-detected layers have
	// no [net] and must not turn every port off).
	m = Merge([]Layer{{Path: "auto", Rank: policy.RankAuto, File: &File{MCP: MCP{Servers: []Server{{Name: "a", Command: "/x"}}}}}})
	if got := m.Net.Ports(); len(got) != 2 {
		t.Errorf("an auto-detected layer changed the ports: %v", got)
	}
}
