package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParsePattern(t *testing.T) {
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
		{configured: "*.0.113.5", wantErr: "neither a name"},
		{configured: "127.1", wantErr: "neither a name"},
		{configured: "2130706433", wantErr: "neither a name"},
		{configured: "010.0.0.1", wantErr: "neither a name"},
		{configured: "*.5", wantErr: "neither a name"},
		{configured: "1.2.3.4a", wantHost: "1.2.3.4a"},
	}
	for _, test := range tests {
		t.Run(test.configured, func(t *testing.T) {
			pattern, err := ParsePattern(test.configured)
			if test.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), test.wantErr) {
					t.Fatalf("ParsePattern(%q) error = %v, want containing %q", test.configured, err, test.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParsePattern(%q): %v", test.configured, err)
			}
			if pattern.host != test.wantHost || pattern.wildcard != test.wantWildcard {
				t.Errorf("ParsePattern(%q) = host %q wildcard %v, want %q %v", test.configured, pattern.host, pattern.wildcard, test.wantHost, test.wantWildcard)
			}
		})
	}
}

func TestPatternMatches(t *testing.T) {
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
		{"*.example.com", "www.example.com.evil.net", false},
		{"*.example.com", "xexample.com", false},
		{"*.b.example.com", "a.b.example.com", true},
		{"*.b.example.com", "b.example.com", false},
	}
	for _, test := range tests {
		t.Run(test.pattern+"/"+test.host, func(t *testing.T) {
			pattern, err := ParsePattern(test.pattern)
			if err != nil {
				t.Fatal(err)
			}
			host, err := NormalizeHost(test.host)
			if err != nil {
				t.Fatal(err)
			}
			if got := pattern.Matches(host); got != test.want {
				t.Errorf("%q matches %q = %v, want %v", test.pattern, test.host, got, test.want)
			}
		})
	}
}

// FuzzPatternMatch checks the matcher's invariants on arbitrary
// patterns and hosts: no panics, case and trailing-dot insensitivity, and
// that a wildcard only ever matches proper subdomains of its suffix.
func FuzzPatternMatch(f *testing.F) {
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
		{"*.3.4", "1.2.3.4"},
		{"*.0.0.1", "127.0.0.1"},
		{"*.b.c", "a.b.c"},
	}
	for _, seed := range seeds {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, configured, rawHost string) {
		pattern, err := ParsePattern(configured)
		if err != nil {
			return
		}
		host, err := NormalizeHost(rawHost)
		if err != nil {
			return
		}
		matched := pattern.Matches(host)
		var set patternSet[Pattern]
		set.add(pattern, pattern)
		if _, indexed := set.match(host); indexed != matched {
			t.Fatalf("the index says %v, Matches says %v: pattern %q host %q", indexed, matched, configured, host)
		}
		if matched && pattern.wildcard {
			if _, err := netip.ParseAddr(host); err == nil {
				t.Fatalf("wildcard %q matched the address %q", configured, host)
			}
		}
		if pattern.String() != strings.TrimSpace(configured) {
			t.Fatalf("String() = %q, configured %q", pattern.String(), configured)
		}
		if upper, err := NormalizeHost(strings.ToUpper(rawHost)); err == nil && pattern.Matches(upper) != matched {
			t.Fatalf("case changed the verdict: pattern %q host %q", configured, rawHost)
		}
		if dotted, err := NormalizeHost(rawHost + "."); err == nil && !strings.HasSuffix(rawHost, ".") && pattern.Matches(dotted) != matched {
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
		if again, err := NormalizeHost(host); err != nil || again != host {
			t.Fatalf("NormalizeHost not idempotent: %q -> %q -> %q (%v)", rawHost, host, again, err)
		}
	})
}

// TestPatternSetPrefersTheMostSpecific: several patterns may cover a host;
// the one reported is the exact one, else the longest suffix.
func TestPatternSetPrefersTheMostSpecific(t *testing.T) {
	var set patternSet[Pattern]
	for _, entry := range []string{"*.com", "*.example.com", "api.example.com", "*.api.example.com"} {
		pattern, err := ParsePattern(entry)
		if err != nil {
			t.Fatal(err)
		}
		set.add(pattern, pattern)
	}
	for host, want := range map[string]string{
		"api.example.com":   "api.example.com",
		"x.api.example.com": "*.api.example.com",
		"www.example.com":   "*.example.com",
		"example.com":       "*.com",
		"other.org":         "",
		"com":               "",
	} {
		got, ok := set.match(host)
		if got.String() != want || ok != (want != "") {
			t.Errorf("match(%q) = %q, %v; want %q", host, got.String(), ok, want)
		}
	}
}
