package config

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/policy"
)

func TestParseValid(t *testing.T) {
	f, err := Parse("t.toml", []byte(`
[[mcp.servers]]
name = "everything"
command = "npx"
args = ["-y", "pkg"]
env = { A = "1" }
read_paths = ["/opt"]

[[mcp.servers]]
name = "remote"
url = "https://example.com/mcp"
headers = { X = "y" }
enabled = false

[mcp.builtin]
domain_allow = ["*.example.com"]
domain_block = ["evil.com"]
allow_private_networks = true

[mcp.timeouts]
default_secs = 5
tools = { "everything__echo" = 7 }
`))
	if err != nil {
		t.Fatal(err)
	}
	defs := f.ServerDefs()
	if len(defs) != 3 || defs[0].Name != "builtin" || !defs[0].Builtin || defs[0].Env["CAPSEM_DOMAIN_ALLOW"] != "*.example.com" ||
		defs[0].Env["CAPSEM_DOMAIN_BLOCK"] != "evil.com" || defs[0].Env["CAPSEM_HTTP_ALLOW_PRIVATE"] != "1" {
		t.Fatalf("defs: %+v", defs)
	}
	if !defs[1].Enabled || defs[2].Enabled || defs[2].Headers["X"] != "y" {
		t.Fatalf("enabled/headers: %+v", defs[1:])
	}
	read, _ := f.SandboxPaths()
	if strings.Join(read, ",") != "/opt" {
		t.Fatalf("read paths %v", read)
	}
	if f.ToolTimeouts()["everything__echo"].Seconds() != 7 {
		t.Fatal("tool timeout")
	}
}

func TestParseRejects(t *testing.T) {
	cases := []struct{ name, toml, want string }{
		{"unknown key", "[mcp]\nbogus = 1\n", "unknown key(s): mcp.bogus"},
		{"unknown server key", "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\ncomand = \"y\"\n", "mcp.servers.comand"},
		{"bad toml", "[[mcp.servers]\n", "t.toml"},
		{"wrong type", "[[mcp.servers]]\nname = 3\n", "t.toml"},
		{"empty name", "[[mcp.servers]]\ncommand = \"x\"\n", "server name is empty"},
		{"separator in name", "[[mcp.servers]]\nname = \"a__b\"\ncommand = \"x\"\n", `contains "__"`},
		{"reserved name", "[[mcp.servers]]\nname = \"builtin\"\ncommand = \"x\"\n", "reserved"},
		{"slash in name", "[[mcp.servers]]\nname = \"a/b\"\ncommand = \"x\"\n", "letters, digits"},
		{"duplicate", "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\n[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\n", "duplicate"},
		{"no transport", "[[mcp.servers]]\nname = \"a\"\n", "either command"},
		{"both transports", "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\nurl = \"http://x\"\n", "both command and url"},
		{"bad url", "[[mcp.servers]]\nname = \"a\"\nurl = \"ftp://x\"\n", "not an http(s) URL"},
		{"relative path", "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\nread_paths = [\"rel\"]\n", "not an absolute path"},
		{"bad tool timeout", "[mcp.timeouts]\ntools = { \"x\" = 1 }\n", "not a namespaced tool"},
		{"zero tool timeout", "[mcp.timeouts]\ntools = { \"a__b\" = 0 }\n", "positive"},
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

func FuzzParse(f *testing.F) {
	f.Add([]byte("[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\n"))
	f.Add([]byte("[mcp.builtin]\ndomain_allow = [\"*.x\"]\n"))
	f.Add([]byte(examplePolicy))
	f.Add([]byte("[[mcp.rules]]\naction = \"block\"\nargument = \"a.0\"\nequals = [1, {x = \"y\"}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("fuzz.toml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.toml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		// Whatever parses yields valid definitions and a usable policy: every
		// rule of the file compiles into the engine.
		for _, d := range cfg.ServerDefs()[1:] {
			if ValidateServerName(d.Name) != nil {
				t.Fatalf("invalid name %q accepted", d.Name)
			}
		}
		m := Merge([]Layer{{Path: "fuzz.toml", Rank: policy.RankUser, File: cfg}})
		if len(m.Policy.Rules) != len(cfg.MCP.Rules) {
			t.Fatalf("%d rules parsed, %d compiled", len(cfg.MCP.Rules), len(m.Policy.Rules))
		}
		c := &policy.Call{Method: "tools/call", Server: "a", Name: "a__b", Arguments: json.RawMessage(`{"a":[1,{"x":"y"}]}`)}
		m.Policy.CheckRequest(context.Background(), c)
		m.Policy.CheckResponse(context.Background(), c, json.RawMessage(`{"content":[]}`))
	})
}
