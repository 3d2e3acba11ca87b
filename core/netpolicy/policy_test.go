package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
)

const (
	corpFile = "/etc/capsem/corp.toml"
	userFile = "/home/u/.capsem/user.toml"
)

func mustCompile(t testing.TB, layers ...Layer) *Policy {
	t.Helper()
	p, err := Compile(layers)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyName(t *testing.T) {
	tests := []struct {
		name       string
		corp, user Layer
		host       string
		allowed    bool
		rule       string
		source     string
		reason     string // a part of the refusal's reason
	}{
		{name: "no opinion anywhere: block", host: "example.com", rule: "net.default", reason: "in no net.allow list"},
		{name: "corp allows", corp: Layer{Allow: []string{"*.github.com"}}, host: "api.github.com", allowed: true, rule: "*.github.com", source: corpFile},
		{name: "user allows what corp has no opinion on", user: Layer{Allow: []string{"pypi.org"}}, host: "pypi.org", allowed: true, rule: "pypi.org", source: userFile},
		{name: "corp block + user allow cannot relax", corp: Layer{Block: []string{"*.evil.example"}}, user: Layer{Allow: []string{"x.evil.example"}, Default: "allow"},
			host: "x.evil.example", rule: "*.evil.example", source: corpFile, reason: `blocked by net.block "*.evil.example"`},
		{name: "corp default block + user allow cannot relax", corp: Layer{Default: "block", Allow: []string{"*.github.com"}}, user: Layer{Allow: []string{"pypi.org"}},
			host: "pypi.org", rule: "net.default", source: corpFile, reason: "not in net.allow of " + corpFile + ", whose net.default is block"},
		{name: "corp default block + user default allow cannot relax", corp: Layer{Default: "block"}, user: Layer{Default: "allow"},
			host: "pypi.org", rule: "net.default", source: corpFile},
		{name: "user tightens with a block", corp: Layer{Default: "allow"}, user: Layer{Block: []string{"*.social.example"}},
			host: "www.social.example", rule: "*.social.example", source: userFile},
		{name: "user tightens with default block", corp: Layer{Allow: []string{"*.github.com", "pypi.org"}}, user: Layer{Default: "block", Allow: []string{"pypi.org"}},
			host: "api.github.com", rule: "net.default", source: userFile},
		{name: "both allow: the higher file is named", corp: Layer{Allow: []string{"pypi.org"}}, user: Layer{Default: "block", Allow: []string{"*.org"}},
			host: "pypi.org", allowed: true, rule: "pypi.org", source: corpFile},
		{name: "a pattern is named before a default", corp: Layer{Default: "allow"}, user: Layer{Allow: []string{"pypi.org"}},
			host: "pypi.org", allowed: true, rule: "pypi.org", source: userFile},
		{name: "corp default allow", corp: Layer{Default: "allow"}, host: "anything.example", allowed: true, rule: "net.default", source: corpFile},
		{name: "user allow list without a default does not tighten", corp: Layer{Default: "allow"}, user: Layer{Allow: []string{"pypi.org"}},
			host: "other.example", allowed: true, rule: "net.default", source: corpFile},
		{name: "block wins over allow in one layer", corp: Layer{Allow: []string{"*.example.com"}, Block: []string{"secret.example.com"}},
			host: "secret.example.com", rule: "secret.example.com", source: corpFile},
		{name: "block wins over default allow in one layer", user: Layer{Default: "allow", Block: []string{"evil.example"}},
			host: "evil.example", rule: "evil.example", source: userFile},
		{name: "the most specific block is named", corp: Layer{Block: []string{"*.example"}}, user: Layer{Block: []string{"*.bad.example"}},
			host: "x.bad.example", rule: "*.bad.example", source: userFile},
		{name: "wildcard does not match the apex", corp: Layer{Allow: []string{"*.github.com"}}, host: "github.com", rule: "net.default"},
		{name: "wildcard does not match a look-alike", corp: Layer{Allow: []string{"*.github.com"}}, host: "evilgithub.com", rule: "net.default"},
		{name: "wildcard does not match a longer name", corp: Layer{Allow: []string{"*.github.com"}}, host: "api.github.com.evil.net", rule: "net.default"},
		{name: "wildcard block does not match the apex", corp: Layer{Default: "allow", Block: []string{"*.evil.example"}}, host: "evil.example", allowed: true, rule: "net.default", source: corpFile},
		{name: "case-insensitive", corp: Layer{Allow: []string{"PyPI.org"}}, host: "PYPI.ORG", allowed: true, rule: "PyPI.org", source: corpFile},
		{name: "case-insensitive block", corp: Layer{Default: "allow", Block: []string{"*.Evil.Example"}}, host: "WWW.EVIL.example", rule: "*.Evil.Example", source: corpFile},
		{name: "trailing dot", corp: Layer{Allow: []string{"pypi.org."}}, host: "pypi.org.", allowed: true, rule: "pypi.org.", source: corpFile},
		{name: "trailing dot on the name only", corp: Layer{Allow: []string{"pypi.org"}}, host: "pypi.org.", allowed: true, rule: "pypi.org", source: corpFile},
		{name: "IP literal allow", corp: Layer{Allow: []string{"203.0.113.5"}}, host: "203.0.113.5", allowed: true, rule: "203.0.113.5", source: corpFile},
		{name: "IP literal is not a wildcard", corp: Layer{Allow: []string{"*.113.5.example"}}, host: "203.0.113.5", rule: "net.default"},
		{name: "invalid name", corp: Layer{Default: "allow"}, host: "a..b", reason: "invalid name"},
		{name: "inet_aton spelling", corp: Layer{Default: "allow"}, host: "127.1", reason: "invalid name"},
		{name: "non-ASCII", corp: Layer{Default: "allow"}, host: "bücher.de", reason: "not ASCII"},
		{name: "empty", corp: Layer{Default: "allow"}, host: "", reason: "invalid name"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			test.corp.Source, test.user.Source = corpFile, userFile
			v := mustCompile(t, test.corp, test.user).Name(test.host)
			if v.Allowed != test.allowed || v.Rule != test.rule || v.Source != test.source || !strings.Contains(v.Reason, test.reason) {
				t.Errorf("Name(%q) = %+v, want allowed=%v rule=%q source=%q reason containing %q", test.host, v, test.allowed, test.rule, test.source, test.reason)
			}
			if v.Allowed != (v.Reason == "") {
				t.Errorf("Name(%q) = %+v: a refusal needs a reason, an allow has none", test.host, v)
			}
		})
	}
}

