// Package config loads Capsem's TOML configuration files. Unknown keys and bad
// values are errors that name the file, the key and the reason.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/policy"
	"github.com/capsem/capsem/core/privsep"
)

// File is one configuration file.
type File struct {
	MCP MCP `toml:"mcp"`
	Net Net `toml:"net"`

	// defined reports whether the file set a key (so a merge can tell "not
	// set" from a zero value); nil for a File built in code.
	defined func(key ...string) bool
}

// MCP is the [mcp] table.
type MCP struct {
	// Policy (see core/policy): the default decision, server lists, per-tool
	// decisions and content rules.
	Default        string            `toml:"default"` // allow | warn | block
	BlockedServers []string          `toml:"blocked_servers"`
	AllowedServers []string          `toml:"allowed_servers"` // empty: every server not blocked
	Tools          map[string]string `toml:"tools"`           // namespaced name → allow | warn | block
	Rules          []RuleSpec        `toml:"rules"`

	Servers  []Server `toml:"servers"`
	Builtin  Builtin  `toml:"builtin"`
	Timeouts Timeouts `toml:"timeouts"`
}

// Net is the [net] table: where the guest's network may go. Merge compiles
// the tables of every file into one netpolicy.Policy, in which a lower file
// can only tighten a higher one.
type Net struct {
	Default      string            `toml:"default"`       // allow | block (default: block)
	Allow        []string          `toml:"allow"`         // exact names, *.suffix and IP addresses
	Block        []string          `toml:"block"`         // wins over allow, in every file
	Ports        []int             `toml:"ports"`         // destination ports (default: 80 and 443)
	AllowPrivate []string          `toml:"allow_private"` // names that may reach private or loopback addresses
	Hosts        map[string]string `toml:"hosts"`         // name → IPv4: fixed answers of the VM's DNS
	GuestRoots   []string          `toml:"guest_roots"`   // PEM files (globs) of CAs the guest's TLS clients trust too
	// Credentials are secrets the host adds to the guest's requests (see
	// netpolicy.Credential); the real values stay out of the file.
	Credentials []netpolicy.Credential `toml:"credentials"`
}

// netLayer is the file's [net] table as a netpolicy layer. A parsed file
// sets ports and allow_private when it names them (ports = [] allows no
// port); a File built in code, when they are not empty.
func (f *File) netLayer(source string) netpolicy.Layer {
	n := f.Net
	set := func(key string, nonEmpty bool) bool {
		if f.defined == nil {
			return nonEmpty
		}
		return f.defined("net", key)
	}
	return netpolicy.Layer{
		Source: source, Default: n.Default, Allow: n.Allow, Block: n.Block,
		Ports: n.Ports, PortsSet: set("ports", len(n.Ports) > 0),
		AllowPrivate: n.AllowPrivate, AllowPrivateSet: set("allow_private", len(n.AllowPrivate) > 0),
		Hosts: n.Hosts, Credentials: n.Credentials, GuestRoots: n.GuestRoots,
	}
}

// Server is one [[mcp.servers]] entry: command/args/env for stdio, or
// url/headers for streamable HTTP.
type Server struct {
	Name               string            `toml:"name"`
	Command            string            `toml:"command"`
	Args               []string          `toml:"args"`
	Env                map[string]string `toml:"env"`
	URL                string            `toml:"url"`
	Headers            map[string]string `toml:"headers"`
	Enabled            *bool             `toml:"enabled"` // default true
	ConnectTimeoutSecs int               `toml:"connect_timeout_secs"`
	// Paths the server's sandbox may read and execute, or also write; nothing
	// else outside the system directories and its scratch space is reachable.
	// An absolute command is granted read and execute automatically.
	ReadPaths  []string `toml:"read_paths"`
	WritePaths []string `toml:"write_paths"`
}

// RuleSpec is one [[mcp.rules]] content rule; every condition given must
// match. equals and returns_equals take any TOML value, compared as JSON.
type RuleSpec struct {
	Name           string `toml:"name"`
	Action         string `toml:"action"` // allow | block
	Tool           string `toml:"tool"`
	ResourceURI    string `toml:"resource_uri"`
	Argument       string `toml:"argument"`
	Equals         any    `toml:"equals"`
	Matches        string `toml:"matches"`
	Returns        string `toml:"returns"`
	ReturnsEquals  any    `toml:"returns_equals"`
	ReturnsMatches string `toml:"returns_matches"`
}

