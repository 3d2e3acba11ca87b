package builtintools

import (
	"strings"
	"testing"
)

func TestParseDomainPattern(t *testing.T) {
	tests := []struct {
		configured   string
		wantHost     string
		wantWildcard bool
		wantErr      string
	}{
		{configured: "example.com", wantHost: "example.com"},
		{configured: "  Example.COM.  ", wantHost: "example.com"},
		{configured: "*.example.com", wantHost: "example.com", wantWildcard: true},
		{configured: "*.Example.com.", wantHost: "example.com", wantWildcard: true},
		{configured: "127.0.0.1", wantHost: "127.0.0.1"},
		{configured: "[::1]", wantHost: "::1"},
		{configured: "::ffff:10.0.0.1", wantHost: "10.0.0.1"},
		{configured: "under_score.example", wantHost: "under_score.example"},
		{configured: "", wantErr: "empty domain pattern"},
		{configured: "*", wantErr: `only allowed as a leading "*." label`},
		{configured: "*example.com", wantErr: `only allowed as a leading "*." label`},
		{configured: "a.*.com", wantErr: `only allowed as a leading "*." label`},
		{configured: "*.*.com", wantErr: `only allowed as a leading "*." label`},
		{configured: "*.", wantErr: "empty host"},
		{configured: "https://example.com", wantErr: "must be a host name, not a URL"},
		{configured: "example.com/path", wantErr: "must be a host name, not a URL"},
		{configured: "example.com:443", wantErr: "invalid character"},
		{configured: "a..b", wantErr: "empty label"},
		{configured: ".example.com", wantErr: "empty label"},
		{configured: "bücher.de", wantErr: "not ASCII"},
		{configured: "*.10.0.0.1", wantErr: "wildcard needs a domain name"},
		{configured: strings.Repeat("a", 254), wantErr: "longer than 253"},
	}
	for _, test := range tests {
		t.Run(test.configured, func(t *testing.T) {
			pattern, err := parseDomainPattern(test.configured)
			if test.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), test.wantErr) {
					t.Fatalf("parseDomainPattern(%q) error = %v, want containing %q", test.configured, err, test.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseDomainPattern(%q): %v", test.configured, err)
			}
			if pattern.host != test.wantHost || pattern.wildcard != test.wantWildcard {
				t.Errorf("parseDomainPattern(%q) = host %q wildcard %v, want %q %v", test.configured, pattern.host, pattern.wildcard, test.wantHost, test.wantWildcard)
			}
		})
	}
}

func TestDomainPatternMatches(t *testing.T) {
	tests := []struct {
		pattern string
		host    string
		want    bool
	}{
		{"example.com", "example.com", true},
		{"example.com", "EXAMPLE.com.", true},
		{"example.com", "www.example.com", false},
		{"example.com", "example.org", false},
		{"*.example.com", "www.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "WWW.Example.COM.", true},
		{"*.example.com", "example.com", false}, // apex is not a subdomain
		{"*.example.com", "badexample.com", false},
		{"*.example.com", "example.com.evil.net", false},
		{"*.com", "evil.com", true},
		{"127.0.0.1", "127.0.0.1", true},
		{"127.0.0.1", "[::ffff:127.0.0.1]", true}, // IPv4-mapped spelling is the same address
		{"::1", "[::1]", true},
		{"::1", "[0:0::1]", true},
	}
	for _, test := range tests {
		t.Run(test.pattern+"/"+test.host, func(t *testing.T) {
			pattern, err := parseDomainPattern(test.pattern)
			if err != nil {
				t.Fatal(err)
			}
			host, err := normalizeHost(test.host)
			if err != nil {
				t.Fatal(err)
			}
			if got := pattern.matches(host); got != test.want {
				t.Errorf("%q matches %q = %v, want %v", test.pattern, test.host, got, test.want)
			}
		})
	}
}

func TestDomainPolicyCheck(t *testing.T) {
	tests := []struct {
		name        string
		allow       []string
		block       []string
		host        string
		wantAllowed bool
		wantRule    string
		wantReason  string
	}{
		{name: "no lists allow everything", host: "anything.example", wantAllowed: true},
		{name: "block exact", block: []string{"evil.com"}, host: "evil.com", wantRule: "evil.com", wantReason: `domain blocked by "evil.com"`},
		{name: "block wildcard", block: []string{"*.com"}, host: "evil.com", wantRule: "*.com", wantReason: `domain blocked by "*.com"`},
		{name: "block list alone allows others", block: []string{"evil.com"}, host: "good.org", wantAllowed: true},
		{name: "allow list allows match", allow: []string{"*.github.com"}, host: "api.github.com", wantAllowed: true, wantRule: "*.github.com"},
		{name: "allow list denies apex of wildcard", allow: []string{"*.github.com"}, host: "github.com", wantReason: "domain not in allow list"},
		{name: "allow list denies others", allow: []string{"github.com"}, host: "gitlab.com", wantReason: "domain not in allow list"},
		{name: "block wins over allow", allow: []string{"*.example.com"}, block: []string{"secret.example.com"}, host: "secret.example.com", wantRule: "secret.example.com", wantReason: `domain blocked by "secret.example.com"`},
		{name: "allow next to a block", allow: []string{"*.example.com"}, block: []string{"secret.example.com"}, host: "www.example.com", wantAllowed: true, wantRule: "*.example.com"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			policy, err := compileDomainPolicy(test.allow, test.block)
			if err != nil {
				t.Fatal(err)
			}
			verdict := policy.check(test.host)
			if verdict.allowed != test.wantAllowed || verdict.matchedRule != test.wantRule || verdict.reason != test.wantReason {
				t.Errorf("check(%q) = %+v, want allowed=%v rule=%q reason=%q", test.host, verdict, test.wantAllowed, test.wantRule, test.wantReason)
			}
		})
	}
}

