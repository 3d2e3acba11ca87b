package policycmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/policy"
	"github.com/capsem/capsem/core/reloadctl"
	"github.com/capsem/capsem/core/vmrecord"
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

// TestWithVMs: answers from VM processes are named after the service's
// records; a running VM without an answer is a failure; a stopped VM, or
// one whose process is gone, is not expected to answer.
func TestWithVMs(t *testing.T) {
	results := []reloadctl.Result{
		{PID: 30, Kind: "gateway", Name: "/tmp/gw.sock", OK: true},
		{PID: 10, Kind: "vm", Name: "dev", OK: true},
		{PID: 50, Kind: "vm", Name: "direct", OK: true}, // a VM no service runs
	}
	recs := []*vmrecord.Record{
		{VM: api.VM{ID: "vm-00000000000a", Name: "dev", State: api.StateRunning, PID: 10}},
		{VM: api.VM{ID: "vm-00000000000b", State: api.StateRunning, PID: 20}},
		{VM: api.VM{ID: "vm-00000000000c", Name: "old", State: api.StateStopped}},
		{VM: api.VM{ID: "vm-00000000000d", State: api.StateRunning, PID: 40}}, // its process died with no service to see it
	}
	alive := func(r *vmrecord.Record) bool { return r.PID != 40 }
	got := withVMs(results, recs, alive)
	want := []string{"10 vm dev (vm-00000000000a) ok", "20 vm vm-00000000000b FAILED", "30 gateway /tmp/gw.sock ok", "50 vm direct ok"}
	var lines []string
	for _, r := range got {
		status := "ok"
		if !r.OK {
			status = "FAILED"
			if !strings.Contains(r.Error, "did not answer") || !strings.Contains(r.Error, "capsem logs vm-00000000000b") {
				t.Errorf("failure %q does not say what happened and where to look", r.Error)
			}
		}
		lines = append(lines, fmt.Sprintf("%d %s %s %s", r.PID, r.Kind, r.Name, status))
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