// Builtin configures the builtin HTTP tools.
type Builtin struct {
	DomainAllow  []string `toml:"domain_allow"`
	DomainBlock  []string `toml:"domain_block"`
	MaxBodyBytes int64    `toml:"max_body_bytes"`
	TimeoutSecs  int      `toml:"timeout_secs"`
	// AllowPrivateNetworks lets the builtin reach loopback, private and
	// link-local addresses (off by default: it runs on the host).
	AllowPrivateNetworks bool `toml:"allow_private_networks"`

	privateSet bool // merge: a higher file already decided AllowPrivateNetworks
}

// Timeouts configures the endpoint's deadlines.
type Timeouts struct {
	DefaultSecs  int            `toml:"default_secs"`
	ToolCallSecs int            `toml:"tool_call_secs"`
	Tools        map[string]int `toml:"tools"` // namespaced tool → seconds
}

// Load reads and validates one file.
func Load(path string) (*File, error) {
	data, err := readBounded(path, MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse decodes and validates configuration text; name labels errors.
func Parse(name string, data []byte) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("config %s: %d bytes; the limit is %d", name, len(data), MaxFileBytes)
	}
	if err := checkNesting(data, MaxNesting); err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	var f File
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	var unknown []string
	for _, k := range md.Undecoded() {
		// equals = { a = 1 } is a value, not keys of the schema.
		if len(k) > 3 && k[0] == "mcp" && k[1] == "rules" && (k[2] == "equals" || k[2] == "returns_equals") {
			continue
		}
		unknown = append(unknown, k.String())
	}
	if len(unknown) > 0 {
		more := ""
		if len(unknown) > maxListedKeys {
			more = fmt.Sprintf(" and %d more", len(unknown)-maxListedKeys)
			unknown = unknown[:maxListedKeys]
		}
		return nil, fmt.Errorf("config %s: unknown key(s): %s%s", name, strings.Join(unknown, ", "), more)
	}
	f.defined = md.IsDefined
	if err := f.validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	return &f, nil
}

