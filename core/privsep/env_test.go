package privsep

import (
	"maps"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/envvars"
)

func TestBuildEnv(t *testing.T) {
	parent := []string{
		"USER=alice", "LOGNAME=alice", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC",
		"HOME=/home/alice", "PATH=/home/alice/bin:/usr/bin", "TMPDIR=/tmp/alice",
		"SECRET_TOKEN=hunter2", "SSH_AUTH_SOCK=/run/ssh.sock",
		"LD_PRELOAD=/evil.so", "CAPSEM_PRIVSEP_POLICY=stale", "CAPSEM_PARENT_PID=1", "CAPSEM_SANDBOX=forged",
		"CAPSEM_MCP_LOG=debug", "CAPSEM_MCP_TIMEOUT=5s", "NOEQUALS", "=novalue",
	}
	base := map[string]string{
		"USER": "alice", "LOGNAME": "alice", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC",
		"PATH": SafePath, "HOME": "/s", "TMPDIR": "/s",
	}
	with := func(extra map[string]string, drop ...string) map[string]string {
		m := maps.Clone(base)
		maps.Copy(m, extra)
		for _, d := range drop {
			delete(m, d)
		}
		return m
	}
	cases := []struct {
		name    string
		spec    Spec
		want    map[string]string
		wantErr string
	}{
		{
			name: "defaults only",
			spec: Spec{Scratch: "/s"},
			want: base,
		},
		{
			name: "cache dir adds cache variables",
			spec: Spec{Scratch: "/s", CacheDir: "/c"},
			want: with(map[string]string{"XDG_CACHE_HOME": "/c", "npm_config_cache": "/c/npm"}),
		},
		{
			name: "prefix pass-through",
			spec: Spec{Scratch: "/s", PassEnv: []string{"CAPSEM_MCP_*"}},
			want: with(map[string]string{"CAPSEM_MCP_LOG": "debug", "CAPSEM_MCP_TIMEOUT": "5s"}),
		},
		{
			name: "broad pattern skips reserved and loader names",
			spec: Spec{Scratch: "/s", PassEnv: []string{"CAPSEM_*", "L*"}},
			want: with(map[string]string{"CAPSEM_MCP_LOG": "debug", "CAPSEM_MCP_TIMEOUT": "5s"}),
		},
		{
			name: "exact pass-through of an unset name adds nothing",
			spec: Spec{Scratch: "/s", PassEnv: []string{"NOT_SET"}},
			want: base,
		},
		{
			name: "pass-through cannot override fixed values",
			spec: Spec{Scratch: "/s", PassEnv: []string{"HOME", "PATH", "TMPDIR"}},
			want: base,
		},
		{
			name: "configured env wins",
			spec: Spec{Scratch: "/s", Env: map[string]string{"PATH": "/opt/node/bin:/usr/bin", "API_URL": "https://x", "EMPTY": ""}},
			want: with(map[string]string{"PATH": "/opt/node/bin:/usr/bin", "API_URL": "https://x", "EMPTY": ""}),
		},
		{name: "LD_ refused", spec: Spec{Scratch: "/s", Env: map[string]string{"LD_PRELOAD": "/x.so"}}, wantErr: "not allowed"},
		{name: "BASH_ENV refused", spec: Spec{Scratch: "/s", Env: map[string]string{"BASH_ENV": "/x"}}, wantErr: "not allowed"},
		{name: "shell function refused", spec: Spec{Scratch: "/s", Env: map[string]string{"BASH_FUNC_ls%%": "() { :; }"}}, wantErr: "not allowed"},
		{name: "stage marker refused", spec: Spec{Scratch: "/s", Env: map[string]string{"CAPSEM_PRIVSEP_STAGE": "x"}}, wantErr: "reserved"},
		{name: "sandbox marker refused", spec: Spec{Scratch: "/s", Env: map[string]string{envvars.Sandbox.Name(): "landlock"}}, wantErr: "reserved"},
		{name: "parent pid refused", spec: Spec{Scratch: "/s", Env: map[string]string{envvars.ParentPID.Name(): "1"}}, wantErr: "reserved"},
		{name: "empty name", spec: Spec{Scratch: "/s", Env: map[string]string{"": "x"}}, wantErr: "empty"},
		{name: "equals in name", spec: Spec{Scratch: "/s", Env: map[string]string{"A=B": "x"}}, wantErr: "'='"},
		{name: "NUL in value", spec: Spec{Scratch: "/s", Env: map[string]string{"A": "x\x00y"}}, wantErr: "NUL"},
		{name: "long name", spec: Spec{Scratch: "/s", Env: map[string]string{strings.Repeat("A", 300): "x"}}, wantErr: "longer"},
		{name: "long value", spec: Spec{Scratch: "/s", Env: map[string]string{"A": strings.Repeat("x", 40<<10)}}, wantErr: "longer"},
		{name: "star alone", spec: Spec{Scratch: "/s", PassEnv: []string{"*"}}, wantErr: "every variable"},
		{name: "inner star", spec: Spec{Scratch: "/s", PassEnv: []string{"A*B"}}, wantErr: "only allowed at the end"},
		{name: "exact loader name", spec: Spec{Scratch: "/s", PassEnv: []string{"LD_LIBRARY_PATH"}}, wantErr: "not allowed"},
		{name: "exact reserved name", spec: Spec{Scratch: "/s", PassEnv: []string{"CAPSEM_PRIVSEP_POLICY"}}, wantErr: "reserved"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := buildEnv(tc.spec, parent)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("buildEnv error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("buildEnv: %v", err)
			}
			if !maps.Equal(got, tc.want) {
				t.Fatalf("buildEnv =\n %v\nwant\n %v", envList(got), envList(tc.want))
			}
		})
	}
}