// TestPolicyOrderDoesNotDecide: every rule but hosts is symmetric, so a
// user file cannot relax corp's by any ordering mistake either.
func TestPolicyOrderDoesNotDecide(t *testing.T) {
	corp := Layer{Source: corpFile, Default: "block", Allow: []string{"*.github.com", "pypi.org"}, Block: []string{"gist.github.com"}, Ports: []int{443, 8443}}
	user := Layer{Source: userFile, Default: "allow", Allow: []string{"*.evil.example"}, Ports: []int{80, 443}}
	a, b := mustCompile(t, corp, user), mustCompile(t, user, corp)
	for _, host := range []string{"api.github.com", "gist.github.com", "pypi.org", "x.evil.example", "github.com"} {
		if a.Name(host).Allowed != b.Name(host).Allowed {
			t.Errorf("%s: corp first %+v, user first %+v", host, a.Name(host), b.Name(host))
		}
	}
	if !slices.Equal(a.Ports(), b.Ports()) || !slices.Equal(a.Ports(), []uint16{443}) {
		t.Errorf("ports %v and %v, want [443]", a.Ports(), b.Ports())
	}
}

func TestPolicyPorts(t *testing.T) {
	tests := []struct {
		name       string
		corp, user Layer
		want       []uint16
		refused    uint16
		source     string // of the refusal
	}{
		{name: "default", want: []uint16{80, 443}, refused: 22},
		{name: "corp only", corp: Layer{Ports: []int{443, 22}}, want: []uint16{22, 443}, refused: 80, source: corpFile},
		{name: "user only", user: Layer{Ports: []int{8080}}, want: []uint16{8080}, refused: 443, source: userFile},
		{name: "intersection", corp: Layer{Ports: []int{80, 443, 8443}}, user: Layer{Ports: []int{443, 8443, 9000}}, want: []uint16{443, 8443}, refused: 9000, source: corpFile},
		{name: "intersection refused by user", corp: Layer{Ports: []int{80, 443}}, user: Layer{Ports: []int{443}}, want: []uint16{443}, refused: 80, source: userFile},
		{name: "user cannot widen", corp: Layer{Ports: []int{443}}, user: Layer{Ports: []int{443, 22}}, want: []uint16{443}, refused: 22, source: corpFile},
		{name: "disjoint: none", corp: Layer{Ports: []int{443}}, user: Layer{Ports: []int{80}}, want: []uint16{}, refused: 443, source: userFile},
		{name: "set but empty: none", user: Layer{PortsSet: true}, want: []uint16{}, refused: 443, source: userFile},
		{name: "duplicates", corp: Layer{Ports: []int{443, 443, 80}}, want: []uint16{80, 443}, refused: 1, source: corpFile},
		{name: "port 0 is never allowed", want: []uint16{80, 443}, refused: 0},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			test.corp.Source, test.user.Source = corpFile, userFile
			p := mustCompile(t, test.corp, test.user)
			if got := p.Ports(); !slices.Equal(got, test.want) {
				t.Errorf("Ports() = %v, want %v", got, test.want)
			}
			for _, port := range test.want {
				if v := p.Port(port); !v.Allowed || v.Rule != "net.ports" {
					t.Errorf("Port(%d) = %+v, want allowed", port, v)
				}
			}
			v := p.Port(test.refused)
			if v.Allowed || v.Rule != "net.ports" || v.Source != test.source || !strings.Contains(v.Reason, fmt.Sprintf("port %d is not in net.ports", test.refused)) {
				t.Errorf("Port(%d) = %+v, want refused by net.ports from %q", test.refused, v, test.source)
			}
		})
	}
	// Ports returns a copy: a caller cannot change the policy.
	p := Default()
	p.Ports()[0] = 22
	if !p.Port(80).Allowed || p.Port(22).Allowed {
		t.Error("changing the result of Ports changed the policy")
	}
}

