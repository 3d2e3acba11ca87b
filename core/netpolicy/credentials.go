package netpolicy

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/capsem/capsem/core/guestwire"
)

// Credential is one [[net.credentials]] entry: the guest's connections to
// Host have their TLS terminated by the host, and the placeholder the guest
// holds in GuestEnv is replaced in the request header Header by the real
// value, read from SourceFile (a file only its owner may read) or from the
// service's environment variable SourceEnv. The real value never enters
// the guest. A credential allows nothing: the name must still be allowed.
type Credential struct {
	Host       string `toml:"host"`        // exact name or *.suffix
	Header     string `toml:"header"`      // e.g. x-api-key, authorization
	SourceFile string `toml:"source_file"` // absolute or ~/…
	SourceEnv  string `toml:"source_env"`  // a variable of the service's environment
	GuestEnv   string `toml:"guest_env"`   // the variable every VM gets, holding the placeholder
	CAFile     string `toml:"ca_file"`     // optional: extra roots for this upstream
}

// KeyCredentials is the [[net.credentials]] array's key.
const KeyCredentials = "net.credentials"

// PlaceholderPrefix starts every placeholder, so one is recognisable
// wherever it turns up.
const PlaceholderPrefix = guestwire.PlaceholderPrefix

// CredentialRule is a compiled credential.
type CredentialRule struct {
	Credential
	// Pattern is Host parsed.
	Pattern Pattern
	// Placeholder is the value GuestEnv holds in the guest.
	Placeholder string
	// Source is the file that configured it.
	Source string
}

func isAddress(host string) bool {
	_, err := netip.ParseAddr(host)
	return err == nil
}

// headerName is an HTTP field name: a token of RFC 9110's tchar.
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// headersNeverReplaced are headers a credential may not name: they frame
// or route the request rather than authenticate it.
var headersNeverReplaced = map[string]bool{
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"upgrade": true, "te": true, "trailer": true, "keep-alive": true, "proxy-connection": true,
	"content-type": true,
}

// guestEnvReserved are variables the sandbox sets itself.
var guestEnvReserved = map[string]bool{
	"PATH": true, "HOME": true, "SHELL": true, "USER": true, "TERM": true, "PWD": true,
	"SSL_CERT_FILE": true, "NODE_EXTRA_CA_CERTS": true, "REQUESTS_CA_BUNDLE": true,
}

// placeholderFor names a credential's placeholder after its variable: the
// guest's programs see it in their environment and in errors, so it says
// what it stands for.
func placeholderFor(guestEnv string) string {
	return PlaceholderPrefix + strings.ToLower(strings.ReplaceAll(guestEnv, "_", "-"))
}

// compileCredential checks one entry; fail reports under the entry's index.
func compileCredential(c Credential, source string, fail func(format string, args ...any)) (CredentialRule, bool) {
	ok := true
	bad := func(format string, args ...any) { ok = false; fail(format, args...) }
	pattern, err := ParsePattern(c.Host)
	switch {
	case strings.TrimSpace(c.Host) == "":
		bad("host: missing (an exact name or *.suffix)")
	case err != nil:
		bad("host: %v", err)
	case !pattern.wildcard && isAddress(pattern.host):
		bad("host: %q is an IP address; a credential is for a name (TLS names it)", c.Host)
	}
	switch h := strings.ToLower(c.Header); {
	case c.Header == "":
		bad("header: missing (the request header whose placeholder is replaced, e.g. x-api-key)")
	case !headerName.MatchString(c.Header):
		bad("header: %q is not a valid HTTP header name", c.Header)
	case headersNeverReplaced[h]:
		bad("header: %q frames or routes the request; a credential replaces an authentication header", c.Header)
	}
	switch {
	case c.SourceFile == "" && c.SourceEnv == "":
		bad("source_file or source_env: one is needed (where the real value is read from)")
	case c.SourceFile != "" && c.SourceEnv != "":
		bad("source_file and source_env: give one, not both")
	case c.SourceFile != "" && !filepath.IsAbs(c.SourceFile) && !strings.HasPrefix(c.SourceFile, "~/"):
		bad("source_file: %q is neither absolute nor under ~/", c.SourceFile)
	case c.SourceEnv != "" && !envName.MatchString(c.SourceEnv):
		bad("source_env: %q is not an environment variable name", c.SourceEnv)
	}
	switch {
	case c.GuestEnv == "":
		bad("guest_env: missing (the variable the guest's programs read the placeholder from, e.g. ANTHROPIC_API_KEY)")
	case !envName.MatchString(c.GuestEnv):
		bad("guest_env: %q is not an environment variable name", c.GuestEnv)
	case guestEnvReserved[c.GuestEnv] || strings.HasPrefix(c.GuestEnv, "LD_") || strings.HasPrefix(c.GuestEnv, "CAPSEM_"):
		bad("guest_env: %s is the sandbox's own variable", c.GuestEnv)
	}
	if c.CAFile != "" && !filepath.IsAbs(c.CAFile) && !strings.HasPrefix(c.CAFile, "~/") {
		bad("ca_file: %q is neither absolute nor under ~/", c.CAFile)
	}
	if !ok {
		return CredentialRule{}, false
	}
	return CredentialRule{Credential: c, Pattern: pattern, Placeholder: placeholderFor(c.GuestEnv), Source: source}, true
}

// credentialSet indexes the credentials of every layer: for a host pattern
// or a guest variable given by several files, the highest file's entry.
type credentialSet struct {
	rules  []CredentialRule // in precedence order, shadowed ones left out
	byHost patternSet[int]  // → index in rules
	// shadowed says why a configured entry is not in force, by its
	// (source, index) position.
	shadowed map[credentialRef]string
}

type credentialRef struct {
	source string
	index  int
}

func (s *credentialSet) add(r CredentialRule, index int) {
	for _, other := range s.rules {
		switch {
		case other.Pattern.host == r.Pattern.host && other.Pattern.wildcard == r.Pattern.wildcard:
			s.note(r, index, fmt.Sprintf("shadowed by the credential for %s in %s", other.Host, describe(other.Source)))
			return
		case other.GuestEnv == r.GuestEnv:
			s.note(r, index, fmt.Sprintf("shadowed: %s already holds the placeholder of the credential for %s in %s", r.GuestEnv, other.Host, describe(other.Source)))
			return
		}
	}
	s.rules = append(s.rules, r)
	s.byHost.add(r.Pattern, len(s.rules)-1)
}

func (s *credentialSet) note(r CredentialRule, index int, why string) {
	if s.shadowed == nil {
		s.shadowed = map[credentialRef]string{}
	}
	s.shadowed[credentialRef{r.Source, index}] = why
}

// Credential is the credential in force for a name: the most specific
// pattern covering it.
func (p *Policy) Credential(name string) (CredentialRule, bool) {
	host, err := NormalizeHost(name)
	if err != nil {
		return CredentialRule{}, false
	}
	i, ok := p.credentials.byHost.match(host)
	if !ok {
		return CredentialRule{}, false
	}
	return p.credentials.rules[i], true
}

// Credentials are every credential in force, highest file first.
func (p *Policy) Credentials() []CredentialRule {
	return append([]CredentialRule(nil), p.credentials.rules...)
}
