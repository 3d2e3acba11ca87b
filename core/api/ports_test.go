package api

import (
	"strings"
	"testing"
)

func TestParsePortMapping(t *testing.T) {
	cases := []struct {
		in   string
		want PortMapping
		err  string // a part of the error; "" for none
	}{
		{"8080:3000", PortMapping{Address: "127.0.0.1", Host: 8080, Guest: 3000}, ""},
		{"127.0.0.1:8080:3000", PortMapping{Address: "127.0.0.1", Host: 8080, Guest: 3000}, ""},
		{"0.0.0.0:80:80", PortMapping{Address: "0.0.0.0", Host: 80, Guest: 80}, ""},
		{"[::1]:8080:3000", PortMapping{Address: "::1", Host: 8080, Guest: 3000}, ""},
		{"[::ffff:127.0.0.1]:1:65535", PortMapping{Address: "127.0.0.1", Host: 1, Guest: 65535}, ""},
		{"", PortMapping{}, "no guest port"},
		{"8080", PortMapping{}, "no guest port"},
		{"8080:", PortMapping{}, "guest port is empty"},
		{":3000", PortMapping{}, "host port is empty"},
		{"0:3000", PortMapping{}, "host port 0: want 1 to 65535"},
		{"8080:0", PortMapping{}, "guest port 0: want 1 to 65535"},
		{"65536:3000", PortMapping{}, "host port 65536: want 1 to 65535"},
		{"8080:99999999999999999999", PortMapping{}, "want 1 to 65535"},
		{"-1:3000", PortMapping{}, `"-1" is not a number`},
		{"+80:3000", PortMapping{}, `"+80" is not a number`},
		{"http:3000", PortMapping{}, `"http" is not a number`},
		{"localhost:8080:3000", PortMapping{}, `address "localhost": want an IP address`},
		{"::1:8080:3000", PortMapping{}, "IPv6 one goes in brackets"},
		{":8080:3000", PortMapping{}, "empty address"},
		{"[fe80::1%eth0]:8080:3000", PortMapping{}, "want an IP address"},
		{"1.2.3:8080:3000", PortMapping{}, "want an IP address"},
	}
	for _, tc := range cases {
		got, err := ParsePortMapping(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("ParsePortMapping(%q): %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParsePortMapping(%q) = %+v, %v; want an error with %q", tc.in, got, err, tc.err)
		case tc.err == "" && got != tc.want:
			t.Errorf("ParsePortMapping(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if tc.err != "" && err != nil && !strings.Contains(err.Error(), tc.in) {
			t.Errorf("ParsePortMapping(%q): the error does not name the entry: %v", tc.in, err)
		}
	}
}

func TestCheckPorts(t *testing.T) {
	cases := []struct {
		name  string
		ports []PortMapping
		err   string
	}{
		{"none", nil, ""},
		{"two", []PortMapping{{Host: 8080, Guest: 80}, {Address: "0.0.0.0", Host: 8080, Guest: 80}}, ""},
		{"same host port twice, loopback by default", []PortMapping{{Host: 8080, Guest: 80}, {Address: "127.0.0.1", Host: 8080, Guest: 81}}, "127.0.0.1:8080:81: host port 127.0.0.1:8080 is published twice"},
		{"host port out of range", []PortMapping{{Host: 70000, Guest: 80}}, "port 70000:80: host port 70000"},
		{"guest port missing", []PortMapping{{Host: 8080}}, "port 8080:0: guest port 0"},
		{"address not an IP", []PortMapping{{Address: "example.com", Host: 8080, Guest: 80}}, `address "example.com"`},
		{"too many", make([]PortMapping, MaxPorts+1), "more than 64"},
	}
	for _, tc := range cases {
		err := CheckPorts(tc.ports)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
		}
	}
}

// FuzzParsePortMapping: whatever parses is a valid mapping that reads back
// the same from its own spelling.
func FuzzParsePortMapping(f *testing.F) {
	for _, s := range []string{"8080:3000", "127.0.0.1:8080:3000", "[::1]:1:65535", "0.0.0.0:80:80", "::1:2:3", "[]:1:2", "a:b:c", "1:2:3:4", "[::ffff:1.2.3.4]:5:6"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParsePortMapping(s)
		if err != nil {
			return
		}
		if err := m.Check(); err != nil || m.Address == "" {
			t.Fatalf("%q parsed to %+v, which is not a normalized valid mapping: %v", s, m, err)
		}
		back, err := ParsePortMapping(m.String())
		if err != nil || back != m {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, m, m.String(), back, err)
		}
	})
}

func TestParsePortMappings(t *testing.T) {
	got, err := ParsePortMappings([]string{"8080:80", "0.0.0.0:8080:80"})
	if err != nil || len(got) != 2 || got[0].Address != "127.0.0.1" || got[1].Address != "0.0.0.0" {
		t.Fatalf("%+v, %v", got, err)
	}
	if _, err := ParsePortMappings([]string{"8080:80", "127.0.0.1:8080:81"}); err == nil || !strings.Contains(err.Error(), "published twice") {
		t.Fatalf("a host port twice: %v", err)
	}
	if _, err := ParsePortMappings([]string{"8080:80", "x"}); err == nil || !strings.Contains(err.Error(), `port "x"`) {
		t.Fatalf("a bad second value: %v", err)
	}
}