func TestPolicyAddress(t *testing.T) {
	corp := Layer{Source: corpFile, Default: "block", Allow: []string{"203.0.113.5", "127.0.0.1", "10.0.0.7", "*.github.com", "169.254.169.254"},
		Block: []string{"198.51.100.1"}, AllowPrivate: []string{"127.0.0.1", "llm.internal", "169.254.169.254"}}
	user := Layer{Source: userFile, AllowPrivate: []string{"127.0.0.1", "llm.internal"}}
	p := mustCompile(t, corp, user)
	tests := []struct {
		dest    string
		allowed bool
		rule    string
		source  string
		reason  string
	}{
		{"203.0.113.5:443", true, "203.0.113.5", corpFile, ""},
		{"[::ffff:203.0.113.5]:443", true, "203.0.113.5", corpFile, ""},
		{"203.0.113.5:22", false, "net.ports", "", "port 22 is not in net.ports (80, 443)"},
		{"203.0.113.6:443", false, "net.default", corpFile, "not in net.allow"},
		{"198.51.100.1:443", false, "198.51.100.1", corpFile, "blocked by net.block"},
		{"127.0.0.1:80", true, "127.0.0.1", corpFile, ""},
		{"10.0.0.7:80", false, "private-address", "", "10.0.0.7 is a private address; list it in net.allow_private"},
		{"169.254.169.254:80", false, "private-address", "", "169.254.169.254 is a metadata address"},
		{"0.0.0.0:0", false, "net.ports", "", "port 0"},
	}
	for _, test := range tests {
		v := p.Address(netip.MustParseAddrPort(test.dest))
		if v.Allowed != test.allowed || v.Rule != test.rule || v.Source != test.source || !strings.Contains(v.Reason, test.reason) {
			t.Errorf("Address(%s) = %+v, want allowed=%v rule=%q source=%q reason %q", test.dest, v, test.allowed, test.rule, test.source, test.reason)
		}
	}
	if v := p.Address(netip.AddrPort{}); v.Allowed {
		t.Errorf("the zero AddrPort: %+v", v)
	}
	// A default of allow speaks for names: by address, only listed ones.
	open := mustCompile(t, Layer{Source: userFile, Default: "allow"})
	for _, dest := range []string{"8.8.8.8:443", "127.0.0.1:443", "[::1]:443", "[64:ff9b::a9fe:a9fe]:80", "[fe80::1%eth0]:443"} {
		if v := open.Address(netip.MustParseAddrPort(dest)); v.Allowed || v.Rule != "net.default" || !strings.Contains(v.Reason, "not listed in net.allow") {
			t.Errorf("default allow, %s: %+v", dest, v)
		}
	}
	listed := mustCompile(t, Layer{Source: userFile, Default: "allow", Allow: []string{"8.8.8.8"}})
	if v := listed.Address(netip.MustParseAddrPort("8.8.8.8:443")); !v.Allowed || v.Rule != "8.8.8.8" {
		t.Errorf("a listed address: %+v", v)
	}
}

