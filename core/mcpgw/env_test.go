package mcpgw

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/endpoint"
)

// TestApplyEnv: the environment's limits replace the configuration's, tool
// by tool for the per-tool deadlines, and a bad value is an error naming
// the variable and leaves the caller to refuse the configuration.
func TestApplyEnv(t *testing.T) {
	base := func() endpoint.Config {
		return endpoint.Config{DefaultTimeout: time.Minute, ToolTimeout: 5 * time.Minute,
			ToolTimeouts: map[string]time.Duration{"a__x": time.Second, "b__y": 2 * time.Second}}
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    func(*endpoint.Config)
		wantErr string
	}{
		{name: "none", want: func(*endpoint.Config) {}},
		{name: "every limit", env: map[string]string{
			"CAPSEM_MCP_DEFAULT_TIMEOUT_SECS":   "7",
			"CAPSEM_MCP_TOOL_CALL_TIMEOUT_SECS": "9",
			"CAPSEM_MCP_INFLIGHT":               "3",
			"CAPSEM_MCP_TOOL_TIMEOUTS":          "b__y=4, c__z=5",
		}, want: func(c *endpoint.Config) {
			c.DefaultTimeout, c.ToolTimeout, c.InFlight = 7*time.Second, 9*time.Second, 3
			c.ToolTimeouts = map[string]time.Duration{"a__x": time.Second, "b__y": 4 * time.Second, "c__z": 5 * time.Second}
		}},
		{name: "bad deadline", env: map[string]string{"CAPSEM_MCP_DEFAULT_TIMEOUT_SECS": "1m"}, wantErr: `CAPSEM_MCP_DEFAULT_TIMEOUT_SECS="1m": want a positive whole number of seconds`},
		{name: "bad in-flight cap", env: map[string]string{"CAPSEM_MCP_INFLIGHT": "0"}, wantErr: `CAPSEM_MCP_INFLIGHT="0": want a positive integer`},
		{name: "bad tool deadline", env: map[string]string{"CAPSEM_MCP_TOOL_TIMEOUTS": "echo=5"}, wantErr: `CAPSEM_MCP_TOOL_TIMEOUTS="echo=5": item "echo=5": want server__tool=positive-seconds`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, want := base(), base()
			err := ApplyEnv(&got, func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("ApplyEnv error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.want(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("ApplyEnv = %+v, want %+v", got, want)
			}
		})
	}
	// No configured per-tool deadlines: the environment's are the map.
	var c endpoint.Config
	if err := ApplyEnv(&c, func(k string) string { return map[string]string{"CAPSEM_MCP_TOOL_TIMEOUTS": "a__b=1"}[k] }); err != nil || c.ToolTimeouts["a__b"] != time.Second {
		t.Errorf("ApplyEnv on no map: %v, %v", c.ToolTimeouts, err)
	}
}
