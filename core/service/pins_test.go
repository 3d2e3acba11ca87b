package service

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmrecord"
)

// TestRootImagesArePinned: the root images of the VMs a service knows are
// pinned in the store from its start, and unpinned once their VMs go; pins
// of VMs removed while no service ran go at the next start.
func TestRootImagesArePinned(t *testing.T) {
	home := t.TempDir()
	t.Setenv("CAPSEM_HOME", home)
	t.Setenv("CAPSEM_RUN_DIR", t.TempDir())
	assets, err := paths.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	entry := strings.Repeat("ab", 12)
	root := filepath.Join(assets, "store", entry, "root.erofs")
	regDir, _ := paths.RegistryDir()
	reg := vmrecord.Registry{Dir: regDir}
	os.MkdirAll(regDir, 0o700)
	rec := &vmrecord.Record{VM: api.VM{ID: "vm-0000000000aa", Name: "keeper", State: api.StateStopped, Persistent: true,
		CreatedAt: time.Unix(1, 0).UTC(), SessionDir: filepath.Join(home, "sessions", "keeper"), VMConfig: api.VMConfig{Base: api.BaseFull}},
		RootImage: root, Socket: "/s"}
	if err := reg.Save(rec); err != nil {
		t.Fatal(err)
	}
	pins := filepath.Join(assets, "pins", pinHolder)
	start := func() *Service {
		s, err := New(context.Background(), Options{Executable: "/nonexistent/capsem", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := start()
	if b, err := os.ReadFile(pins); err != nil || string(b) != entry+"\n" {
		t.Fatalf("pins at start: %q %v; want the stopped VM's root entry", b, err)
	}
	if err := s.Delete(context.Background(), "keeper"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Fatalf("the deleted VM's root is still pinned: %v", err)
	}
	// A stale pin (its VM removed while no service ran) goes at start.
	os.MkdirAll(filepath.Dir(pins), 0o755)
	os.WriteFile(pins, []byte(entry+"\n"), 0o644)
	start()
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		t.Fatalf("a stale pin stayed after a start: %v", err)
	}
}