func TestPolicyAllowPrivate(t *testing.T) {
	tests := []struct {
		name       string
		corp, user Layer
		yes, no    []string
	}{
		{name: "nobody sets it", no: []string{"llm.internal", "127.0.0.1"}},
		{name: "one layer", user: Layer{AllowPrivate: []string{"llm.internal", "*.lan"}}, yes: []string{"llm.internal", "LLM.Internal.", "nas.lan"}, no: []string{"lan", "other.internal"}},
		{name: "both must list it", corp: Layer{AllowPrivate: []string{"*.internal"}}, user: Layer{AllowPrivate: []string{"llm.internal", "nas.lan"}},
			yes: []string{"llm.internal"}, no: []string{"db.internal", "nas.lan"}},
		{name: "set but empty refuses all", corp: Layer{AllowPrivateSet: true}, user: Layer{AllowPrivate: []string{"llm.internal"}}, no: []string{"llm.internal"}},
		{name: "invalid name", user: Layer{AllowPrivate: []string{"*.internal"}}, no: []string{"a..internal", ""}},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			test.corp.Source, test.user.Source = corpFile, userFile
			p := mustCompile(t, test.corp, test.user)
			for _, name := range test.yes {
				if !p.PrivateAllowed(name) {
					t.Errorf("PrivateAllowed(%q) = false", name)
				}
			}
			for _, name := range test.no {
				if p.PrivateAllowed(name) {
					t.Errorf("PrivateAllowed(%q) = true", name)
				}
			}
		})
	}
}

