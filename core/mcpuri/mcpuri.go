// Package mcpuri puts MCP resource URIs into one canonical form, so that a
// policy rule matches the resource a server will read, not the spelling of
// its URI: the gateway canonicalises every resource URI before policy looks
// at it, matches rules against the canonical form, sends that form
// upstream, and refuses URIs a server could read differently.
//
// The canonical form is RFC 3986's syntax-based normalisation (section
// 6.2.2): the scheme and the host in lower case, percent-encodings of
// unreserved characters decoded and the others in upper-case hex, and the
// dot segments ("." and "..") removed from a hierarchical path. A URI with
// white space or a control character anywhere, or a broken
// percent-encoding, is refused: servers trim, split or decode those in
// their own ways.
package mcpuri

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Prefix starts a namespaced resource URI: capsem://<server>/<the server's
// own URI>.
const Prefix = "capsem://"

// ErrRefused is wrapped by every refusal.
var ErrRefused = errors.New("resource URI refused")

// CanonicalNamespaced canonicalises a namespaced URI: the server name as it
// is, the server's own URI in canonical form.
func CanonicalNamespaced(uri string) (string, error) {
	rest, ok := strings.CutPrefix(uri, Prefix)
	if !ok {
		if len(uri) >= len(Prefix) && strings.EqualFold(uri[:len(Prefix)], Prefix) {
			rest = uri[len(Prefix):]
		} else {
			return "", fmt.Errorf("%w: %q is not namespaced as %s<server>/<uri>", ErrRefused, uri, Prefix)
		}
	}
	server, inner, ok := strings.Cut(rest, "/")
	if !ok || server == "" || inner == "" {
		return "", fmt.Errorf("%w: %q is not namespaced as %s<server>/<uri>", ErrRefused, uri, Prefix)
	}
	if err := checkText(server); err != nil {
		return "", err
	}
	c, err := Canonical(inner)
	if err != nil {
		return "", err
	}
	return Prefix + server + "/" + c, nil
}

// Canonical returns uri in canonical form.
func Canonical(uri string) (string, error) {
	if err := checkText(uri); err != nil {
		return "", err
	}
	s, err := normalizePercent(uri)
	if err != nil {
		return "", err
	}
	scheme, rest := "", s
	if i := strings.IndexAny(s, ":/?#"); i > 0 && s[i] == ':' && validScheme(s[:i]) {
		scheme, rest = strings.ToLower(s[:i]), s[i+1:]
	}
	rest, fragment, hasFragment := strings.Cut(rest, "#")
	rest, query, hasQuery := strings.Cut(rest, "?")
	authority, path, hasAuthority := "", rest, false
	if a, ok := strings.CutPrefix(rest, "//"); ok {
		hasAuthority = true
		if i := strings.IndexByte(a, '/'); i >= 0 {
			authority, path = a[:i], a[i:]
		} else {
			authority, path = a, ""
		}
		authority = lowerHost(authority)
	}
	if strings.HasPrefix(path, "/") {
		path = removeDotSegments(path)
		// Without an authority a path may not start with "//", which would
		// read as one: "/0/..//a" must not become "//a" (RFC 3986, 5.2.4).
		if !hasAuthority && strings.HasPrefix(path, "//") {
			path = "/." + path
		}
	}
	var b strings.Builder
	if scheme != "" {
		b.WriteString(scheme + ":")
	}
	if hasAuthority {
		b.WriteString("//" + authority)
	}
	b.WriteString(path)
	if hasQuery {
		b.WriteString("?" + query)
	}
	if hasFragment {
		b.WriteString("#" + fragment)
	}
	return b.String(), nil
}

// checkText refuses white space (Unicode's too) and control characters.
func checkText(s string) error {
	for i, r := range s {
		if r <= 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) || r == 0x85 || r == 0xa0 || r == 0x1680 ||
			(r >= 0x2000 && r <= 0x200b) || r == 0x2028 || r == 0x2029 || r == 0x202f || r == 0x205f || r == 0x3000 || r == 0xfeff {
			return fmt.Errorf("%w: %q holds white space or a control character (U+%04X at byte %d)", ErrRefused, s, r, i)
		}
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrRefused, s)
	}
	return nil
}

func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case i > 0 && (c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// normalizePercent decodes percent-encoded unreserved characters and writes
// the other encodings in upper-case hex. An encoded white space or control
// character is refused like a raw one: a server that decodes would read it.
func normalizePercent(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("%w: %q has a broken percent-encoding at byte %d", ErrRefused, s, i)
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("%w: %q has a broken percent-encoding at byte %d", ErrRefused, s, i)
		}
		c := hi<<4 | lo
		switch {
		case c <= 0x20 || c == 0x7f:
			return "", fmt.Errorf("%w: %q encodes white space or a control character (%%%02X at byte %d)", ErrRefused, s, c, i)
		case unreserved(c):
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
		i += 2
	}
	return b.String(), nil
}

// lowerHost lower-cases the host of an authority ([userinfo@]host[:port]);
// the user information keeps its case.
func lowerHost(a string) string {
	user, host := "", a
	if i := strings.LastIndexByte(a, '@'); i >= 0 {
		user, host = a[:i+1], a[i+1:]
	}
	return user + strings.ToLower(host)
}

// removeDotSegments is RFC 3986's algorithm (section 5.2.4) for an
// absolute path.
func removeDotSegments(path string) string {
	var out []string
	segs := strings.Split(path[1:], "/")
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	return "/" + strings.Join(out, "/")
}
