package config

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseMCPServers reads another tool's settings file: whatever it holds,
// every server kept has a valid, unique name, exactly one transport, an
// http(s) URL if remote, and is not capsem itself; nothing panics.
func FuzzParseMCPServers(f *testing.F) {
	f.Add([]byte(`{"mcpServers":{"gh":{"command":"npx","args":["-y","x"]},"web":{"url":"https://e.test/mcp","headers":{"A":"b"}}}}`))
	f.Add([]byte(`{"mcpServers":{"capsem":{"command":"capsem","args":["mcp"]},"a__b":{"command":"x"},"s":{"type":"sse","url":"http://x"}}}`))
	f.Add([]byte(`{"mcpServers":{"both":{"command":"x","url":"http://y"},"none":{},"bad":"str"}}`))
	f.Add([]byte(`{"mcpServers":[]}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		seen := map[string]string{"taken": "/other.json"}
		servers, _ := parseMCPServers("/home/u/.claude.json", data, seen)
		names := map[string]bool{}
		for _, s := range servers {
			if err := ValidateServerName(s.Name); err != nil {
				t.Fatalf("kept server with an invalid name %q: %v", s.Name, err)
			}
			if names[s.Name] || s.Name == "taken" {
				t.Fatalf("server %q kept twice", s.Name)
			}
			names[s.Name] = true
			if (s.Command == "") == (s.URL == "") {
				t.Fatalf("server %q has command %q and url %q", s.Name, s.Command, s.URL)
			}
			if s.URL != "" && !strings.HasPrefix(s.URL, "http://") && !strings.HasPrefix(s.URL, "https://") {
				t.Fatalf("server %q kept with url %q", s.Name, s.URL)
			}
			if s.Name == "capsem" || filepath.Base(s.Command) == "capsem" || filepath.Base(s.Command) == "capsem-mcp-server" {
				t.Fatalf("capsem's own entry kept: %+v", s)
			}
			if seen[s.Name] != "/home/u/.claude.json" {
				t.Fatalf("server %q not recorded as seen", s.Name)
			}
		}
	})
}
