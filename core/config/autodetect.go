package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"github.com/capsem/capsem/core/privsep"
)

// Detected is the servers found in one AI CLI settings file.
type Detected struct {
	Path    string
	Servers []Server
}

// AutoDetect reads the `mcpServers` of Claude Code (~/.claude.json,
// ~/.claude/settings.json) and Gemini CLI (~/.gemini/settings.json). It never
// fails: these files belong to other tools, so a problem with one is a note,
// not an error. Entries that point at capsem itself are skipped (capsem must
// not aggregate itself), and so are names capsem cannot namespace.
func AutoDetect(home string) ([]Detected, []string) {
	var out []Detected
	var notes []string
	seen := map[string]string{}
	for _, rel := range []string{".claude.json", ".claude/settings.json", ".gemini/settings.json"} {
		path := filepath.Join(home, rel)
		data, err := readBounded(path, MaxSettingsBytes)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				notes = append(notes, fmt.Sprintf("auto-detect: %s: %v", path, err))
			}
			continue
		}
		servers, fileNotes := parseMCPServers(path, data, seen)
		notes = append(notes, fileNotes...)
		if len(servers) > 0 {
			out = append(out, Detected{Path: path, Servers: servers})
		}
	}
	return out, notes
}

// mcpServerEntry is the ecosystem's mcpServers entry shape.
type mcpServerEntry struct {
	Type    string            `json:"type"`
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
}

func parseMCPServers(path string, data []byte, seen map[string]string) ([]Server, []string) {
	var doc struct {
		MCPServers map[string]json.RawMessage `json:"mcpServers"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, []string{fmt.Sprintf("auto-detect: %s: not valid JSON settings: %v", path, err)}
	}
	var servers []Server
	var notes []string
	skip := func(name, why string) {
		notes = append(notes, fmt.Sprintf("auto-detect: %s: server %q skipped: %s", path, name, why))
	}
	for _, name := range slices.Sorted(maps.Keys(doc.MCPServers)) {
		var e mcpServerEntry
		if err := json.Unmarshal(doc.MCPServers[name], &e); err != nil {
			skip(name, "entry is not a server object: "+err.Error())
			continue
		}
		if prev, ok := seen[name]; ok {
			skip(name, "already detected in "+prev)
			continue
		}
		if err := ValidateServerName(name); err != nil {
			skip(name, err.Error())
			continue
		}
		if pointsAtCapsem(name, e) {
			skip(name, "it is capsem itself")
			continue
		}
		if bad := badEnv(e.Env); bad != nil {
			skip(name, "env: "+bad.Error())
			continue
		}
		s := Server{Name: name}
		switch {
		case e.Command != "" && e.URL == "":
			s.Command, s.Args, s.Env = e.Command, e.Args, e.Env
		case e.URL != "" && e.Command == "":
			if e.Type == "sse" {
				skip(name, "SSE transport is not supported (streamable HTTP is)")
				continue
			}
			if !strings.HasPrefix(e.URL, "http://") && !strings.HasPrefix(e.URL, "https://") {
				skip(name, fmt.Sprintf("url %q is not http(s)", e.URL))
				continue
			}
			s.URL, s.Headers = e.URL, e.Headers
		default:
			skip(name, "needs exactly one of command and url")
			continue
		}
		seen[name] = path
		servers = append(servers, s)
	}
	return servers, notes
}

// pointsAtCapsem recognises capsem's own registration (`capsem mcp`, the
// relay, or an entry named capsem).
func pointsAtCapsem(name string, e mcpServerEntry) bool {
	if name == "capsem" {
		return true
	}
	base := filepath.Base(e.Command)
	return base == "capsem" || base == "capsem-mcp-server"
}

// Registrations lists where capsem itself is registered as an MCP server in
// the AI CLI settings AutoDetect reads, as "<file>: <name> (<command args>)".
func Registrations(home string) []string {
	var out []string
	for _, rel := range []string{".claude.json", ".claude/settings.json", ".gemini/settings.json"} {
		path := filepath.Join(home, rel)
		data, err := readBounded(path, MaxSettingsBytes)
		if err != nil {
			continue
		}
		var doc struct {
			MCPServers map[string]mcpServerEntry `json:"mcpServers"`
		}
		if json.Unmarshal(data, &doc) != nil {
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(doc.MCPServers)) {
			if e := doc.MCPServers[name]; pointsAtCapsem(name, e) {
				out = append(out, fmt.Sprintf("%s: %s (%s)", path, name, strings.TrimSpace(e.Command+" "+strings.Join(e.Args, " "))))
			}
		}
	}
	return out
}

// badEnv is the first variable of env a sandboxed server may not be given.
func badEnv(env map[string]string) error {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if err := privsep.CheckEnv(k, env[k]); err != nil {
			return err
		}
	}
	return nil
}
