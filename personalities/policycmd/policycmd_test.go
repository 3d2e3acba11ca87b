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

// mergedNet is a corp and a user file with [net] tables.
func mergedNet(t testing.TB) *config.Merged {
	t.Helper()
	corp, err := config.Parse("/etc/capsem/corp.toml", []byte(`
[net]
default = "block"
allow = ["*.github.com", "pypi.org", "llm.internal", "203.0.113.5", "127.0.0.1"]
block = ["gist.github.com"]
ports = [80, 443, 8443]
allow_private = ["llm.internal", "127.0.0.1"]
hosts = { "llm.internal" = "127.0.0.1" }
`))
	if err != nil {
		t.Fatal(err)
	}
	user, err := config.Parse("/home/u/.capsem/user.toml", []byte(`
[net]
allow = ["gist.github.com", "news.example"]
block = ["*.social.example"]
ports = [443, 8443, 22]
hosts = { "mine.test" = "10.0.0.2" }

[[net.credentials]]
host = "api.github.com"
header = "authorization"
source_file = "/nonexistent/capsem-test/github.token"
guest_env = "GITHUB_TOKEN"
`))
	if err != nil {
		t.Fatal(err)
	}
	return config.Merge([]config.Layer{
		{Path: "/home/u/.capsem/user.toml", Rank: policy.RankUser, File: user},
		{Path: "/etc/capsem/corp.toml", Rank: policy.RankCorp, File: corp},
	})
}