func TestPolicyFixedHost(t *testing.T) {
	corp := Layer{Source: corpFile, Hosts: map[string]string{"llm.internal": "10.0.0.9", "proxy.corp": "203.0.113.9"}}
	user := Layer{Source: userFile, Hosts: map[string]string{"LLM.internal.": "127.0.0.1", "mine.test": " 127.0.0.2 "}}
	p := mustCompile(t, corp, user)
	for name, want := range map[string]string{"llm.internal": "10.0.0.9", "Proxy.Corp": "203.0.113.9", "mine.test.": "127.0.0.2"} {
		if got, ok := p.FixedHost(name); !ok || got != netip.MustParseAddr(want) {
			t.Errorf("FixedHost(%q) = %v, %v; want %s", name, got, ok, want)
		}
	}
	for _, name := range []string{"other.test", "", "x.llm.internal"} {
		if got, ok := p.FixedHost(name); ok {
			t.Errorf("FixedHost(%q) = %v", name, got)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	tests := []struct {
		name  string
		layer Layer
		want  string
	}{
		{"bad default", Layer{Default: "warn"}, `net.default: "warn" is not allow or block`},
		{"bad allow", Layer{Allow: []string{"ok.example", "https://x.example"}}, `net.allow: domain pattern "https://x.example" must be a host name, not a URL`},
		{"bad block", Layer{Block: []string{"a.*.example"}}, `net.block: domain pattern "a.*.example": "*" is only allowed`},
		{"empty pattern", Layer{Allow: []string{" "}}, "net.allow: empty domain pattern"},
		{"port 0", Layer{Ports: []int{0}}, "net.ports: 0 is not a port (1-65535)"},
		{"port too big", Layer{Ports: []int{443, 65536}}, "net.ports: 65536 is not a port (1-65535)"},
		{"negative port", Layer{Ports: []int{-1}}, "net.ports: -1 is not a port"},
		{"bad allow_private", Layer{AllowPrivate: []string{"*"}}, "net.allow_private: domain pattern \"*\""},
		{"IPv6 fixed answer", Layer{Hosts: map[string]string{"llm.internal": "::1"}}, `net.hosts: "llm.internal" = "::1": an IPv6 address; fixed answers are IPv4 only`},
		{"mapped IPv6 fixed answer", Layer{Hosts: map[string]string{"llm.internal": "::ffff:127.0.0.1"}}, `net.hosts: "llm.internal" = "::ffff:127.0.0.1": an IPv6 address`},
		{"not an address", Layer{Hosts: map[string]string{"llm.internal": "localhost"}}, `net.hosts: "llm.internal" = "localhost": not an IPv4 address`},
		{"wildcard host", Layer{Hosts: map[string]string{"*.internal": "10.0.0.1"}}, `net.hosts: "*.internal": a fixed answer needs an exact name, not a pattern`},
		{"IP as host name", Layer{Hosts: map[string]string{"10.0.0.1": "10.0.0.2"}}, `net.hosts: "10.0.0.1" is an IP address; a fixed answer needs a name`},
		{"bad host name", Layer{Hosts: map[string]string{"a b": "10.0.0.2"}}, `net.hosts: "a b": host "a b" contains the invalid character`},
		{"two spellings", Layer{Hosts: map[string]string{"A.test": "10.0.0.1", "a.test.": "10.0.0.2"}}, `net.hosts: "A.test" and "a.test." name the same host`},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			test.layer.Source = userFile
			_, err := Compile([]Layer{{Source: corpFile}, test.layer})
			if err == nil || !strings.Contains(err.Error(), userFile+": "+test.want) {
				t.Fatalf("Compile error = %v, want one containing %q", err, userFile+": "+test.want)
			}
		})
	}
	// Every problem is reported, each with its file.
	_, err := Compile([]Layer{{Source: corpFile, Default: "maybe"}, {Source: userFile, Ports: []int{0}}})
	if err == nil || !strings.Contains(err.Error(), corpFile+": net.default") || !strings.Contains(err.Error(), userFile+": net.ports") {
		t.Errorf("two bad layers: %v", err)
	}
	// Thousands of bad entries give a bounded error.
	many := make([]string, 5000)
	if _, err := Compile([]Layer{{Source: userFile, Allow: many}}); err == nil || strings.Count(err.Error(), "\n") != maxReportedErrors ||
		!strings.HasSuffix(err.Error(), "and 4980 more problems") {
		t.Errorf("5000 bad entries: %d lines", strings.Count(fmt.Sprint(err), "\n"))
	}
	// Without a source the key starts the message (the caller adds the file).
	if _, err := Compile([]Layer{{Ports: []int{0}}}); err == nil || !strings.HasPrefix(err.Error(), "net.ports: ") {
		t.Errorf("no source: %v", err)
	}
}