func TestCompileDomainPolicyNamesTheBadList(t *testing.T) {
	if _, err := compileDomainPolicy(nil, []string{"ok.com", "bad*"}); err == nil || !strings.Contains(err.Error(), "block list") {
		t.Errorf("bad block entry: error = %v, want one naming the block list", err)
	}
	if _, err := compileDomainPolicy([]string{"http://x"}, nil); err == nil || !strings.Contains(err.Error(), "allow list") {
		t.Errorf("bad allow entry: error = %v, want one naming the allow list", err)
	}
}

// FuzzDomainPatternMatch checks the matcher's invariants on arbitrary
// patterns and hosts: no panics, case and trailing-dot insensitivity, and
// that a wildcard only ever matches proper subdomains of its suffix.
func FuzzDomainPatternMatch(f *testing.F) {
	seeds := [][2]string{
		{"example.com", "example.com"},
		{"*.example.com", "www.example.com"},
		{"*.example.com", "example.com"},
		{"*.example.com", "badexample.com"},
		{"*.com", "EVIL.COM."},
		{"127.0.0.1", "::ffff:127.0.0.1"},
		{"[::1]", "::1"},
		{"*", "x"},
		{"", ""},
		{"a..b", "a.b"},
		{"*.ｅxample.com", "www.ｅxample.com"},
	}
	for _, seed := range seeds {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, configured, rawHost string) {
		pattern, err := parseDomainPattern(configured)
		if err != nil {
			return
		}
		host, err := normalizeHost(rawHost)
		if err != nil {
			return
		}
		matched := pattern.matches(host)
		if upper, err := normalizeHost(strings.ToUpper(rawHost)); err == nil && pattern.matches(upper) != matched {
			t.Fatalf("case changed the verdict: pattern %q host %q", configured, rawHost)
		}
		if dotted, err := normalizeHost(rawHost + "."); err == nil && !strings.HasSuffix(rawHost, ".") && pattern.matches(dotted) != matched {
			t.Fatalf("trailing dot changed the verdict: pattern %q host %q", configured, rawHost)
		}
		if matched && pattern.wildcard {
			if host == pattern.host || !strings.HasSuffix(host, "."+pattern.host) {
				t.Fatalf("wildcard %q matched %q, which is not a proper subdomain", configured, host)
			}
		}
		if matched && !pattern.wildcard && host != pattern.host {
			t.Fatalf("exact %q matched a different host %q", configured, host)
		}
		// A normalized host is stable under normalization.
		if again, err := normalizeHost(host); err != nil || again != host {
			t.Fatalf("normalizeHost not idempotent: %q -> %q -> %q (%v)", rawHost, host, again, err)
		}
	})
}
