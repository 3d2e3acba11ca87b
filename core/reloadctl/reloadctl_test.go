package reloadctl

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestReloadAll(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	fail := false
	stop, err := Register(ctx, dir, "gateway", "/tmp/gw.sock", func(context.Context) (string, error) {
		calls++
		if fail {
			return "old policy", errors.New("config user.toml: bad value")
		}
		return "new policy", nil
	}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, strconv.Itoa(os.Getpid())+".sock")
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("control socket %v %v", fi, err)
	}
	// A stale socket of a dead process is cleaned up, not reported.
	stale := filepath.Join(dir, "999999999.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()

	res, err := ReloadAll(ctx, dir)
	if err != nil || len(res) != 1 || !res[0].OK || res[0].Detail != "new policy" || res[0].Kind != "gateway" || res[0].PID != os.Getpid() {
		t.Fatalf("reload: %+v %v", res, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale socket left behind: %v", err)
	}
	fail = true
	res, err = ReloadAll(ctx, dir)
	if err != nil || len(res) != 1 || res[0].OK || !strings.Contains(res[0].Error, "bad value") || res[0].Detail != "old policy" {
		t.Fatalf("failed reload: %+v %v", res, err)
	}
	if calls != 2 {
		t.Fatalf("%d reloads, want 2", calls)
	}
	stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket not removed on stop")
	}
	if res, err := ReloadAll(ctx, dir); err != nil || len(res) != 0 {
		t.Errorf("after stop: %+v %v", res, err)
	}
}
