package netpolicy

import (
	"strings"
	"testing"
)

func TestCredentialRejects(t *testing.T) {
	good := Credential{Host: "api.example.com", Header: "x-api-key", SourceEnv: "REAL_KEY", GuestEnv: "EXAMPLE_API_KEY"}
	cases := []struct {
		name string
		edit func(*Credential)
		want string
	}{
		{"no host", func(c *Credential) { c.Host = "" }, "host: missing"},
		{"url as host", func(c *Credential) { c.Host = "https://api.example.com/" }, "host: domain pattern"},
		{"address as host", func(c *Credential) { c.Host = "10.0.0.1" }, "is an IP address; a credential is for a name"},
		{"no header", func(c *Credential) { c.Header = "" }, "header: missing"},
		{"header with a space", func(c *Credential) { c.Header = "x api" }, `header: "x api" is not a valid HTTP header name`},
		{"header with a colon", func(c *Credential) { c.Header = "x-a:b" }, "not a valid HTTP header name"},
		{"routing header", func(c *Credential) { c.Header = "Host" }, `header: "Host" frames or routes the request`},
		{"framing header", func(c *Credential) { c.Header = "content-length" }, "frames or routes"},
		{"no source", func(c *Credential) { c.SourceEnv = "" }, "source_file or source_env: one is needed"},
		{"two sources", func(c *Credential) { c.SourceFile = "/k" }, "give one, not both"},
		{"relative file", func(c *Credential) { c.SourceEnv, c.SourceFile = "", "keys/a" }, "neither absolute nor under ~/"},
		{"bad env name", func(c *Credential) { c.SourceEnv = "A-B" }, `source_env: "A-B" is not an environment variable name`},
		{"no guest env", func(c *Credential) { c.GuestEnv = "" }, "guest_env: missing"},
		{"bad guest env", func(c *Credential) { c.GuestEnv = "1KEY" }, "is not an environment variable name"},
		{"guest PATH", func(c *Credential) { c.GuestEnv = "PATH" }, "guest_env: PATH is the sandbox's own variable"},
		{"guest loader", func(c *Credential) { c.GuestEnv = "LD_PRELOAD" }, "the sandbox's own variable"},
		{"guest CA bundle", func(c *Credential) { c.GuestEnv = "SSL_CERT_FILE" }, "the sandbox's own variable"},
		{"relative ca", func(c *Credential) { c.CAFile = "ca.pem" }, `ca_file: "ca.pem" is neither absolute`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.edit(&c)
			_, err := Compile([]Layer{{Source: "corp.toml", Credentials: []Credential{good, c}}})
			if err == nil {
				t.Fatalf("compiled %+v", c)
			}
			if !strings.Contains(err.Error(), "corp.toml: net.credentials[1]: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name the file, the entry and %q", err, tc.want)
			}
		})
	}
}

func TestCredentialLookup(t *testing.T) {
	p, err := Compile([]Layer{
		{Source: "corp.toml", Credentials: []Credential{
			{Host: "*.example.com", Header: "authorization", SourceFile: "/etc/corp.key", GuestEnv: "CORP_KEY"},
			{Host: "api.example.com", Header: "x-api-key", SourceEnv: "API_KEY", GuestEnv: "EXAMPLE_API_KEY"},
		}},
		{Source: "user.toml", Credentials: []Credential{
			{Host: "API.example.com", Header: "x-other", SourceFile: "~/k", GuestEnv: "MINE"},
			{Host: "mine.example.org", Header: "x-mine", SourceFile: "~/k", GuestEnv: "CORP_KEY"},
			{Host: "own.example.net", Header: "x-own", SourceFile: "~/own", GuestEnv: "OWN_KEY"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, header, source, placeholder string
	}{
		{"api.example.com", "x-api-key", "corp.toml", "capsem-placeholder-example-api-key"},
		{"API.Example.com.", "x-api-key", "corp.toml", "capsem-placeholder-example-api-key"},
		{"other.example.com", "authorization", "corp.toml", "capsem-placeholder-corp-key"},
		{"own.example.net", "x-own", "user.toml", "capsem-placeholder-own-key"},
		{"example.com", "", "", ""},
		{"mine.example.org", "", "", ""}, // its guest_env is corp's
	}
	for _, tc := range cases {
		r, ok := p.Credential(tc.name)
		if ok != (tc.header != "") {
			t.Fatalf("%s: credential found %v, want %v", tc.name, ok, tc.header != "")
		}
		if ok && (r.Header != tc.header || r.Source != tc.source || r.Placeholder != tc.placeholder) {
			t.Fatalf("%s: got %s from %s with %s, want %s from %s with %s", tc.name, r.Header, r.Source, r.Placeholder, tc.header, tc.source, tc.placeholder)
		}
	}
	if n := len(p.Credentials()); n != 3 {
		t.Fatalf("%d credentials in force, want 3 (two shadowed)", n)
	}
	var notes []string
	for _, e := range p.Entries() {
		if e.Key == KeyCredentials {
			notes = append(notes, e.Source+" "+e.Value+" | "+e.Note)
		}
	}
	want := []string{
		"corp.toml *.example.com: header authorization from source_file /etc/corp.key, guest CORP_KEY | ",
		"corp.toml api.example.com: header x-api-key from source_env API_KEY, guest EXAMPLE_API_KEY | no effect until the name is allowed: api.example.com is in no net.allow list (net.default is block unless a file sets it)",
		"user.toml API.example.com: header x-other from source_file ~/k, guest MINE | shadowed by the credential for api.example.com in corp.toml",
		"user.toml mine.example.org: header x-mine from source_file ~/k, guest CORP_KEY | shadowed: CORP_KEY already holds the placeholder of the credential for *.example.com in corp.toml",
		"user.toml own.example.net: header x-own from source_file ~/own, guest OWN_KEY | no effect until the name is allowed: own.example.net is in no net.allow list (net.default is block unless a file sets it)",
	}
	if strings.Join(notes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("entries:\n%s\nwant:\n%s", strings.Join(notes, "\n"), strings.Join(want, "\n"))
	}
}
