package personalities

import (
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestRewriteArgs(t *testing.T) {
	cases := []struct{ in, want []string }{
		{[]string{"/usr/bin/capsem-mcp-server"}, []string{"/usr/bin/capsem-mcp-server", "mcp-relay"}},
		{[]string{"capsem-mcp-server", "--log-level", "debug"}, []string{"capsem-mcp-server", "mcp-relay", "--log-level", "debug"}},
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

// TestGuestBuildWithoutCgo builds the program the way it runs in the guest
// (/init: no cgo, guest personalities only) and checks that build answers
// to the guest's names and leaves the host's personalities out; the full
// program must build without cgo too.
// Only a flagless agent run as PID 1 skips the CLI parser; a test running
// the agent elsewhere, or with flags, goes through kong as before.
func TestIsBareInit(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		pid  int
		want bool
	}{
		{[]string{"/init", "splash", "foo"}, 1, true},
		{[]string{"/init"}, 1, true},
		{[]string{"/init"}, 42, false},
		{[]string{"capsem", "agent", "--allow-not-pid1"}, 1, false},
		{[]string{"capsem", "version"}, 1, false},
		{[]string{"capsem-mcp-server"}, 1, false},
	} {
		if got := isBareInit(RewriteArgs(tc.argv), tc.pid); got != tc.want {
			t.Errorf("isBareInit(%q, pid %d) = %v, want %v", tc.argv, tc.pid, got, tc.want)
		}
	}
}

func TestGuestBuildWithoutCgo(t *testing.T) {
	dir := t.TempDir()
	guest := filepath.Join(dir, "capsem-guest")
	for _, args := range [][]string{{"-tags", "capsem_guest", "-o", guest}, {"-o", filepath.Join(dir, "capsem-nocgo")}} {
		cmd := exec.Command("go", append(append([]string{"build"}, args...), "..")...)
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("CGO_ENABLED=0 go build %v failed: %v\n%s", args, err, out)
		}
	}
	out, err := exec.Command(guest, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("capsem-guest --help: %v\n%s", err, out)
	}
	for _, want := range []string{"\n  version", "\n  mcp-relay"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the guest build lacks %s:\n%s", want, out)
		}
	}
	for _, hostOnly := range []string{"\n  gateway", "\n  policy", "\n  image", "\n  run"} {
		if strings.Contains(string(out), hostOnly) {
			t.Errorf("the guest build has the host's %q:\n%s", hostOnly, out)
		}
	}
}

// TestPersonalitiesStandAlone: no personality imports another (what two
// share belongs in core/); only this package lists them all.
func TestPersonalitiesStandAlone(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const prefix = "github.com/capsem/capsem/personalities/"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(fields[0], prefix) {
			continue
		}
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, prefix) {
				t.Errorf("%s imports %s", fields[0], imp)
			}
		}
	}
}
