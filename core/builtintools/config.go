package builtintools

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/capsem/capsem/core/netpolicy"
)

// Defaults applied to zero Config fields.
const (
	DefaultMaxBodyBytes int64 = 10 << 20
	DefaultTimeout            = 30 * time.Second
	DefaultMaxRedirects       = 10
)

// Bounds on values read from the environment, so a typo cannot turn the
// builtin into an unbounded fetcher.
const (
	maxConfigBodyBytes int64 = 1 << 30
	maxConfigTimeout         = time.Hour
)

// Environment variables read by ConfigFromEnv.
const (
	EnvDomainAllow      = "CAPSEM_DOMAIN_ALLOW"
	EnvDomainBlock      = "CAPSEM_DOMAIN_BLOCK"
	EnvHTTPMaxBody      = "CAPSEM_HTTP_MAX_BODY_BYTES"
	EnvHTTPTimeoutSecs  = "CAPSEM_HTTP_TIMEOUT_SECS"
	EnvHTTPAllowPrivate = "CAPSEM_HTTP_ALLOW_PRIVATE"
)

// Config is the builtin HTTP tools' network policy and limits.
//
// Allow and Block hold host patterns: an exact host ("example.com",
// "127.0.0.1") or "*.suffix", which matches subdomains of suffix but not
// suffix itself. Matching ignores case and a trailing dot. Block is checked
// before Allow; when Allow is non-empty, hosts it does not match are denied.
// The policy applies to the first URL and to every redirect hop.
type Config struct {
	Allow []string
	Block []string
	// MaxBodyBytes caps how much of a response body is read; 0 means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Timeout bounds one tool call's HTTP exchange (all redirects and the
	// body read); 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxRedirects is how many redirects are followed; 0 means
	// DefaultMaxRedirects and a negative value follows none (the 3xx
	// response is returned as is).
	MaxRedirects int
	// AllowPrivateNetworks lets requests reach non-public addresses:
	// loopback, private (RFC 1918, fc00::/7), link-local (including the
	// 169.254.169.254 metadata service), carrier-grade NAT, unspecified,
	// multicast and reserved ranges, and IPv4-mapped or embedded forms of
	// them. It is false by default because the builtin runs on the host on
	// behalf of a sandboxed agent. The check is made on the resolved
	// address of every connection, redirect hops included; the domain
	// policy cannot lift it.
	AllowPrivateNetworks bool
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxRedirects == 0 {
		c.MaxRedirects = DefaultMaxRedirects
	}
	return c
}

// Validate reports the first problem in the configuration: an unparsable
// domain pattern or a negative limit.
func (c Config) Validate() error {
	if c.MaxBodyBytes < 0 {
		return fmt.Errorf("max body bytes must not be negative, got %d", c.MaxBodyBytes)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("timeout must not be negative, got %s", c.Timeout)
	}
	if _, err := netpolicy.CompileLists(c.Allow, c.Block); err != nil {
		return err
	}
	return nil
}

// ConfigFromEnv builds a Config from CAPSEM_DOMAIN_ALLOW and
// CAPSEM_DOMAIN_BLOCK (comma-separated patterns), CAPSEM_HTTP_MAX_BODY_BYTES
// (positive integer), CAPSEM_HTTP_TIMEOUT_SECS (positive number, fractions
// allowed) and CAPSEM_HTTP_ALLOW_PRIVATE (1, true, 0 or false; any case).
// Unset or empty variables keep the defaults.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{
		Allow: splitPatternList(getenv(EnvDomainAllow)),
		Block: splitPatternList(getenv(EnvDomainBlock)),
	}
	if raw := strings.TrimSpace(getenv(EnvHTTPMaxBody)); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return Config{}, fmt.Errorf("%s=%q: not a whole number of bytes: %w", EnvHTTPMaxBody, raw, err)
		}
		if n <= 0 || n > maxConfigBodyBytes {
			return Config{}, fmt.Errorf("%s=%q: must be between 1 and %d bytes", EnvHTTPMaxBody, raw, maxConfigBodyBytes)
		}
		cfg.MaxBodyBytes = n
	}
	if raw := strings.TrimSpace(getenv(EnvHTTPTimeoutSecs)); raw != "" {
		secs, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return Config{}, fmt.Errorf("%s=%q: not a number of seconds: %w", EnvHTTPTimeoutSecs, raw, err)
		}
		if math.IsNaN(secs) || secs <= 0 || secs > maxConfigTimeout.Seconds() {
			return Config{}, fmt.Errorf("%s=%q: must be more than 0 and at most %d seconds", EnvHTTPTimeoutSecs, raw, int(maxConfigTimeout.Seconds()))
		}
		cfg.Timeout = time.Duration(secs * float64(time.Second))
		if cfg.Timeout <= 0 {
			return Config{}, errors.New(EnvHTTPTimeoutSecs + ": timeout rounds down to zero")
		}
	}
	if raw := strings.TrimSpace(getenv(EnvHTTPAllowPrivate)); raw != "" {
		switch strings.ToLower(raw) {
		case "1", "true":
			cfg.AllowPrivateNetworks = true
		case "0", "false":
			cfg.AllowPrivateNetworks = false
		default:
			return Config{}, fmt.Errorf("%s=%q: must be 1, true, 0 or false", EnvHTTPAllowPrivate, raw)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("domain policy from %s/%s: %w", EnvDomainAllow, EnvDomainBlock, err)
	}
	return cfg.withDefaults(), nil
}

// splitPatternList splits a comma list, dropping blanks so "a.com, b.com,"
// is two patterns.
func splitPatternList(raw string) []string {
	var patterns []string
	for entry := range strings.SplitSeq(raw, ",") {
		if entry = strings.TrimSpace(entry); entry != "" {
			patterns = append(patterns, entry)
		}
	}
	return patterns
}
