package personalities

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
)

func TestRewriteArgs(t *testing.T) {
	cases := []struct{ in, want []string }{
		{[]string{"/usr/bin/capsem-mcp-server"}, []string{"/usr/bin/capsem-mcp-server", "mcp-server"}},
		{[]string{"capsem-mcp-server", "--log-level", "debug"}, []string{"capsem-mcp-server", "mcp-server", "--log-level", "debug"}},
		{[]string{"capsem", "version"}, []string{"capsem", "version"}},
		{nil, []string{"capsem"}},
		{[]string{"/init", "splash", "foo"}, []string{"/init", "agent"}},
	}
	for _, tc := range cases {
		if got := RewriteArgs(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("RewriteArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestGuestBuildWithoutCgo builds the whole program the way it runs in the
// guest (/init): without cgo.
func TestGuestBuildWithoutCgo(t *testing.T) {
	cmd := exec.Command("go", "build", "-o", filepath.Join(t.TempDir(), "capsem-guest"), "..")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 build of capsem failed: %v\n%s", err, out)
	}
}
