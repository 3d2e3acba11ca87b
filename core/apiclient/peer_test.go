package apiclient

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/testkit"
)

// TestClientsSendNothingToAnotherUser: another local user listens where a
// client looks for its service or a VM's process: first in a shared
// directory (CAPSEM_UDS_PATH in /tmp), then through a socket file of this
// user's, where only the kernel's record of who listens tells. Every
// client refuses, naming the socket and why, starts no service in its
// place, and the listener receives not one byte: not the exec request,
// not the secret in its environment.
func TestClientsSendNothingToAnotherUser(t *testing.T) {
	places := []struct {
		name    string
		listen  func(t *testing.T) (string, *testkit.ForeignListener)
		refusal string
	}{
		{"a shared directory, where the other user bound first", func(t *testing.T) (string, *testkit.ForeignListener) {
			dir := testDir(t)
			if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "service.sock")
			return path, testkit.ListenAsNobody(t, path)
		}, "other users can create and replace files in it (mode 1777)"},
		{"a socket of this user's on which the other user listens", func(t *testing.T) (string, *testkit.ForeignListener) {
			path := filepath.Join(testDir(t), "service.sock")
			l := testkit.MoveInAsNobody(t, path)
			if err := os.Lchown(path, os.Geteuid(), os.Getegid()); err != nil {
				t.Fatal(err)
			}
			return path, l
		}, "runs as uid 65534, not as you"},
	}
	const secret = "API_KEY=sk-must-not-leave"
	calls := []struct {
		name string
		call func(ctx context.Context, path string, started *bool) error
	}{
		{"service exec", func(ctx context.Context, path string, started *bool) error {
			start := func(context.Context) error { *started = true; return nil }
			_, err := NewServiceClient(path, start).Exec(ctx, "dev", api.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"API_KEY": secret}})
			return err
		}},
		{"service exec stream", func(ctx context.Context, path string, _ *bool) error {
			_, err := NewServiceClient(path, nil).ExecStream(ctx, "dev", api.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"API_KEY": secret}}, io.Discard, io.Discard)
			return err
		}},
		{"process exec", func(ctx context.Context, path string, _ *bool) error {
			_, err := NewProcessClient(path).Exec(ctx, &api.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"API_KEY": secret}}, io.Discard, io.Discard)
			return err
		}},
		{"process write file", func(ctx context.Context, path string, _ *bool) error {
			return NewProcessClient(path).WriteFile(ctx, "/root/.env", []byte(secret), 0o600)
		}},
		{"terminal", func(ctx context.Context, path string, _ *bool) error {
			c, err := DialTerminal(ctx, path, api.VMPath(api.RouteVMTerminal, "dev"), api.TermRequest{Env: map[string]string{"API_KEY": secret}})
			if err == nil {
				c.Close()
			}
			return err
		}},
	}
	for _, p := range places {
		t.Run(p.name, func(t *testing.T) {
			path, l := p.listen(t)
			for _, c := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				started := false
				err := c.call(ctx, path, &started)
				cancel()
				if err == nil || !strings.Contains(err.Error(), "refusing to connect to "+path+": ") || !strings.Contains(err.Error(), p.refusal) {
					t.Errorf("%s: %v, want a refusal naming %s and %q", c.name, err, path, p.refusal)
				}
				if started {
					t.Errorf("%s: a service was started in the other user's place", c.name)
				}
			}
			if _, bytes := l.Stop(); bytes != 0 {
				t.Errorf("the other user's listener received %d bytes", bytes)
			}
		})
	}
}

// testDir is a fresh directory of this user's at a short path (a Unix
// socket's path is bounded) that other uids may enter.
func testDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cst-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