func TestPrintShowsNet(t *testing.T) {
	var b bytes.Buffer
	Print(&b, mergedNet(t))
	out := b.String()
	for _, want := range []string{
		"Network ([net]; a lower file can only tighten a higher one):",
		"  net.default       block (corp: /etc/capsem/corp.toml)\n",
		"  net.block         gist.github.com (corp: /etc/capsem/corp.toml)\n",
		"  net.block         *.social.example (user: /home/u/.capsem/user.toml)\n",
		"  net.allow         *.github.com (corp: /etc/capsem/corp.toml) [limited: net.block refuses some names under github.com]\n",
		`  net.allow         gist.github.com (user: /home/u/.capsem/user.toml) [no effect: gist.github.com blocked by net.block "gist.github.com" (in /etc/capsem/corp.toml)]` + "\n",
		"  net.allow         news.example (user: /home/u/.capsem/user.toml) [no effect: news.example is not in net.allow of /etc/capsem/corp.toml, whose net.default is block]\n",
		"  net.ports         80, 443, 8443 (corp: /etc/capsem/corp.toml) [in effect: the ports every file allows, 443, 8443]\n",
		"  net.ports         22, 443, 8443 (user: /home/u/.capsem/user.toml) [in effect: the ports every file allows, 443, 8443]\n",
		"  net.allow_private llm.internal (corp: /etc/capsem/corp.toml)\n",
		"  net.hosts         llm.internal = 127.0.0.1 (corp: /etc/capsem/corp.toml)\n",
		"  net.hosts         mine.test = 10.0.0.2 (user: /home/u/.capsem/user.toml) [not answered: mine.test is not in net.allow of /etc/capsem/corp.toml, whose net.default is block]\n",
		"  net.credentials   api.github.com: header authorization from source_file /nonexistent/capsem-test/github.token, guest GITHUB_TOKEN (user: /home/u/.capsem/user.toml)\n",
		"                    api.github.com: cannot be read: source_file /nonexistent/capsem-test/github.token: open /nonexistent/capsem-test/github.token: no such file or directory\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Without any [net]: the built-in defaults, said as such.
	b.Reset()
	Print(&b, merged(t))
	for _, want := range []string{
		"  net.default       block (built-in) [no file sets net.default]\n",
		"  net.ports         80, 443 (built-in) [no file sets net.ports]\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}

func TestExplainURL(t *testing.T) {
	m := mergedNet(t)
	cases := []struct {
		url  string
		want []string
	}{
		{"https://api.github.com/repos", []string{
			"connect https://api.github.com/repos (host api.github.com, port 443)\n",
			"  name:     allow by *.github.com (corp: /etc/capsem/corp.toml)\n",
			"  port:     allow by net.ports (corp: /etc/capsem/corp.toml)\n",
			"  decision: allow\n"}},
		{"https://API.GitHub.com.:22/", []string{
			"  name:     allow by *.github.com (corp: /etc/capsem/corp.toml)\n",
			"  port:     block by net.ports (corp: /etc/capsem/corp.toml): port 22 is not in net.ports (443, 8443)\n",
			"  decision: block\n"}},
		{"http://gist.github.com/x", []string{
			`  name:     block by gist.github.com (corp: /etc/capsem/corp.toml): gist.github.com blocked by net.block "gist.github.com"` + "\n",
			"  port:     block by net.ports (user: /home/u/.capsem/user.toml): port 80 is not in net.ports (443, 8443)\n",
			"  decision: block\n"}},
		{"https://www.social.example/", []string{
			`  name:     block by *.social.example (user: /home/u/.capsem/user.toml)`,
			"  decision: block\n"}},
		{"https://news.example/", []string{
			"  name:     block by net.default (corp: /etc/capsem/corp.toml): news.example is not in net.allow of /etc/capsem/corp.toml, whose net.default is block\n"}},
		{"https://llm.internal:8443/v1", []string{
			"  name:     allow by llm.internal (corp: /etc/capsem/corp.toml)\n",
			"  private:  llm.internal may resolve to private or loopback addresses (net.allow_private)\n",
			"  dns:      fixed answer 127.0.0.1 (net.hosts)\n",
			"  decision: allow\n"}},
		{"https://mine.test/", []string{
			"  dns:      fixed answer 10.0.0.2 (net.hosts), not handed out: a private address, and mine.test is not in net.allow_private\n",
			"  decision: block\n"}},
		{"https://203.0.113.5/", []string{
			"  address:  allow by 203.0.113.5 (corp: /etc/capsem/corp.toml)\n",
			"  decision: allow\n"}},
		{"http://203.0.113.5/", []string{
			"  address:  allow by 203.0.113.5 (corp: /etc/capsem/corp.toml)\n",
			"  port:     block by net.ports",
			"  decision: block\n"}},
		{"https://[::ffff:127.0.0.1]/", []string{
			"  address:  allow by 127.0.0.1 (corp: /etc/capsem/corp.toml)\n",
			"  decision: allow\n"}},
		{"https://203.0.113.6/", []string{
			"  address:  block by net.default (corp: /etc/capsem/corp.toml): 203.0.113.6 is not in net.allow",
			"  decision: block\n"}},
		{"wss://pypi.org/", []string{"(host pypi.org, port 443)", "  decision: allow\n"}},
		{"https://user:secret@pypi.org/", []string{"connect https://user:xxxxx@pypi.org/ (host pypi.org, port 443)"}},
	}
	for _, tc := range cases {
		target, err := parseURLTarget(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		var b bytes.Buffer
		ExplainURL(&b, m, target)
		for _, want := range tc.want {
			if !strings.Contains(b.String(), want) {
				t.Errorf("%s: output lacks %q:\n%s", tc.url, want, b.String())
			}
		}
		if strings.Contains(b.String(), "secret") {
			t.Errorf("%s: the password is printed:\n%s", tc.url, b.String())
		}
	}
	// No [net] in any file: everything is refused.
	target, _ := parseURLTarget("https://pypi.org/")
	var b bytes.Buffer
	ExplainURL(&b, merged(t), target)
	if want := "  name:     block by net.default (built-in): pypi.org is in no net.allow list"; !strings.Contains(b.String(), want) {
		t.Errorf("no [net]: output lacks %q:\n%s", want, b.String())
	}
}

func TestParseURLTargetRejects(t *testing.T) {
	for raw, want := range map[string]string{
		"pypi.org/simple":          "want an absolute URL",
		"https:///path":            "want an absolute URL",
		"ftp://files.example/x":    "ftp has no default port here",
		"https://pypi.org:0/":      `port "0" is not 1-65535`,
		"https://pypi.org:99999/":  `port "99999" is not 1-65535`,
		"https://pypi.org:http/":   "invalid port",
		"https://%zz.example/":     "--url",
		"ssh://git@github.com:22/": "",
	} {
		_, err := parseURLTarget(raw)
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", raw, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--url") {
			t.Errorf("%s: error %v, want one naming --url and containing %q", raw, err, want)
		}
	}
}

// TestExplainNeedsServerForMCP: --server is needed for a tool, prompt or
// resource, not for --url; the flags are checked before any file is read.
func TestExplainNeedsServerForMCP(t *testing.T) {
	err := (&ExplainCmd{Tool: "echo", Args: "{}"}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--server is required") {
		t.Errorf("--tool without --server: %v", err)
	}
	err = (&ExplainCmd{Server: "everything", Args: "{}"}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "name one of --tool, --prompt, --resource or --url") {
		t.Errorf("no target: %v", err)
	}
	err = (&ExplainCmd{URL: "pypi.org"}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "want an absolute URL") {
		t.Errorf("--url without a scheme: %v", err)
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

// FuzzParseURLTarget: an accepted URL has a host and a port in range, and
// explaining it always ends in a decision.
func FuzzParseURLTarget(f *testing.F) {
	for _, s := range []string{"https://api.github.com/x", "http://[::1]:8080/", "wss://a.example", "ftp://x", "x.example", "https://u:pw@a.example/", "http://[fe80::1%25eth0]/", "https://a:0/"} {
		f.Add(s)
	}
	m := mergedNet(f)
	f.Fuzz(func(t *testing.T, raw string) {
		target, err := parseURLTarget(raw)
		if err != nil {
			if !strings.Contains(err.Error(), "--url") {
				t.Fatalf("error does not name --url: %v", err)
			}
			return
		}
		if target.Host == "" || target.Port == 0 {
			t.Fatalf("accepted %q as %+v", raw, target)
		}
		var b bytes.Buffer
		ExplainURL(&b, m, target)
		if !strings.Contains(b.String(), "  decision: ") {
			t.Fatalf("no decision for %q:\n%s", raw, b.String())
		}
	})
}