func TestDefault(t *testing.T) {
	p := Default()
	if v := p.Name("example.com"); v.Allowed || v.Rule != "net.default" || v.Source != "" {
		t.Errorf("Name = %+v", v)
	}
	if !slices.Equal(p.Ports(), []uint16{80, 443}) || p.PrivateAllowed("localhost") {
		t.Errorf("ports %v", p.Ports())
	}
	if _, ok := p.FixedHost("localhost"); ok {
		t.Error("a fixed answer out of nothing")
	}
	if got := p.Entries(); len(got) != 2 || got[0] != (Entry{Key: "net.default", Value: "block", Note: "no file sets net.default"}) ||
		got[1] != (Entry{Key: "net.ports", Value: "80, 443", Note: "no file sets net.ports"}) {
		t.Errorf("Entries() = %+v", got)
	}
}

func TestEntries(t *testing.T) {
	corp := Layer{Source: corpFile, Default: "block", Allow: []string{"*.github.com", "pypi.org", "*.corp.example", "llm.internal"},
		Block: []string{"*.evil.example", "gist.github.com"}, Ports: []int{443, 80, 22},
		AllowPrivate: []string{"*.internal"}, Hosts: map[string]string{"llm.internal": "10.0.0.9"}}
	user := Layer{Source: userFile, Default: "allow", Allow: []string{"api.github.com", "x.evil.example", "news.example", "*.example", "*.lan", "gist.github.com"},
		Ports: []int{443, 8443}, AllowPrivate: []string{"llm.internal", "nas.lan", "*.corp.example"},
		Hosts: map[string]string{"LLM.internal": "127.0.0.1", "nas.lan": "192.168.1.2", "db.internal": "10.0.0.3", "blocked.evil.example": "203.0.113.1"}}
	got := mustCompile(t, corp, user).Entries()
	want := []Entry{
		{"net.default", "block", corpFile, ""},
		{"net.default", "allow", userFile, ""},
		{"net.block", "*.evil.example", corpFile, ""},
		{"net.block", "gist.github.com", corpFile, ""},
		{"net.allow", "*.github.com", corpFile, "limited: net.block refuses some names under github.com"},
		{"net.allow", "pypi.org", corpFile, ""},
		{"net.allow", "*.corp.example", corpFile, ""},
		{"net.allow", "llm.internal", corpFile, ""},
		{"net.allow", "api.github.com", userFile, ""},
		{"net.allow", "x.evil.example", userFile, `no effect: x.evil.example blocked by net.block "*.evil.example" (in ` + corpFile + ")"},
		{"net.allow", "news.example", userFile, "no effect: news.example is not in net.allow of " + corpFile + ", whose net.default is block"},
		{"net.allow", "*.example", userFile, "limited: only the names under example that net.allow of " + corpFile + " also lists (its net.default is block)"},
		{"net.allow", "*.lan", userFile, "no effect: net.default of " + corpFile + " is block and its net.allow lists no name under lan"},
		{"net.allow", "gist.github.com", userFile, `no effect: gist.github.com blocked by net.block "gist.github.com" (in ` + corpFile + ")"},
		{"net.ports", "22, 80, 443", corpFile, "in effect: the ports every file allows, 443"},
		{"net.ports", "443, 8443", userFile, "in effect: the ports every file allows, 443"},
		{"net.allow_private", "*.internal", corpFile, "limited: only the names under internal that net.allow_private of " + userFile + " also lists"},
		{"net.allow_private", "llm.internal", userFile, ""},
		{"net.allow_private", "nas.lan", userFile, "no effect: not in net.allow_private of " + corpFile},
		{"net.allow_private", "*.corp.example", userFile, "no effect: net.allow_private of " + corpFile + " lists no name under corp.example"},
		{"net.hosts", "llm.internal = 10.0.0.9", corpFile, ""},
		{"net.hosts", "blocked.evil.example = 203.0.113.1", userFile, `not answered: blocked.evil.example blocked by net.block "*.evil.example"`},
		{"net.hosts", "db.internal = 10.0.0.3", userFile, "not answered: db.internal is not in net.allow of " + corpFile + ", whose net.default is block"},
		{"net.hosts", "llm.internal = 127.0.0.1", userFile, "shadowed by the answer in " + corpFile},
		{"net.hosts", "nas.lan = 192.168.1.2", userFile, "not answered: nas.lan is not in net.allow of " + corpFile + ", whose net.default is block"},
	}
	if len(got) != len(want) {
		t.Errorf("%d entries, want %d", len(got), len(want))
	}
	for i := range max(len(got), len(want)) {
		var g, w Entry
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("entry %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	// A fixed answer that is not public and not in allow_private is noted.
	p := mustCompile(t, Layer{Source: userFile, Default: "allow", Hosts: map[string]string{"llm.test": "127.0.0.1"}})
	if e := p.Entries()[2]; e.Note != "not handed out: 127.0.0.1 is a loopback address and llm.test is not in net.allow_private" {
		t.Errorf("entry %+v", e)
	}
}

// TestPolicyConcurrentReaders: the policy is read by many goroutines at
// once (run with -race).
func TestPolicyConcurrentReaders(t *testing.T) {
	p := mustCompile(t, Layer{Source: userFile, Allow: []string{"*.github.com", "127.0.0.1"}, AllowPrivate: []string{"127.0.0.1"}, Hosts: map[string]string{"a.test": "10.0.0.1"}})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				host := fmt.Sprintf("h%d-%d.github.com", i, j)
				if !p.Name(host).Allowed || !p.Address(netip.MustParseAddrPort("127.0.0.1:443")).Allowed || p.Port(22).Allowed {
					t.Error("wrong verdict under concurrency")
					return
				}
				p.FixedHost("a.test")
				p.PrivateAllowed(host)
				p.Entries()
			}
		})
	}
	wg.Wait()
}

