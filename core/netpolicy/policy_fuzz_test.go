package netpolicy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// naivePolicy is the [net] rules written the obvious way, pattern by
// pattern, to check the indexed Policy against.
type naivePolicy []Layer

func (n naivePolicy) name(raw string) bool {
	host, err := NormalizeHost(raw)
	if err != nil {
		return false
	}
	matchesAny := func(entries []string) bool {
		return slices.ContainsFunc(entries, func(e string) bool { p, _ := ParsePattern(e); return p.Matches(host) })
	}
	for _, l := range n {
		if matchesAny(l.Block) {
			return false
		}
	}
	allowed := false
	for _, l := range n {
		switch {
		case matchesAny(l.Allow):
			allowed = true
		case l.Default == "block":
			return false
		case l.Default == "allow":
			allowed = true
		}
	}
	return allowed
}

func (n naivePolicy) private(raw string) bool {
	host, err := NormalizeHost(raw)
	if err != nil {
		return false
	}
	listed := false
	for _, l := range n {
		if !l.AllowPrivateSet && len(l.AllowPrivate) == 0 {
			continue
		}
		if !slices.ContainsFunc(l.AllowPrivate, func(e string) bool { p, _ := ParsePattern(e); return p.Matches(host) }) {
			return false
		}
		listed = true
	}
	return listed
}

func (n naivePolicy) port(port uint16) bool {
	set := false
	for _, l := range n {
		if !l.PortsSet && len(l.Ports) == 0 {
			continue
		}
		set = true
		if !slices.Contains(l.Ports, int(port)) {
			return false
		}
	}
	return set || port == 80 || port == 443
}

// valid reports whether every entry of the layers is acceptable.
func (n naivePolicy) valid() bool {
	for _, l := range n {
		if l.Default != "" && l.Default != "allow" && l.Default != "block" {
			return false
		}
		for _, e := range slices.Concat(l.Allow, l.Block, l.AllowPrivate) {
			if _, err := ParsePattern(e); err != nil {
				return false
			}
		}
		for _, port := range l.Ports {
			if port < 1 || port > 65535 {
				return false
			}
		}
		seen := map[string]bool{}
		for name, value := range l.Hosts {
			host, _, err := parseFixedHost(name, value)
			if err != nil || seen[host] {
				return false
			}
			seen[host] = true
		}
	}
	return true
}

// fuzzDefault reads one byte as a choice of default and anything longer
// as itself (mostly invalid).
func fuzzDefault(s string) string {
	if len(s) == 1 {
		return []string{"", "allow", "block"}[s[0]%3]
	}
	return s
}

func fuzzList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func fuzzPorts(b []byte) (ports []int, set bool) {
	if len(b) == 0 {
		return nil, false
	}
	for i := 1; i+1 < len(b); i += 2 {
		ports = append(ports, int(b[i])<<8|int(b[i+1]))
	}
	return ports, b[0]%2 == 1
}