func (f *File) validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, s := range f.MCP.Servers {
		where := fmt.Sprintf("mcp.servers[%d] (%q)", i, s.Name)
		if err := ValidateServerName(s.Name); err != nil {
			errs = append(errs, fmt.Errorf("%s: name: %w", where, err))
		}
		if seen[s.Name] {
			errs = append(errs, fmt.Errorf("%s: name: duplicate server name", where))
		}
		seen[s.Name] = true
		switch {
		case s.Command == "" && s.URL == "":
			errs = append(errs, fmt.Errorf("%s: needs either command (stdio) or url (streamable HTTP)", where))
		case s.Command != "" && s.URL != "":
			errs = append(errs, fmt.Errorf("%s: has both command and url; choose one transport", where))
		}
		if s.URL != "" && !strings.HasPrefix(s.URL, "http://") && !strings.HasPrefix(s.URL, "https://") {
			errs = append(errs, fmt.Errorf("%s: url: %q is not an http(s) URL", where, s.URL))
		}
		if s.URL == "" && len(s.Headers) > 0 {
			errs = append(errs, fmt.Errorf("%s: headers: only valid with url", where))
		}
		if s.Command == "" && (len(s.Args) > 0 || len(s.Env) > 0) {
			errs = append(errs, fmt.Errorf("%s: args/env: only valid with command", where))
		}
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			if err := privsep.CheckEnv(k, s.Env[k]); err != nil {
				errs = append(errs, fmt.Errorf("%s: env: %w", where, err))
			}
		}
		if s.ConnectTimeoutSecs < 0 {
			errs = append(errs, fmt.Errorf("%s: connect_timeout_secs: must not be negative", where))
		}
		for _, p := range append(append([]string{}, s.ReadPaths...), s.WritePaths...) {
			if !filepath.IsAbs(p) {
				errs = append(errs, fmt.Errorf("%s: read_paths/write_paths: %q is not an absolute path", where, p))
			}
		}
	}
	if f.MCP.Builtin.MaxBodyBytes < 0 || f.MCP.Builtin.TimeoutSecs < 0 {
		errs = append(errs, errors.New("mcp.builtin: max_body_bytes and timeout_secs must not be negative"))
	}
	if f.MCP.Timeouts.DefaultSecs < 0 || f.MCP.Timeouts.ToolCallSecs < 0 {
		errs = append(errs, errors.New("mcp.timeouts: values must not be negative"))
	}
	for tool, secs := range f.MCP.Timeouts.Tools {
		if !strings.Contains(tool, "__") {
			errs = append(errs, fmt.Errorf("mcp.timeouts.tools: %q is not a namespaced tool name (server__tool)", tool))
		}
		if secs <= 0 {
			errs = append(errs, fmt.Errorf("mcp.timeouts.tools.%q: must be a positive number of seconds", tool))
		}
	}
	errs = append(errs, f.validatePolicy()...)
	// The same compilation Merge does, so Merge cannot fail on a parsed
	// file; the errors start with the key (net.ports: …).
	if _, err := netpolicy.Compile([]netpolicy.Layer{f.netLayer("")}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// isDefined reports whether the file set key; a File built in code counts
// every key as set, zero values included.
func (f *File) isDefined(key ...string) bool {
	if f.defined == nil {
		return true
	}
	return f.defined(key...)
}

func (f *File) validatePolicy() []error {
	var errs []error
	m := &f.MCP
	if m.Default != "" {
		if _, err := ParseDecision(m.Default); err != nil {
			errs = append(errs, fmt.Errorf("mcp.default: %w", err))
		}
	}
	for key, list := range map[string][]string{"blocked_servers": m.BlockedServers, "allowed_servers": m.AllowedServers} {
		for _, name := range list {
			if name == "builtin" {
				continue
			}
			if err := ValidateServerName(name); err != nil {
				errs = append(errs, fmt.Errorf("mcp.%s: %w", key, err))
			}
		}
	}
	for name, d := range m.Tools {
		server, tool, ok := strings.Cut(name, "__")
		if !ok || server == "" || tool == "" {
			errs = append(errs, fmt.Errorf("mcp.tools: %q is not a namespaced name (server__tool)", name))
		}
		if _, err := ParseDecision(d); err != nil {
			errs = append(errs, fmt.Errorf("mcp.tools.%q: %w", name, err))
		}
	}
	names := map[string]bool{}
	for i, spec := range m.Rules {
		where := fmt.Sprintf("mcp.rules[%d]", i)
		if spec.Name != "" {
			where += fmt.Sprintf(" (%q)", spec.Name)
			if names[spec.Name] {
				errs = append(errs, fmt.Errorf("%s: name: duplicate rule name", where))
			}
			names[spec.Name] = true
		}
		if _, err := spec.Compile(fmt.Sprintf("rules[%d]", i)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	return errs
}

// ParseDecision maps allow | warn | block to a policy decision.
func ParseDecision(s string) (policy.Decision, error) {
	switch s {
	case "allow":
		return policy.Allow, nil
	case "warn":
		return policy.Warn, nil
	case "block":
		return policy.Block, nil
	}
	return 0, fmt.Errorf("%q is not a decision (allow, warn or block)", s)
}

// Compile turns a rule spec into a policy rule; fallbackName names rules
// that have no name of their own.
func (spec *RuleSpec) Compile(fallbackName string) (policy.Rule, error) {
	r := policy.Rule{Name: spec.Name, Tool: spec.Tool, ResourceURI: spec.ResourceURI, Argument: spec.Argument, Returns: spec.Returns}
	if r.Name == "" {
		r.Name = fallbackName
	}
	switch spec.Action {
	case "allow":
		r.Action = policy.Allow
	case "block":
		r.Action = policy.Block
	case "":
		return r, errors.New("action: missing (allow or block)")
	default:
		return r, fmt.Errorf("action: %q is not allow or block", spec.Action)
	}
	var err error
	if r.Equals, err = tomlToJSON(spec.Equals); err != nil {
		return r, fmt.Errorf("equals: %w", err)
	}
	if r.ReturnsEquals, err = tomlToJSON(spec.ReturnsEquals); err != nil {
		return r, fmt.Errorf("returns_equals: %w", err)
	}
	if spec.Matches != "" {
		if r.Matches, err = regexp.Compile(spec.Matches); err != nil {
			return r, fmt.Errorf("matches: %w", err)
		}
	}
	if spec.ReturnsMatches != "" {
		if r.ReturnsMatches, err = regexp.Compile(spec.ReturnsMatches); err != nil {
			return r, fmt.Errorf("returns_matches: %w", err)
		}
	}
	if err := r.Validate(); err != nil {
		return r, err
	}
	return r, nil
}

// tomlToJSON encodes a decoded TOML value as JSON (nil stays empty).
func tomlToJSON(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("cannot be compared as JSON: %w", err)
	}
	return b, nil
}

// ValidateServerName reports why a configured server name is unusable.
func ValidateServerName(name string) error {
	switch {
	case name == "":
		return errors.New("server name is empty")
	case strings.Contains(name, "__"):
		return fmt.Errorf("%q contains \"__\", the namespace separator", name)
	case name == "builtin":
		return errors.New(`"builtin" is reserved for the builtin server`)
	}
	for i, r := range name {
		ok := r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !ok || (i == 0 && (r == '-' || r == '_')) || i >= 64 {
			return fmt.Errorf("%q must be 1-64 letters, digits, '_' or '-', starting with a letter or digit", name)
		}
	}
	return nil
}

// ServerDefs converts the configured servers to aggregator definitions,
// builtin first.
func (f *File) ServerDefs() []aggwire.ServerDef {
	b := f.MCP.Builtin
	env := map[string]string{}
	if len(b.DomainAllow) > 0 {
		env[envvars.DomainAllow.Name()] = strings.Join(b.DomainAllow, ",")
	}
	if len(b.DomainBlock) > 0 {
		env[envvars.DomainBlock.Name()] = strings.Join(b.DomainBlock, ",")
	}
	if b.MaxBodyBytes > 0 {
		env[envvars.HTTPMaxBodyBytes.Name()] = fmt.Sprint(b.MaxBodyBytes)
	}
	if b.TimeoutSecs > 0 {
		env[envvars.HTTPTimeout.Name()] = fmt.Sprint(b.TimeoutSecs)
	}
	if b.AllowPrivateNetworks {
		env[envvars.HTTPAllowPrivate.Name()] = "1"
	}
	defs := []aggwire.ServerDef{{Name: "builtin", Builtin: true, Enabled: f.permitsServer("builtin"), Env: env}}
	for _, s := range f.MCP.Servers {
		// A server policy blocks is never started: a blocked request must
		// not reach it, and its command must not run at all.
		def := aggwire.ServerDef{Name: s.Name, Command: s.Command, Args: s.Args, Env: s.Env, URL: s.URL, Headers: s.Headers,
			Enabled: (s.Enabled == nil || *s.Enabled) && f.permitsServer(s.Name), ConnectTimeoutMS: int64(s.ConnectTimeoutSecs) * 1000,
			ReadPaths: s.ReadPaths, WritePaths: s.WritePaths}
		defs = append(defs, def)
	}
	return defs
}

// permitsServer reports whether the policy lists leave a server usable.
func (f *File) permitsServer(name string) bool {
	if slices.Contains(f.MCP.BlockedServers, name) {
		return false
	}
	return len(f.MCP.AllowedServers) == 0 || slices.Contains(f.MCP.AllowedServers, name)
}

// SandboxPaths returns the union of the servers' read+execute and write grants.
func (f *File) SandboxPaths() (read, write []string) {
	for _, s := range f.MCP.Servers {
		if s.Enabled != nil && !*s.Enabled || !f.permitsServer(s.Name) {
			continue
		}
		read = append(read, s.ReadPaths...)
		if filepath.IsAbs(s.Command) {
			read = append(read, s.Command)
		}
		write = append(write, s.WritePaths...)
	}
	sort.Strings(read)
	sort.Strings(write)
	return read, write
}

// ToolTimeouts returns the per-tool deadlines.
func (f *File) ToolTimeouts() map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range f.MCP.Timeouts.Tools {
		out[k] = time.Duration(v) * time.Second
	}
	return out
}
