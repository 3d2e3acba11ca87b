package config

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/netpolicy"
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

// exampleNet is the [net] table as the documentation shows it.
const exampleNet = `
[net]
default = "block"                     # allow | block (default: block)
allow = ["*.github.com", "pypi.org"]  # exact names and *.suffix, case-insensitive
block = ["*.evil.example"]            # block wins over allow, in every layer
ports = [80, 443]                     # destination ports allowed (default: 80 and 443)
allow_private = ["llm.internal"]      # names that may resolve to private or loopback addresses
hosts = { "llm.internal" = "127.0.0.1" }   # fixed answers this VM's DNS gives (local services, tests)
`

func TestParseNet(t *testing.T) {
	f := mustParse(t, "user.toml", exampleNet)
	want := Net{Default: "block", Allow: []string{"*.github.com", "pypi.org"}, Block: []string{"*.evil.example"}, Ports: []int{80, 443},
		AllowPrivate: []string{"llm.internal"}, Hosts: map[string]string{"llm.internal": "127.0.0.1"}}
	if f.Net.Default != want.Default || !slices.Equal(f.Net.Allow, want.Allow) || !slices.Equal(f.Net.Block, want.Block) ||
		!slices.Equal(f.Net.Ports, want.Ports) || !slices.Equal(f.Net.AllowPrivate, want.AllowPrivate) || f.Net.Hosts["llm.internal"] != "127.0.0.1" || len(f.Net.Hosts) != 1 {
		t.Fatalf("Net = %+v, want %+v", f.Net, want)
	}
	p := Merge([]Layer{{Path: "user.toml", Rank: policy.RankUser, File: f}}).Net
	for name, allowed := range map[string]bool{"api.github.com": true, "PyPI.org.": true, "github.com": false, "x.evil.example": false, "llm.internal": false} {
		if v := p.Name(name); v.Allowed != allowed {
			t.Errorf("Name(%q) = %+v, want allowed %v", name, v, allowed)
		}
	}
	if !slices.Equal(p.Ports(), []uint16{80, 443}) || !p.PrivateAllowed("llm.internal") {
		t.Errorf("ports %v, llm.internal private %v", p.Ports(), p.PrivateAllowed("llm.internal"))
	}
	if addr, ok := p.FixedHost("llm.internal"); !ok || addr != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("FixedHost = %v, %v", addr, ok)
	}
	// "ports = []" in a file is a choice: no port at all.
	if p := Merge([]Layer{{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", "[net]\nports = []\n")}}).Net; len(p.Ports()) != 0 {
		t.Errorf("ports = [] allows %v", p.Ports())
	}
	// A file without [net] leaves the defaults.
	if p := Merge([]Layer{{Path: "user.toml", Rank: policy.RankUser, File: mustParse(t, "user.toml", "[mcp]\n")}}).Net; !slices.Equal(p.Ports(), []uint16{80, 443}) || p.Name("pypi.org").Allowed {
		t.Errorf("no [net]: ports %v, pypi.org %+v", p.Ports(), p.Name("pypi.org"))
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
		{"unknown net key", "[net]\nallowed = [\"a.example\"]\n", "unknown key(s): net.allowed"},
		{"credential without a source", "[[net.credentials]]\nhost = \"api.example\"\nheader = \"x-api-key\"\nguest_env = \"KEY\"\n", "t.toml: net.credentials[0]: source_file or source_env: one is needed"},
		{"credential key misspelt", "[[net.credentials]]\nhost = \"api.example\"\nheaders = \"x\"\n", "unknown key(s): net.credentials.headers"},
		{"credential with a relative file", "[[net.credentials]]\nhost = \"api.example\"\nheader = \"x-api-key\"\nsource_file = \"key.txt\"\nguest_env = \"KEY\"\n", `t.toml: net.credentials[0]: source_file: "key.txt" is neither absolute nor under ~/`},
		{"bad net default", "[net]\ndefault = \"warn\"\n", `t.toml: net.default: "warn" is not allow or block`},
		{"bad net allow", "[net]\nallow = [\"https://a.example/\"]\n", `t.toml: net.allow: domain pattern "https://a.example/" must be a host name, not a URL`},
		{"bad net block", "[net]\nblock = [\"*\"]\n", `t.toml: net.block: domain pattern "*"`},
		{"net port 0", "[net]\nports = [443, 0]\n", "t.toml: net.ports: 0 is not a port (1-65535)"},
		{"net port too big", "[net]\nports = [70000]\n", "t.toml: net.ports: 70000 is not a port (1-65535)"},
		{"net port not a number", "[net]\nports = [\"443\"]\n", "t.toml"},
		{"bad allow_private", "[net]\nallow_private = [\"a..b\"]\n", "t.toml: net.allow_private: domain pattern \"a..b\""},
		{"IPv6 fixed answer", "[net]\nhosts = { \"llm.internal\" = \"::1\" }\n", `t.toml: net.hosts: "llm.internal" = "::1": an IPv6 address; fixed answers are IPv4 only (the guest network is IPv4)`},
		{"bad fixed answer", "[net]\nhosts = { \"llm.internal\" = \"localhost\" }\n", `t.toml: net.hosts: "llm.internal" = "localhost": not an IPv4 address`},
		{"fixed answer not a string", "[net]\nhosts = { \"llm.internal\" = 1 }\n", "t.toml"},
		{"every net problem", "[net]\ndefault = \"x\"\nports = [0]\n", "net.ports: 0 is not a port"},
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
	f.Add([]byte(exampleNet))
	f.Add([]byte("[net]\nports = []\nallow = [\"10.0.0.1\"]\nhosts = { \"A.test.\" = \"10.0.0.2\" }\n"))
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
		// A parsed [net] table always compiles: Merge never falls back to
		// refusing everything, and every fixed answer is there.
		for _, note := range m.Notes {
			if strings.Contains(note, "does not compile") {
				t.Fatalf("a parsed [net] did not compile: %s", note)
			}
		}
		for name := range cfg.Net.Hosts {
			if addr, ok := m.Net.FixedHost(name); !ok || !addr.Is4() {
				t.Fatalf("fixed answer for %q: %v %v", name, addr, ok)
			}
		}
		for _, entry := range cfg.Net.Allow {
			name := strings.TrimSpace(entry)
			if suffix, ok := strings.CutPrefix(name, "*."); ok {
				name = "a." + suffix
			}
			if _, err := netpolicy.NormalizeHost(name); err != nil {
				continue // "a." made it too long
			}
			if v := m.Net.Name(name); !v.Allowed && !strings.Contains(v.Reason, "blocked by") {
				t.Fatalf("%q is allowed and not blocked, but refused: %+v", name, v)
			}
		}
	})
}
