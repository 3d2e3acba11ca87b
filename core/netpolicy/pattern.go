package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxHostLength is the DNS limit on a full host name.
const maxHostLength = 253

// Pattern is one parsed allow or block entry: an exact host (a name or an IP
// address), or "*.suffix", which matches every subdomain of suffix but not
// suffix itself.
type Pattern struct {
	configured string // as the user wrote it (trimmed), quoted in messages
	host       string // normalized exact host, or the suffix of a wildcard
	wildcard   bool
}

// ParsePattern validates and normalizes one allow or block entry.
func ParsePattern(configured string) (Pattern, error) {
	trimmed := strings.TrimSpace(configured)
	if trimmed == "" {
		return Pattern{}, errors.New("empty domain pattern")
	}
	if strings.Contains(trimmed, "://") || strings.ContainsAny(trimmed, "/?#@") {
		return Pattern{}, fmt.Errorf("domain pattern %q must be a host name, not a URL", trimmed)
	}
	pattern := Pattern{configured: trimmed}
	hostPart := trimmed
	if rest, ok := strings.CutPrefix(trimmed, "*."); ok {
		pattern.wildcard = true
		hostPart = rest
	}
	if strings.Contains(hostPart, "*") {
		return Pattern{}, fmt.Errorf(`domain pattern %q: "*" is only allowed as a leading "*." label`, trimmed)
	}
	host, err := NormalizeHost(hostPart)
	if err != nil {
		return Pattern{}, fmt.Errorf("domain pattern %q: %w", trimmed, err)
	}
	if pattern.wildcard {
		if _, err := netip.ParseAddr(host); err == nil {
			return Pattern{}, fmt.Errorf("domain pattern %q: a wildcard needs a domain name, not an IP address", trimmed)
		}
	}
	pattern.host = host
	return pattern, nil
}

// Matches reports whether the normalized host (see NormalizeHost) is covered
// by the pattern.
func (p Pattern) Matches(normalizedHost string) bool {
	if p.wildcard {
		// The leading dot makes "*.example.com" skip both the apex and
		// look-alikes such as "badexample.com".
		return strings.HasSuffix(normalizedHost, "."+p.host)
	}
	return normalizedHost == p.host
}

// numericLastLabel reports whether a host ends in an all-digit label, as an
// IPv4 address does.
func numericLastLabel(host string) bool {
	label := host[strings.LastIndexByte(host, '.')+1:]
	for i := 0; i < len(label); i++ {
		if label[i] < '0' || label[i] > '9' {
			return false
		}
	}
	return label != ""
}

// String is the pattern as configured (trimmed), as messages quote it.
func (p Pattern) String() string { return p.configured }

// NormalizeHost gives the single spelling of a host that policy compares:
// lower case, no trailing dot, IP addresses in canonical form (no IPv6
// brackets or zone, IPv4-mapped IPv6 unmapped).
// Non-ASCII names are refused rather than converted, so a Unicode spelling
// can never slip past a pattern written in punycode (or the reverse).
func NormalizeHost(host string) (string, error) {
	host = strings.TrimSpace(host)
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(host, ".")
	if host == "" {
		return "", errors.New("empty host")
	}
	// Only a host ending in a digit or holding a colon can be an address;
	// skipping the parse for names spares an allocation per lookup.
	if last := host[len(host)-1]; last >= '0' && last <= '9' || strings.IndexByte(host, ':') >= 0 {
		if addr, err := netip.ParseAddr(host); err == nil {
			// The zone names a local interface, not a destination.
			return addr.Unmap().WithZone("").String(), nil
		}
	}
	if len(host) > maxHostLength {
		return "", fmt.Errorf("host is longer than %d characters", maxHostLength)
	}
	host = strings.ToLower(host)
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		case c >= 0x80:
			return "", fmt.Errorf("host %q is not ASCII: write it in punycode (xn--…) form", host)
		default:
			return "", fmt.Errorf("host %q contains the invalid character %q", host, c)
		}
	}
	for label := range strings.SplitSeq(host, ".") {
		if label == "" {
			return "", fmt.Errorf("host %q has an empty label", host)
		}
	}
	if numericLastLabel(host) {
		// Resolvers read "127.1", "2130706433" or "010.0.0.1" as addresses
		// (inet_aton's forms): as names they would pass policy for names
		// and then reach an address no pattern named. No real name ends
		// in a number.
		return "", fmt.Errorf("host %q is neither a name (its last label is a number) nor an IP address in dotted-decimal form", host)
	}
	return host, nil
}

// patternSet finds the pattern that covers a host with a map lookup per
// label rather than a scan of every pattern: a guest may ask per
// connection, and lists can be long.
type patternSet[T any] struct {
	exact  map[string]T // by normalized host
	suffix map[string]T // "*.suffix" by suffix
}

// add keeps the first value given for a pattern.
func (s *patternSet[T]) add(p Pattern, value T) {
	m := &s.exact
	if p.wildcard {
		m = &s.suffix
	}
	if *m == nil {
		*m = map[string]T{}
	}
	if _, ok := (*m)[p.host]; !ok {
		(*m)[p.host] = value
	}
}

// match finds the most specific pattern covering a normalized host: the
// exact one, else the wildcard with the longest suffix.
func (s *patternSet[T]) match(normalizedHost string) (T, bool) {
	if v, ok := s.exact[normalizedHost]; ok {
		return v, true
	}
	if len(s.suffix) > 0 {
		// Every proper suffix that starts at a label: "a.b.c" tries "b.c",
		// then "c". No IP address matches: a wildcard's suffix is a name,
		// which never ends in a number (NormalizeHost), and an IPv6
		// address has no dots once normalized.
		for rest := normalizedHost; ; {
			i := strings.IndexByte(rest, '.')
			if i < 0 {
				break
			}
			rest = rest[i+1:]
			if v, ok := s.suffix[rest]; ok {
				return v, true
			}
		}
	}
	var zero T
	return zero, false
}

func (s *patternSet[T]) empty() bool { return len(s.exact) == 0 && len(s.suffix) == 0 }
