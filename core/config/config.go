// Package config loads Capsem's TOML configuration files. Unknown keys and bad
// values are errors that name the file, the key and the reason.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/capsem/capsem/core/aggwire"
)

// File is one configuration file.
type File struct {
	MCP MCP `toml:"mcp"`
}

// MCP is the [mcp] table.
type MCP struct {
	Servers  []Server `toml:"servers"`
	Builtin  Builtin  `toml:"builtin"`
	Timeouts Timeouts `toml:"timeouts"`
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

// Builtin configures the builtin HTTP tools.
type Builtin struct {
	DomainAllow  []string `toml:"domain_allow"`
	DomainBlock  []string `toml:"domain_block"`
	MaxBodyBytes int64    `toml:"max_body_bytes"`
	TimeoutSecs  int      `toml:"timeout_secs"`
	// AllowPrivateNetworks lets the builtin reach loopback, private and
	// link-local addresses (off by default: it runs on the host).
	AllowPrivateNetworks bool `toml:"allow_private_networks"`
}

// Timeouts configures the endpoint's deadlines.
type Timeouts struct {
	DefaultSecs  int            `toml:"default_secs"`
	ToolCallSecs int            `toml:"tool_call_secs"`
	Tools        map[string]int `toml:"tools"` // namespaced tool → seconds
}

// Load reads and validates one file.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return Parse(path, data)
}

// Parse decodes and validates configuration text; name labels errors.
func Parse(name string, data []byte) (*File, error) {
	var f File
	md, err := toml.Decode(string(data), &f)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("config %s: unknown key(s): %s", name, strings.Join(keys, ", "))
	}
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
	return errors.Join(errs...)
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
		env["CAPSEM_DOMAIN_ALLOW"] = strings.Join(b.DomainAllow, ",")
	}
	if len(b.DomainBlock) > 0 {
		env["CAPSEM_DOMAIN_BLOCK"] = strings.Join(b.DomainBlock, ",")
	}
	if b.MaxBodyBytes > 0 {
		env["CAPSEM_HTTP_MAX_BODY_BYTES"] = fmt.Sprint(b.MaxBodyBytes)
	}
	if b.TimeoutSecs > 0 {
		env["CAPSEM_HTTP_TIMEOUT_SECS"] = fmt.Sprint(b.TimeoutSecs)
	}
	if b.AllowPrivateNetworks {
		env["CAPSEM_HTTP_ALLOW_PRIVATE"] = "1"
	}
	defs := []aggwire.ServerDef{{Name: "builtin", Builtin: true, Enabled: true, Env: env}}
	for _, s := range f.MCP.Servers {
		def := aggwire.ServerDef{Name: s.Name, Command: s.Command, Args: s.Args, Env: s.Env, URL: s.URL, Headers: s.Headers,
			Enabled: s.Enabled == nil || *s.Enabled, ConnectTimeoutMS: int64(s.ConnectTimeoutSecs) * 1000}
		defs = append(defs, def)
	}
	return defs
}

// SandboxPaths returns the union of the servers' read+execute and write grants.
func (f *File) SandboxPaths() (read, write []string) {
	for _, s := range f.MCP.Servers {
		if s.Enabled != nil && !*s.Enabled {
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
