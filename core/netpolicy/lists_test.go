package netpolicy

import (
	"strings"
	"testing"
)

func TestListsCheck(t *testing.T) {
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
		{name: "the host is normalized", block: []string{"evil.com"}, host: "EVIL.com.", wantRule: "evil.com", wantReason: `domain blocked by "evil.com"`},
		{name: "the most specific block is reported", block: []string{"*.com", "*.evil.com"}, host: "a.evil.com", wantRule: "*.evil.com", wantReason: `domain blocked by "*.evil.com"`},
		{name: "an invalid host is refused", host: "a..b", wantReason: `invalid host: host "a..b" has an empty label`},
		{name: "an inet_aton spelling is refused", allow: []string{"*.example"}, host: "2130706433", wantReason: "invalid host: host \"2130706433\" is neither a name"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			lists, err := CompileLists(test.allow, test.block)
			if err != nil {
				t.Fatal(err)
			}
			verdict := lists.Check(test.host)
			if verdict.Allowed != test.wantAllowed || verdict.Rule != test.wantRule || !strings.HasPrefix(verdict.Reason, test.wantReason) ||
				(test.wantReason == "") != (verdict.Reason == "") || verdict.Source != "" {
				t.Errorf("Check(%q) = %+v, want allowed=%v rule=%q reason=%q", test.host, verdict, test.wantAllowed, test.wantRule, test.wantReason)
			}
		})
	}
}

func TestCompileListsNamesTheBadList(t *testing.T) {
	if _, err := CompileLists(nil, []string{"ok.com", "bad*"}); err == nil || !strings.Contains(err.Error(), "block list") {
		t.Errorf("bad block entry: error = %v, want one naming the block list", err)
	}
	if _, err := CompileLists([]string{"http://x"}, nil); err == nil || !strings.Contains(err.Error(), "allow list") {
		t.Errorf("bad allow entry: error = %v, want one naming the allow list", err)
	}
}
