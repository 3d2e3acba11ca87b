package policycmd

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/policy"
)

func merged(t *testing.T) *config.Merged {
	t.Helper()
	corp, err := config.Parse("/etc/capsem/corp.toml", []byte("[mcp]\ndefault = \"warn\"\nblocked_servers = [\"evil\"]\n[[mcp.rules]]\nname = \"no-keys\"\naction = \"block\"\nargument = \"key\"\nmatches = \"^sk-\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	user, err := config.Parse("/home/u/.capsem/user.toml", []byte("[mcp.tools]\n\"everything__get-env\" = \"block\"\n[[mcp.servers]]\nname = \"everything\"\ncommand = \"npx\"\nargs = [\"-y\", \"pkg\"]\n[[mcp.servers]]\nname = \"evil\"\nurl = \"https://evil.example/mcp\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	return config.Merge([]config.Layer{
		{Path: "/home/u/.capsem/user.toml", Rank: policy.RankUser, File: user},
		{Path: "/etc/capsem/corp.toml", Rank: policy.RankCorp, File: corp},
	})
}

func TestPrintShowsProvenance(t *testing.T) {
	var b bytes.Buffer
	Print(&b, merged(t))
	out := b.String()
	for _, want := range []string{
		"corp          /etc/capsem/corp.toml",
		"Default: warn (corp: /etc/capsem/corp.toml)",
		"evil (corp: /etc/capsem/corp.toml)",
		"everything__get-env = block (user: /home/u/.capsem/user.toml)",
		`no-keys: block argument=key matches="^sk-" (corp: /etc/capsem/corp.toml)`,
		"everything  stdio: npx -y pkg (user: /home/u/.capsem/user.toml)",
		"evil  http: https://evil.example/mcp (user: /home/u/.capsem/user.toml) [not started: disabled or blocked]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestExplain(t *testing.T) {
	m := merged(t)
	cases := []struct {
		call   *policy.Call
		result string
		want   []string
	}{
		{&policy.Call{Method: "tools/call", Server: "everything", Name: "everything__echo", Arguments: json.RawMessage(`{"key":"sk-1"}`)}, "",
			[]string{"listed:   true", "request:  block by no-keys"}},
		{&policy.Call{Method: "tools/call", Server: "everything", Name: "everything__get-env", Arguments: json.RawMessage(`{}`)}, "",
			[]string{"listed:   false", "request:  block by tools.everything__get-env: per-tool decision (block)"}},
		{&policy.Call{Method: "tools/call", Server: "everything", Name: "everything__echo", Arguments: json.RawMessage(`{}`)}, `{"content":[]}`,
			[]string{"request:  warn by default: default decision (warn) (set in /etc/capsem/corp.toml)", "response: allow by default"}},
		{&policy.Call{Method: "tools/call", Server: "evil", Name: "evil__x", Arguments: json.RawMessage(`{}`)}, "",
			[]string{"listed:   false", "block by blocked_servers"}},
	}
	for _, tc := range cases {
		var b bytes.Buffer
		Explain(context.Background(), &b, m.Policy, tc.call, tc.result)
		for _, want := range tc.want {
			if !strings.Contains(b.String(), want) {
				t.Errorf("%s: output lacks %q:\n%s", tc.call.Name, want, b.String())
			}
		}
	}
}

// TestExplainResourceIsCanonical: explain judges a resource as the gateway
// does, in canonical form, and refuses what the gateway refuses.
func TestExplainResourceIsCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"DEMO://resource/x/../static/1":                "capsem://everything/demo://resource/static/1",
		"capsem://everything/demo://resource/./s/1":    "capsem://everything/demo://resource/s/1",
		"CAPSEM://everything/demo://Resource/%73tatic": "capsem://everything/demo://resource/static",
	} {
		if got, err := resourceURI("everything", in); err != nil || got != want {
			t.Errorf("resourceURI(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := resourceURI("everything", "demo://resource/static/1\t"); err == nil {
		t.Error("a URI with a tab was not refused")
	}
}
