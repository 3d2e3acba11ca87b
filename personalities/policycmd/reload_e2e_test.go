package policycmd_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/testkit"
)

// TestReloadReachesTheServiceVMs: a VM of the service, under its own
// configuration, is reloaded by name (from the service's record) and its
// gateway then applies the edited file; a running VM whose process does
// not answer the reload is reported as failed, with exit status 1, not
// left out.
func TestReloadReachesTheServiceVMs(t *testing.T) {
	env, runDir := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	capsem := func(args ...string) (string, int) {
		cmd := exec.Command(testkit.CapsemBinary(t), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		} else if err != nil {
			t.Fatalf("capsem %v: %v", args, err)
		}
		return string(out), 0
	}
	cfg := filepath.Join(t.TempDir(), "vm.toml")
	if err := os.WriteFile(cfg, []byte("[mcp]\ndefault = \"allow\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := capsem("create", "dev", "--config", cfg, "--no-autodetect", "--json"); code != 0 {
		t.Fatalf("create: %d %s", code, out)
	}
	out, _ := capsem("info", "dev", "--json")
	var vm struct {
		ID     string `json:"id"`
		PID    int    `json:"pid"`
		Config string `json:"config"`
	}
	if err := json.Unmarshal([]byte(out), &vm); err != nil || vm.PID == 0 || vm.Config != cfg {
		t.Fatalf("info: %v %s", err, out)
	}
	call := `printf '%s\n' ` +
		`'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"guest","version":"1"}}}' ` +
		`'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"builtin__http_head","arguments":{"url":"http://127.0.0.1:9/"}}}' ` +
		`| capsem-mcp-server`
	if out, code := capsem("exec", "dev", "--", "sh", "-c", call); code != 0 || !strings.Contains(out, `"id":3,"result"`) {
		t.Fatalf("before the reload: %d %s", code, out)
	}

	os.WriteFile(cfg, []byte("[mcp.tools]\n\"builtin__http_head\" = \"block\"\n"), 0o600)
	out, code := capsem("policy", "reload")
	if code != 0 || !strings.Contains(out, "reloaded vm dev ("+vm.ID+") (pid "+strconv.Itoa(vm.PID)+")") {
		t.Fatalf("policy reload: %d %s", code, out)
	}
	if out, _ := capsem("exec", "dev", "--", "sh", "-c", call); !strings.Contains(out, `"id":3,"error":{"code":-32600`) || !strings.Contains(out, "tools.builtin__http_head") {
		t.Fatalf("after the reload, the VM's own configuration is not in force: %s", out)
	}

	// A process that cannot be reached for reload: its endpoint is gone.
	if err := os.Remove(filepath.Join(runDir, "endpoints", strconv.Itoa(vm.PID)+".sock")); err != nil {
		t.Fatal(err)
	}
	out, code = capsem("policy", "reload")
	if code != 1 || !strings.Contains(out, "FAILED   vm dev ("+vm.ID+")") || !strings.Contains(out, "keeps the policy it had") {
		t.Fatalf("a running VM that did not answer: exit %d\n%s", code, out)
	}
}
