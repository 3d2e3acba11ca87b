package builtintools

import (
	"fmt"
	"time"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/netpolicy"
)

// Defaults applied to zero Config fields.
const (
	DefaultMaxBodyBytes int64 = 10 << 20
	DefaultTimeout            = 30 * time.Second
	DefaultMaxRedirects       = 10
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

// ConfigFromEnv builds a Config from the variables config.File.ServerDefs
// sets for the builtin server: envvars.DomainAllow and DomainBlock
// (comma-separated patterns), HTTPMaxBodyBytes (positive integer, at most
// 1 GiB), HTTPTimeout (positive number of seconds, fractions allowed, at most
// an hour) and HTTPAllowPrivate (1, true, 0 or false; any case). Unset or
// empty variables keep the defaults.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	var err error
	if cfg.Allow, _, err = envvars.DomainAllow.ValueFrom(getenv); err != nil {
		return Config{}, err
	}
	if cfg.Block, _, err = envvars.DomainBlock.ValueFrom(getenv); err != nil {
		return Config{}, err
	}
	if cfg.MaxBodyBytes, _, err = envvars.HTTPMaxBodyBytes.ValueFrom(getenv); err != nil {
		return Config{}, err
	}
	if cfg.Timeout, _, err = envvars.HTTPTimeout.ValueFrom(getenv); err != nil {
		return Config{}, err
	}
	if cfg.AllowPrivateNetworks, _, err = envvars.HTTPAllowPrivate.ValueFrom(getenv); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("domain policy from %s/%s: %w", envvars.DomainAllow.Name(), envvars.DomainBlock.Name(), err)
	}
	return cfg.withDefaults(), nil
}