// FuzzCompile checks Compile and every decision against naivePolicy, on two
// layers of arbitrary entries, in both orders.
func FuzzCompile(f *testing.F) {
	f.Add("\x02", "*.github.com,pypi.org,203.0.113.5", "*.evil.example", "*.internal", "llm.internal=127.0.0.1", []byte{0, 1, 187, 0, 80},
		"\x00", "x.evil.example,*.org", "gist.github.com", "llm.internal", "", []byte{1, 1, 187},
		"api.github.com", "127.0.0.1")
	f.Add("\x01", "", "*.com", "", "", []byte{}, "block", "a.b", "", "*.lan,nas.lan", "nas.lan=10.0.0.1", []byte{1},
		"EVIL.COM.", "10.0.0.1")
	f.Add("", "*.", "**", "", "*.x=1.2.3.4", []byte{0, 0, 0}, "", "", "", "", "a=::1", []byte(nil), "a..b", "::1")
	f.Fuzz(func(t *testing.T, corpDefault, corpAllow, corpBlock, corpPrivate, corpHosts string, corpPorts []byte,
		userDefault, userAllow, userBlock, userPrivate, userHosts string, userPorts []byte, name, address string) {
		layer := func(source, def, allow, block, private, hosts string, ports []byte) Layer {
			l := Layer{Source: source, Default: fuzzDefault(def), Allow: fuzzList(allow), Block: fuzzList(block), AllowPrivate: fuzzList(private)}
			l.AllowPrivateSet = private != ""
			l.Ports, l.PortsSet = fuzzPorts(ports)
			for _, pair := range fuzzList(hosts) {
				k, v, _ := strings.Cut(pair, "=")
				if l.Hosts == nil {
					l.Hosts = map[string]string{}
				}
				l.Hosts[k] = v
			}
			return l
		}
		corp := layer("corp.toml", corpDefault, corpAllow, corpBlock, corpPrivate, corpHosts, corpPorts)
		user := layer("user.toml", userDefault, userAllow, userBlock, userPrivate, userHosts, userPorts)
		naive := naivePolicy{corp, user}
		p, err := Compile([]Layer{corp, user})
		if err != nil {
			if naive.valid() {
				t.Fatalf("valid layers refused: %v", err)
			}
			if !strings.Contains(err.Error(), "corp.toml: net.") && !strings.Contains(err.Error(), "user.toml: net.") {
				t.Fatalf("the error names no file and key: %v", err)
			}
			return
		}
		if !naive.valid() {
			t.Fatalf("invalid layers compiled: %+v %+v", corp, user)
		}
		swapped, err := Compile([]Layer{user, corp})
		if err != nil {
			t.Fatalf("the layers compile in one order only: %v", err)
		}
		// The fuzzed name, and names near every configured entry: the
		// entry's host, a subdomain, its parent, a look-alike.
		names := []string{name}
		for _, entry := range slices.Concat(corp.Allow, corp.Block, corp.AllowPrivate, user.Allow, user.Block, user.AllowPrivate) {
			host := strings.TrimPrefix(strings.TrimSpace(entry), "*.")
			_, parent, _ := strings.Cut(host, ".")
			names = append(names, host, "a."+host, name+"."+host, "x"+host, parent)
		}
		for _, name := range names {
			checkName(t, p, swapped, naive, name)
		}
		for _, port := range []uint16{0, 22, 80, 443, 8443, 65535} {
			if got := p.Port(port).Allowed; got != naive.port(port) {
				t.Fatalf("Port(%d) = %v, the rules say %v", port, got, naive.port(port))
			}
		}
		for _, port := range p.Ports() {
			if !naive.port(port) {
				t.Fatalf("Ports() has %d", port)
			}
		}
		if addr, err := netip.ParseAddr(address); err == nil {
			dest := netip.AddrPortFrom(addr, 443)
			host := addr.WithZone("").Unmap().String()
			want := naive.name(host) && naive.port(443) && (IsPublic(addr) || naive.private(host))
			if got := p.Address(dest); got.Allowed != want {
				t.Fatalf("Address(%s) = %+v, the rules say %v", dest, got, want)
			}
		}
		if answer, ok := p.FixedHost(name); ok && !answer.Is4() {
			t.Fatalf("FixedHost(%q) = %s", name, answer)
		}
		for _, e := range p.Entries() {
			if e.Key == "" || e.Value == "" {
				t.Fatalf("entry %+v", e)
			}
		}
	})
}

// checkName compares the decisions on one name with the naive rules.
func checkName(t *testing.T, p, swapped *Policy, naive naivePolicy, name string) {
	t.Helper()
	v := p.Name(name)
	if v.Allowed != naive.name(name) {
		t.Fatalf("Name(%q) = %+v, the rules say %v", name, v, naive.name(name))
	}
	if swapped.Name(name).Allowed != v.Allowed {
		t.Fatalf("Name(%q): the order of the files changed the verdict", name)
	}
	if up := p.Name(strings.ToUpper(name)); up.Allowed != v.Allowed && !strings.ContainsFunc(name, func(r rune) bool { return r > 0x7f }) {
		t.Fatalf("Name(%q): case changed the verdict", name)
	}
	if v.Allowed == (v.Reason != "") || v.Allowed && v.Rule == "" || v.Source != "" && v.Source != "corp.toml" && v.Source != "user.toml" {
		t.Fatalf("Name(%q) = %+v: malformed verdict", name, v)
	}
	if got := p.PrivateAllowed(name); got != naive.private(name) {
		t.Fatalf("PrivateAllowed(%q) = %v, the rules say %v", name, got, naive.private(name))
	}
}
