package personalities

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// guestPackages run inside the VM: they must build without cgo and must not
// link SQLite, the ledger, the service or the macOS hypervisor.
var guestPackages = []string{
	"github.com/capsem/capsem/personalities/agent",
	"github.com/capsem/capsem/personalities/relay",
	"github.com/capsem/capsem/personalities/guestdoctor",
	"github.com/capsem/capsem/core/doctor",
	"github.com/capsem/capsem/core/mountinfo",
	"github.com/capsem/capsem/core/guestchan",
	"github.com/capsem/capsem/core/guestwire",
	"github.com/capsem/capsem/core/guestctl",
}

// TestGuestProgramLinksNoHostCode: the guest build (tag capsem_guest) links
// none of the host's machinery: no SQLite or ledger, no VM engine or image
// builder, no MCP SDK server or HTTP stack.
func TestGuestProgramLinksNoHostCode(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-tags", "capsem_guest", "..")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{"github.com/mattn/go-sqlite3", "database/sql", "net/http", "github.com/capsem/capsem/core/ledger",
		"github.com/capsem/capsem/vmm", "github.com/capsem/capsem/guestfs", "github.com/capsem/capsem/core/api",
		"github.com/modelcontextprotocol/go-sdk/mcp", "github.com/capsem/capsem/personalities/process"}
	deps := strings.Split(string(out), "\n")
	for _, f := range forbidden {
		if slices.Contains(deps, f) {
			t.Errorf("the guest program links %s", f)
		}
	}
	if !slices.Contains(deps, "github.com/capsem/capsem/personalities/agent") {
		t.Fatal("the guest program lacks the agent")
	}
}

func TestGuestPackagesAreCGOFree(t *testing.T) {
	forbidden := []string{"github.com/mattn/go-sqlite3", "github.com/capsem/capsem/core/ledger", "github.com/Code-Hex/vz", "database/sql"}
	for _, pkg := range guestPackages {
		cmd := exec.Command("go", "list", "-deps", pkg)
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Split(string(out), "\n") {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
