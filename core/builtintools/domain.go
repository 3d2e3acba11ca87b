package builtintools

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// maxHostLength is the DNS limit on a full host name.
const maxHostLength = 253

// domainPattern is one parsed allow or block entry: an exact host, or
// "*.suffix", which matches every subdomain of suffix but not suffix itself.
type domainPattern struct {
	configured string // as the user wrote it (trimmed), quoted in messages
	host       string // normalized exact host, or the suffix of a wildcard
	wildcard   bool
}

// parseDomainPattern validates and normalizes one allow/block entry.
func parseDomainPattern(configured string) (domainPattern, error) {
	trimmed := strings.TrimSpace(configured)
	if trimmed == "" {
		return domainPattern{}, errors.New("empty domain pattern")
	}
	if strings.Contains(trimmed, "://") || strings.ContainsAny(trimmed, "/?#@") {
		return domainPattern{}, fmt.Errorf("domain pattern %q must be a host name, not a URL", trimmed)
	}
	pattern := domainPattern{configured: trimmed}
	hostPart := trimmed
	if rest, ok := strings.CutPrefix(trimmed, "*."); ok {
		pattern.wildcard = true
		hostPart = rest
	}
	if strings.Contains(hostPart, "*") {
		return domainPattern{}, fmt.Errorf(`domain pattern %q: "*" is only allowed as a leading "*." label`, trimmed)
	}
	host, err := normalizeHost(hostPart)
	if err != nil {
		return domainPattern{}, fmt.Errorf("domain pattern %q: %w", trimmed, err)
	}
	if pattern.wildcard {
		if _, err := netip.ParseAddr(host); err == nil {
			return domainPattern{}, fmt.Errorf("domain pattern %q: a wildcard needs a domain name, not an IP address", trimmed)
		}
	}
	pattern.host = host
	return pattern, nil
}

// matches reports whether the normalized host is covered by the pattern.
func (p domainPattern) matches(normalizedHost string) bool {
	if p.wildcard {
		// The leading dot makes "*.example.com" skip both the apex and
		// look-alikes such as "badexample.com".
		return strings.HasSuffix(normalizedHost, "."+p.host)
	}
	return normalizedHost == p.host
}

// normalizeHost gives the single spelling of a host that policy compares:
// lower case, no trailing dot, IP addresses in canonical form (no IPv6
// brackets or zone, IPv4-mapped IPv6 unmapped).
// Non-ASCII names are refused rather than converted, so a Unicode spelling
// can never slip past a pattern written in punycode (or the reverse).
func normalizeHost(host string) (string, error) {
	host = strings.TrimSpace(host)
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(host, ".")
	if host == "" {
		return "", errors.New("empty host")
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		// The zone names a local interface, not a destination.
		return addr.Unmap().WithZone("").String(), nil
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
	return host, nil
}

// Decision values recorded in NetEvent.Decision.
const (
	DecisionAllowed = "allowed"
	DecisionDenied  = "denied"
	DecisionError   = "error"
)

// domainPolicy is the compiled allow/block configuration.
type domainPolicy struct {
	allow []domainPattern
	block []domainPattern
	// invalid is set when the configuration could not be compiled; every
	// request is then refused (fail closed) with this error.
	invalid error
}

// policyVerdict is the outcome of checking one host.
type policyVerdict struct {
	allowed     bool
	matchedRule string // the configured pattern that decided, if any
	reason      string // why a host was denied, for messages and telemetry
}

func compileDomainPolicy(allow, block []string) (*domainPolicy, error) {
	policy := &domainPolicy{}
	for _, entry := range block {
		pattern, err := parseDomainPattern(entry)
		if err != nil {
			return nil, fmt.Errorf("block list: %w", err)
		}
		policy.block = append(policy.block, pattern)
	}
	for _, entry := range allow {
		pattern, err := parseDomainPattern(entry)
		if err != nil {
			return nil, fmt.Errorf("allow list: %w", err)
		}
		policy.allow = append(policy.allow, pattern)
	}
	return policy, nil
}

// check decides one normalized host: block wins over allow, and a non-empty
// allow list denies everything it does not name.
func (p *domainPolicy) check(normalizedHost string) policyVerdict {
	if p.invalid != nil {
		return policyVerdict{reason: "domain policy is invalid: " + p.invalid.Error()}
	}
	for _, pattern := range p.block {
		if pattern.matches(normalizedHost) {
			return policyVerdict{matchedRule: pattern.configured, reason: fmt.Sprintf("domain blocked by %q", pattern.configured)}
		}
	}
	if len(p.allow) == 0 {
		return policyVerdict{allowed: true}
	}
	for _, pattern := range p.allow {
		if pattern.matches(normalizedHost) {
			return policyVerdict{allowed: true, matchedRule: pattern.configured}
		}
	}
	return policyVerdict{reason: "domain not in allow list"}
}
