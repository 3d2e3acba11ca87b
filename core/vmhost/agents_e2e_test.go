package vmhost_test

import (
	"strings"
	"testing"

	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/core/vmhost"
)

// TestFullRootHasTheUserland: a VM of the full root runs Debian's
// userland, Node, Python, git and the AI CLIs at their pinned versions,
// with the identity capsem gives it.
func TestFullRootHasTheUserland(t *testing.T) {
	root := testkit.SharedRootImage(t)
	v := startVM(t, "fullroot", func(c *vmhost.ProcessConfig) { c.RootImage = root.Image; c.NoNetwork = true })
	defer v.stop(t)
	out, _ := v.guestSh(t, `set -e
echo "shell=$SHELL home=$HOME path=$PATH"
bash --version | head -1
node -e 'console.log("node", process.version)'
npm --version
python3 -c 'import sys, venv; print("python", sys.version.split()[0])'
git --version
curl --version | head -1
rg --version | head -1
claude --version
gemini --version
codex --version
hostname
cat /etc/machine-id
readlink /usr/bin/capsem-mcp-server
`)
	t.Logf("guest:\n%s", out)
	for _, want := range []string{"shell=/bin/bash home=/root", "GNU bash", "node v22.23.5", "python 3.11", "git version 2.39", "curl 7.88",
		"ripgrep", "2.1.332 (Claude Code)", "0.61.0", "codex-cli 0.171.0", "fullroot", "/run/capsem/initramfs/init"} {
		if !strings.Contains(out, want) {
			t.Errorf("the full root lacks %q", want)
		}
	}
}