func BenchmarkPolicyName(b *testing.B) {
	allow := []string{"*.github.com", "pypi.org", "*.pythonhosted.org"}
	for i := range 1000 {
		allow = append(allow, fmt.Sprintf("host%d.example.com", i), fmt.Sprintf("*.zone%d.example.net", i))
	}
	p := mustCompile(b, Layer{Source: corpFile, Default: "block", Allow: allow, Block: []string{"*.evil.example"}}, Layer{Source: userFile, Allow: []string{"*.org"}})
	b.ReportAllocs()
	for b.Loop() {
		if !p.Name("objects.githubusercontent.files.github.com").Allowed {
			b.Fatal("refused")
		}
	}
}

// TestLowerFileCannotRedirectAnAllowedName: a name a higher file allows
// means its real addresses; a lower file's fixed answer for it would send
// the guest wherever that file says, so it is not used.
func TestLowerFileCannotRedirectAnAllowedName(t *testing.T) {
	evil := map[string]string{"api.github.com": "203.0.113.9", "mine.test": "203.0.113.10"}
	tests := []struct {
		name       string
		corp       Layer
		redirected bool // api.github.com gets the user's answer
	}{
		{"corp allows it by pattern", Layer{Source: corpFile, Allow: []string{"*.github.com"}}, false},
		{"corp allows every name", Layer{Source: corpFile, Default: "allow"}, false},
		{"corp says nothing of it", Layer{Source: corpFile, Allow: []string{"pypi.org"}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mustCompile(t, tc.corp, Layer{Source: userFile, Allow: []string{"api.github.com", "mine.test"}, Hosts: evil})
			if _, ok := p.FixedHost("api.github.com"); ok != tc.redirected {
				t.Errorf("api.github.com redirected: %v, want %v", ok, tc.redirected)
			}
			if !tc.redirected {
				var note string
				for _, e := range p.Entries() {
					if e.Key == KeyHosts && strings.HasPrefix(e.Value, "api.github.com") {
						note = e.Note
					}
				}
				if !strings.Contains(note, "not used") {
					t.Errorf("policy check does not say why the answer is not used: %q", note)
				}
			}
		})
	}
	// The corp file's own fixed answers stand.
	p := mustCompile(t, Layer{Source: corpFile, Allow: []string{"llm.internal"}, Hosts: map[string]string{"llm.internal": "10.0.0.5"}})
	if a, ok := p.FixedHost("llm.internal"); !ok || a.String() != "10.0.0.5" {
		t.Errorf("corp's own answer: %v %v", a, ok)
	}
}
