package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/core/unixsock"
	"github.com/capsem/capsem/core/vmrecord"
)

// newTestService is a service over a fresh run directory, with no VMs.
func newTestService(t testing.TB) *Service {
	t.Helper()
	run := t.TempDir()
	t.Setenv("CAPSEM_RUN_DIR", run)
	t.Setenv("CAPSEM_HOME", t.TempDir())
	s, err := New(context.Background(), Options{Executable: "/nonexistent/capsem", Logger: slog.New(slog.DiscardHandler),
		RootImage: func(context.Context, string, func(string)) (string, error) { return "/nonexistent/root.erofs", nil }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRootImageThatCannotBeMade: a create whose base cannot be had is a
// 503 that says why, after the progress the image's build reported, and
// leaves nothing behind; the minimal base needs no image.
func TestRootImageThatCannotBeMade(t *testing.T) {
	s := newTestService(t)
	var asked []string
	s.o.RootImage = func(_ context.Context, base string, progress func(string)) (string, error) {
		asked = append(asked, base)
		progress("debian: 3 s")
		return "", errors.New("mmdebstrap: exit status 1")
	}
	var stages []string
	_, err := s.CreateStream(context.Background(), api.CreateRequest{Name: "nobase", VMConfig: api.VMConfig{RAMMB: 256}}, func(st string) { stages = append(stages, st) })
	if StatusOf(err) != 503 || !strings.Contains(fmt.Sprint(err), `base "full": mmdebstrap: exit status 1`) {
		t.Fatalf("err %v (%d)", err, StatusOf(err))
	}
	if !slices.Equal(asked, []string{api.BaseFull}) || !slices.Equal(stages, []string{api.StageRootImage + "debian: 3 s"}) {
		t.Errorf("asked %v, stages %v", asked, stages)
	}
	if vms := s.List(); len(vms) != 0 {
		t.Errorf("left %+v", vms)
	}
	asked = nil
	_, err = s.Create(context.Background(), api.CreateRequest{Name: "nobase", VMConfig: api.VMConfig{RAMMB: 256, Base: api.BaseMinimal}})
	if len(asked) != 0 || !strings.Contains(fmt.Sprint(err), "/nonexistent/capsem") {
		t.Errorf("minimal base: asked %v, err %v", asked, err)
	}
}

func do(t testing.TB, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

// TestHostileRequests sends what a confused or hostile client would: each
// gets a clear error with a meaningful status, and nothing is left behind.
func TestHostileRequests(t *testing.T) {
	s := newTestService(t)
	h := s.Handler(nil)
	badConfig := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(badConfig, []byte("[mcp]\ndefault = \"perhaps\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"malformed JSON", "POST", api.RouteVMs, `{"name":`, 400, "invalid request body"},
		{"unknown field", "POST", api.RouteVMs, `{"name":"a","ram":1}`, 400, `unknown field "ram"`},
		{"trailing data", "POST", api.RouteVMs, `{"name":"a"} {"name":"b"}`, 400, "trailing data"},
		{"wrong type", "POST", api.RouteVMs, `{"ram_mb":"lots"}`, 400, "invalid request body"},
		{"huge body", "POST", api.RouteVMs, `{"name":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "request body over"},
		{"path in a name", "POST", api.RouteVMs, `{"name":"../../etc"}`, 400, "use lower-case letters"},
		{"upper case", "POST", api.RouteVMs, `{"name":"Dev"}`, 400, "use lower-case letters"},
		{"leading dash", "POST", api.RouteVMs, `{"name":"-x"}`, 400, "use lower-case letters"},
		{"long name", "POST", api.RouteVMs, `{"name":"` + strings.Repeat("a", 64) + `"}`, 400, "more than 63"},
		{"a name like an id", "POST", api.RouteVMs, `{"name":"vm-0123456789ab"}`, 400, "form of a VM id"},
		{"NUL in a name", "POST", api.RouteVMs, `{"name":"a\u0000b"}`, 400, "use lower-case letters"},
		{"too many CPUs", "POST", api.RouteVMs, `{"cpus":1000}`, 400, "cpus 1000"},
		{"too little memory", "POST", api.RouteVMs, `{"ram_mb":16}`, 400, "ram_mb 16 (guest memory in MB): want 128 to 65536"},
		{"negative workspace bound", "POST", api.RouteVMs, `{"workspace_mib":-1}`, 400, "workspace_mib -1 (workspace bound in MiB): want 1 to"},
		{"workspace bound past 1 PiB", "POST", api.RouteVMs, `{"workspace_mib":1073741825}`, 400, "workspace_mib 1073741825 (workspace bound in MiB): want 1 to"},
		{"negative disk", "POST", api.RouteVMs, `{"disk_gb":-1}`, 400, "disk_gb -1 (disk size in GB): want 0 (no disk) to 4096"},
		{"path in an image name", "POST", api.RouteVMs, `{"image":"../../root"}`, 400, `image name "../../root": use lower-case letters`},
		{"unknown image", "POST", api.RouteVMs, `{"image":"no-such"}`, 404, `no image named "no-such"`},
		{"fork to a path", "POST", api.VMPath(api.RouteVMFork, "x"), `{"name":"../x"}`, 400, `image name "../x"`},
		{"fork with a long description", "POST", api.VMPath(api.RouteVMFork, "x"), `{"name":"ok","description":"` + strings.Repeat("d", api.MaxDescription+1) + `"}`, 400, "description"},
		{"image route with a path", "GET", "/v1/images/..%2F..%2Fetc", "", 400, `image name "../../etc"`},
		{"resume with unknown field", "POST", api.VMPath(api.RouteVMResume, "x"), `{"bogus":true}`, 400, "unknown field"},
		{"loader variable", "POST", api.RouteVMs, `{"env":{"LD_PRELOAD":"/x"}}`, 400, "LD_PRELOAD"},
		{"unknown base", "POST", api.RouteVMs, `{"base":"ubuntu"}`, 400, `base "ubuntu": want "full"`},
		{"full base without a disk", "POST", api.RouteVMs, `{"disk_gb":0}`, 400, `base "full" needs a disk`},
		{"the root as workspace", "POST", api.RouteVMs, `{"workspace":"/"}`, 400, "the whole host"},
		{"a relative workspace", "POST", api.RouteVMs, `{"workspace":"src"}`, 400, "want an absolute path"},
		{"a missing workspace", "POST", api.RouteVMs, `{"workspace":"/nonexistent/src"}`, 400, "no such file"},
		{"unknown VM", "GET", api.VMPath(api.RouteVM, "ghost"), "", 404, `no VM named "ghost"`},
		{"traversal as a VM", "GET", "/v1/vms/..%2f..%2fetc/logs", "", 404, "no VM named"},
		{"exec on an unknown VM", "POST", api.VMPath(api.RouteVMExec, "ghost"), `{"command":"true"}`, 404, "no VM named"},
		{"exec with both forms", "POST", api.VMPath(api.RouteVMExec, "ghost"), `{"command":"true","argv":["true"]}`, 400, "exactly one of command and argv"},
		{"negative timeout", "POST", api.VMPath(api.RouteVMExec, "ghost"), `{"command":"true","timeout_ms":-5}`, 400, "must not be negative"},
		{"run without a command", "POST", api.RouteRun, `{"exec":{}}`, 400, "exactly one of command and argv"},
		{"run stream without a command", "POST", api.RouteRunLive, `{"exec":{"argv":[]}}`, 400, "exactly one of command and argv"},
		{"run stream with a bad name", "POST", api.RouteRunLive, `{"name":"../x","exec":{"command":"true"}}`, 400, "use lower-case letters"},
		{"create stream with a bad name", "POST", api.RouteVMsLive, `{"name":"../x"}`, 400, "use lower-case letters"},
		{"create stream with an unknown field", "POST", api.RouteVMsLive, `{"ram":1}`, 400, `unknown field "ram"`},
		{"relative config", "POST", api.RouteVMs, `{"config":"policy.toml","no_autodetect":true}`, 400, "want an absolute path"},
		{"missing config", "POST", api.RouteVMs, `{"config":"/nonexistent/p.toml","no_autodetect":true}`, 400, "config /nonexistent/p.toml"},
		{"config that is a kernel interface", "POST", api.RouteVMs, `{"config":"/proc/kmsg","no_autodetect":true}`, 400, "a kernel interface"},
		{"config that is a directory", "POST", api.RouteVMs, `{"config":"/","no_autodetect":true}`, 400, "not a regular file"},
		{"config that does not parse", "POST", api.RouteVMs, `{"config":"` + badConfig + `","no_autodetect":true}`, 400, `"perhaps" is not a decision`},
		{"run stream with a bad config", "POST", api.RouteRunLive, `{"config":"` + badConfig + `","exec":{"command":"true"}}`, 400, `"perhaps" is not a decision`},
		{"read without a path", "POST", api.VMPath(api.RouteVMReadFile, "ghost"), `{}`, 400, "path is required"},
		{"bad encoding", "POST", api.VMPath(api.RouteVMWriteFile, "ghost"), `{"path":"/x","content":"y","encoding":"rot13"}`, 400, `encoding "rot13"`},
		{"bad base64", "POST", api.VMPath(api.RouteVMWriteFile, "ghost"), `{"path":"/x","content":"%%%","encoding":"base64"}`, 400, "not base64"},
		{"setuid mode", "POST", api.VMPath(api.RouteVMWriteFile, "ghost"), `{"path":"/x","content":"y","mode":2541}`, 400, "permission bits"},
		{"bad tail", "GET", api.VMPath(api.RouteVMLogs, "ghost") + "?tail=-3", "", 400, "tail="},
		{"inspect too many rows", "POST", api.VMPath(api.RouteVMInspect, "ghost"), `{"sql":"SELECT 1","max_rows":99999}`, 400, "max_rows 99999"},
		{"persist a bad name", "POST", api.VMPath(api.RouteVMPersist, "ghost"), `{"name":"A/B"}`, 400, "use lower-case letters"},
		{"host port 0", "POST", api.RouteVMs, `{"ports":[{"host":0,"guest":80}]}`, 400, "port 0:80: host port 0: want 1 to 65535"},
		{"guest port past 65535", "POST", api.RouteVMs, `{"ports":[{"host":8080,"guest":65536}]}`, 400, "port 8080:65536: guest port 65536"},
		{"port address a name", "POST", api.RouteVMs, `{"ports":[{"address":"localhost","host":8080,"guest":80}]}`, 400, `address "localhost": want an IP address`},
		{"a host port twice", "POST", api.RouteVMs, `{"ports":[{"host":8080,"guest":80},{"address":"127.0.0.1","host":8080,"guest":81}]}`, 400, "host port 127.0.0.1:8080 is published twice"},
		{"too many ports", "POST", api.RouteVMs, `{"ports":[` + strings.Repeat(`{"host":1,"guest":1},`, api.MaxPorts) + `{"host":1,"guest":1}]}`, 400, "more than 64"},
		{"run with a bad port", "POST", api.RouteRunLive, `{"ports":[{"host":-1,"guest":1}],"exec":{"command":"true"}}`, 400, "host port -1"},
		{"port-forward on an unknown VM", "POST", api.VMPath(api.RouteVMPorts, "ghost"), `{"host":8080,"guest":80}`, 404, "no VM named"},
		{"port-forward of a bad port", "POST", api.VMPath(api.RouteVMPorts, "ghost"), `{"host":8080,"guest":0}`, 400, "guest port 0"},
		{"port-forward with an unknown field", "POST", api.VMPath(api.RouteVMPorts, "ghost"), `{"host":8080,"guest":80,"proto":"udp"}`, 400, `unknown field "proto"`},
		{"method not allowed", "PUT", api.RouteVMs, ``, 405, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := do(t, h, tc.method, tc.path, tc.body)
			msg := body
			if status != 405 {
				var e api.Error
				if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
					t.Fatalf("the refusal is not {\"error\": ...}: %s", body)
				}
				msg = e.Error
			}
			if status != tc.status || !strings.Contains(msg, tc.want) {
				t.Fatalf("%d %s, want %d containing %q", status, msg, tc.status, tc.want)
			}
		})
	}
	if vms := s.List(); len(vms) != 0 {
		t.Fatalf("refused requests left VMs: %+v", vms)
	}
	sessions, _ := os.ReadDir(s.sessions)
	records, _ := os.ReadDir(s.reg.Dir)
	if len(sessions) != 0 || len(records) != 0 {
		t.Fatalf("refused requests left %d session dirs and %d records", len(sessions), len(records))
	}
}

// TestFailedCreateLeavesNothing: a create whose process cannot start (here
// the capsem executable is missing) is refused and leaves no record, no
// session directory and no name taken.
func TestFailedCreateLeavesNothing(t *testing.T) {
	s := newTestService(t)
	h := s.Handler(nil)
	for range 2 { // the name is free again after the failure
		status, body := do(t, h, "POST", api.RouteVMs, `{"name":"doomed","ram_mb":256}`)
		if status != 500 || !strings.Contains(body, "/nonexistent/capsem") {
			t.Fatalf("%d %s", status, body)
		}
	}
	sessions, _ := os.ReadDir(s.sessions)
	records, _ := os.ReadDir(s.reg.Dir)
	if len(s.List()) != 0 || len(sessions) != 0 || len(records) != 0 {
		t.Fatalf("a failed create left %d VMs, %d sessions, %d records", len(s.List()), len(sessions), len(records))
	}
}

// TestTakenPortRefused: a create or resume publishing a host port that is
// taken is refused before any VM starts, naming the port; the create
// leaves nothing, the stopped VM stays stopped.
func TestTakenPortRefused(t *testing.T) {
	s := newTestService(t)
	h := s.Handler(nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	want := fmt.Sprintf("host port 127.0.0.1:%d is taken", port)
	status, body := do(t, h, "POST", api.RouteVMs, fmt.Sprintf(`{"name":"web","ports":[{"host":%d,"guest":80}]}`, port))
	if status != http.StatusConflict || !strings.Contains(body, want) {
		t.Fatalf("%d %s, want 409 saying %q", status, body, want)
	}
	sessions, _ := os.ReadDir(s.sessions)
	records, _ := os.ReadDir(s.reg.Dir)
	if len(s.List()) != 0 || len(sessions) != 0 || len(records) != 0 {
		t.Fatalf("a refused create left %d VMs, %d sessions, %d records", len(s.List()), len(sessions), len(records))
	}
	addVM(t, s, vmrecord.Record{VM: api.VM{ID: "vm-0000000000b1", Name: "kept", Persistent: true, State: api.StateStopped,
		VMConfig: api.VMConfig{RAMMB: 256, CPUs: 1, NoAutodetect: true, Ports: []api.PortMapping{{Address: "127.0.0.1", Host: port, Guest: 80}}}}})
	if _, err := s.Resume(context.Background(), "kept", api.ResumeRequest{}); StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), want) {
		t.Fatalf("resume with its port taken: %v, want 409 saying %q", err, want)
	}
	if v, _ := s.Info(context.Background(), "kept"); v.State != api.StateStopped {
		t.Fatalf("the VM is %s after a refused resume, want stopped", v.State)
	}
}

func TestMemoryAdmission(t *testing.T) {
	s := newTestService(t)
	old := memAvailable
	t.Cleanup(func() { memAvailable = old })
	memAvailable = func() (int, error) { return 2000, nil }
	if err := s.checkMemory(1024); err != nil {
		t.Fatalf("1024 MB of 2000 refused: %v", err)
	}
	err := s.checkMemory(1800)
	if err == nil || StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "not enough free memory") {
		t.Fatalf("1800+256 MB of 2000: %v", err)
	}
	// RAM promised to a VM that is booting counts.
	s.vms["vm-000000000001"] = &vm{rec: &vmrecord.Record{VM: api.VM{ID: "vm-000000000001", State: api.StateBooting, VMConfig: api.VMConfig{RAMMB: 1024}}}}
	if err := s.checkMemory(1024); err == nil || !strings.Contains(err.Error(), "promised to VMs that are booting") {
		t.Fatalf("with a VM booting: %v", err)
	}
}

// FuzzRequestBodies: whatever a client sends as a body, the service answers
// with a refusal or a result, never a panic or a 5xx (no VM can start
// here: the executable is missing, so a create that passes every check
// fails with a 500 that names it, which is allowed).
func FuzzRequestBodies(f *testing.F) {
	for _, s := range []string{`{}`, `{"name":"a"}`, `{"exec":{"command":"x"}}`, `{"path":"/x","content":"","encoding":"base64"}`,
		`{"sql":"SELECT 1"}`, `[]`, `null`, `{"env":{"":"x"}}`, "\xff", `{"name":"a","name":"b"}`} {
		f.Add(s)
	}
	s := newTestService(f)
	h := s.Handler(nil)
	routes := []string{api.RouteVMs, api.RouteVMsLive, api.RouteRun, api.RouteRunLive, api.RoutePurge, api.VMPath(api.RouteVMExec, "x"), api.VMPath(api.RouteVMWriteFile, "x"),
		api.VMPath(api.RouteVMReadFile, "x"), api.VMPath(api.RouteVMInspect, "x"), api.VMPath(api.RouteVMPersist, "x")}
	f.Fuzz(func(t *testing.T, body string) {
		for _, route := range routes {
			status, out := do(t, h, "POST", route, body)
			if status >= 500 && !strings.Contains(out, "/nonexistent/capsem") {
				t.Fatalf("%s %q: %d %s", route, body, status, out)
			}
		}
	})
}

// TestServiceLock: the run directory becomes the owner's alone, and while
// one service holds the lock and serves, a second is told so at once.
func TestServiceLock(t *testing.T) {
	run := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CAPSEM_RUN_DIR", run)
	if _, err := SecureRunDir(); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(run); st.Mode().Perm() != 0o700 {
		t.Errorf("run directory mode %v, want 0700: it is this user's, only readable by others", st.Mode().Perm())
	}
	sock := filepath.Join(run, "service.sock")
	unlock, err := lockService(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ln, err := unixsock.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := lockService(context.Background(), sock); !errors.Is(err, ErrAlreadyServing) {
		t.Fatalf("a second service: %v, want ErrAlreadyServing", err)
	}
}

// TestServeRefusesASharedRunDir: pointed at a run directory that is shared
// (sticky and world-writable, as /tmp is, though this user owns it) or that
// is another user's, the service refuses to start, naming the directory
// and why, and leaves it as it is: no chmod, nothing created in it.
func TestServeRefusesASharedRunDir(t *testing.T) {
	tests := []struct {
		name    string
		mode    os.FileMode
		owner   int // -1: this user
		refusal string
	}{
		{"sticky and world-writable", 0o777 | os.ModeSticky, -1, "other users can create and replace files in it (mode 1777)"},
		{"group-writable", 0o770, -1, "other users can create and replace files in it (mode 0770)"},
		{"another user's", 0o755, testkit.NobodyUID, "it belongs to uid 65534, not to you"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := filepath.Join(t.TempDir(), "shared")
			if err := os.Mkdir(run, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(run, tt.mode); err != nil {
				t.Fatal(err)
			}
			if tt.owner >= 0 {
				if err := os.Chown(run, tt.owner, tt.owner); err != nil {
					t.Fatalf("giving the directory to another user (the test runs as root, as make test does): %v", err)
				}
			}
			before, _ := os.Stat(run)
			t.Setenv("CAPSEM_RUN_DIR", run)
			t.Setenv("CAPSEM_HOME", t.TempDir())
			t.Setenv("CAPSEM_UDS_PATH", "")
			// Should it serve after all, it stops here and the test fails.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := Serve(ctx, Options{Executable: "/nonexistent/capsem", Logger: slog.New(slog.DiscardHandler)})
			want := "refusing the run directory: " + run + " is not private to you: " + tt.refusal
			if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "CAPSEM_RUN_DIR") {
				t.Errorf("Serve = %v, want %q and a hint", err, want)
			}
			after, _ := os.Stat(run)
			if after.Mode() != before.Mode() || after.Sys().(*syscall.Stat_t).Uid != before.Sys().(*syscall.Stat_t).Uid {
				t.Errorf("the run directory changed: %v to %v", before.Mode(), after.Mode())
			}
			if entries, _ := os.ReadDir(run); len(entries) > 0 {
				t.Errorf("the service left %d entries in the refused directory, first %s", len(entries), entries[0].Name())
			}
			if err := StartDetached("/nonexistent/capsem", nil); err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("StartDetached = %v, want %q", err, want)
			}
		})
	}
}

// TestBadTCGCacheRefusedAtStart: a service told to bound the TCG cache
// out of range refuses to start, naming it, instead of failing every VM.
func TestBadTCGCacheRefusedAtStart(t *testing.T) {
	t.Setenv("CAPSEM_RUN_DIR", t.TempDir())
	t.Setenv("CAPSEM_HOME", t.TempDir())
	for _, mib := range []int{-1, 1, 1 << 20} {
		if _, err := New(context.Background(), Options{TCGCacheMiB: mib, Logger: slog.New(slog.DiscardHandler)}); err == nil || !strings.Contains(err.Error(), "TCG cache") {
			t.Errorf("TCG cache %d MiB: %v", mib, err)
		}
	}
}

// addVM puts a VM with rec's fields in s, as a create or a restart would.
func addVM(t *testing.T, s *Service, rec vmrecord.Record) *vm {
	t.Helper()
	rec.SessionDir = s.sessionDirFor(rec.ID)
	if err := os.MkdirAll(rec.SessionDir, 0o700); err != nil {
		t.Fatal(err)
	}
	v := &vm{rec: &rec}
	s.mu.Lock()
	s.vms[rec.ID] = v
	s.mu.Unlock()
	return v
}

// TestLifecycleCallOnAVMRemovedMeanwhile: a call that waited for a VM's
// lock while another removed the VM is told the VM is gone (404), and
// does nothing to it.
func TestLifecycleCallOnAVMRemovedMeanwhile(t *testing.T) {
	s := newTestService(t)
	v := addVM(t, s, vmrecord.Record{VM: api.VM{ID: "vm-0000000000a1", Name: "doomed", Persistent: true, State: api.StateStopped}})
	v.mu.Lock() // a delete under way
	got := make(chan error, 1)
	go func() {
		_, err := s.Resume(context.Background(), "doomed", api.ResumeRequest{})
		got <- err
	}()
	// Time for the call to find the VM and wait for its lock (had it not
	// yet looked, it would find no VM: a 404 too).
	time.Sleep(50 * time.Millisecond)
	s.discard(v)
	v.mu.Unlock()
	if err := <-got; StatusOf(err) != http.StatusNotFound {
		t.Fatalf("resume of a VM removed while it waited: %v (status %d), want 404", err, StatusOf(err))
	}
}

// TestRunVMsEnd: a run's VM cannot be persisted (the run removes it when
// its command ends); a stopping service refuses new runs; and a run's VM
// that a dead service left is removed by the next one at start, not
// re-adopted.
func TestRunVMsEnd(t *testing.T) {
	s := newTestService(t)
	addVM(t, s, vmrecord.Record{VM: api.VM{ID: "vm-0000000000b1", Name: "runner", Run: true, State: api.StateRunning}})
	if _, err := s.Persist("runner", "keep"); StatusOf(err) != http.StatusConflict || !strings.Contains(err.Error(), "belongs to a capsem run") {
		t.Errorf("persist of a run's VM: %v", err)
	}
	s.EndRuns(context.Background())
	h := s.Handler(nil)
	if status, body := do(t, h, "POST", api.RouteRunLive, `{"exec":{"command":"true"}}`); status != 503 || !strings.Contains(body, "stopping") {
		t.Errorf("a run on a stopping service: %d %s", status, body)
	}

	left := vmrecord.Record{VM: api.VM{ID: "vm-0000000000b2", Run: true, State: api.StateRunning, SessionDir: s.sessionDirFor("vm-0000000000b2")}}
	os.MkdirAll(left.SessionDir, 0o700)
	kept := vmrecord.Record{VM: api.VM{ID: "vm-0000000000b3", Name: "kept", Persistent: true, State: api.StateStopped, SessionDir: s.sessionDirFor("vm-0000000000b3")}}
	os.MkdirAll(kept.SessionDir, 0o700)
	for _, r := range []*vmrecord.Record{&left, &kept} {
		if err := s.reg.Save(r); err != nil {
			t.Fatal(err)
		}
	}
	next, err := New(context.Background(), Options{Executable: "/nonexistent/capsem", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if vms := next.List(); len(vms) != 1 || vms[0].Name != "kept" {
		t.Errorf("after a restart: %+v, want only the persistent VM", vms)
	}
	if _, err := os.Stat(left.SessionDir); !os.IsNotExist(err) {
		t.Errorf("the run's session directory is left: %v", err)
	}
	if recs, _ := next.reg.Read(); len(recs) != 1 || recs[0].ID != kept.ID {
		t.Errorf("records after a restart: %+v", recs)
	}
}

// TestStreamedCreateThatFailsAfterAStage: once a create's stream has told
// a stage, a failed start ends it with an error event (the status is
// sent), and the VM leaves nothing behind, as a refused create does.
func TestStreamedCreateThatFailsAfterAStage(t *testing.T) {
	t.Setenv("CAPSEM_RUN_DIR", t.TempDir())
	t.Setenv("CAPSEM_HOME", t.TempDir())
	// A per-VM process that reports a stage on its readiness pipe (the
	// last argument) and dies.
	exe := filepath.Join(t.TempDir(), "capsem")
	script := "#!/bin/sh\nfor a; do fd=$a; done\neval \"echo 'stage checking the guest assets' >&$fd\"\necho 'no guest assets here' >&2\nexit 3\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := New(context.Background(), Options{Executable: exe, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	status, body := do(t, s.Handler(nil), "POST", api.RouteVMsLive, `{"name":"doomed","ram_mb":256,"no_autodetect":true,"base":"minimal"}`)
	var stages []string
	vm, err := api.ReadCreateStream(strings.NewReader(body), func(st string) { stages = append(stages, st) })
	if status != 200 || strings.Join(stages, "|") != "checking the guest assets" || err == nil ||
		!strings.Contains(err.Error(), "ended before its API was ready") || !strings.Contains(err.Error(), "no guest assets here") || vm.ID != "" {
		t.Fatalf("%d, stages %q, vm %+v, err %v; body %s", status, stages, vm, err, body)
	}
	sessions, _ := os.ReadDir(s.sessions)
	records, _ := os.ReadDir(s.reg.Dir)
	if len(s.List()) != 0 || len(sessions) != 0 || len(records) != 0 {
		t.Fatalf("a failed start left %d VMs, %d session dirs and %d records", len(s.List()), len(sessions), len(records))
	}
}

// vmError says whose a per-VM API failure is, with one hint, its own
// code's: a call the process says a stop cut off (a stream's failure
// carries its code) is 409 interrupted, not the guest's refusal; a guest
// that went away is 503 with the process's reason; a dead process is 503.
func TestVMErrorSaysWhoseTheFailureIs(t *testing.T) {
	s := newTestService(t)
	cut := &apiclient.StatusError{Status: http.StatusConflict, Code: api.CodeInterrupted, Message: "guestctl: control connection closed: the guest closed it"}
	panicked := &apiclient.StatusError{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: "the guest's kernel panicked during the call (Kernel panic - not syncing: x), which stopped the VM"}
	gone := &apiclient.StatusError{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: "guestctl: control connection closed: the guest channel closed"}
	refused := &apiclient.StatusError{Status: http.StatusUnprocessableEntity, Code: api.CodeRefused, Message: "read /x: no such file or directory"}
	cases := []struct {
		name     string
		state    api.VMState
		stopping bool
		err      error
		status   int
		code     string
		has      string
	}{
		{"a stop the process saw", api.StateRunning, false, cut, 409, api.CodeInterrupted, "VM dev was stopped or removed during the call, which ended it: guestctl"},
		{"a stop the service asked for", api.StateRunning, true, gone, 409, api.CodeInterrupted, "VM dev was stopped or removed during the call, which ended it: guestctl"},
		{"the guest's refusal", api.StateRunning, false, refused, 400, api.CodeRefused, "VM dev: read /x: no such file"},
		{"the guest's panic", api.StateRunning, false, panicked, 503, api.CodeUnavailable, "VM dev: the guest's kernel panicked"},
		{"the guest's panic, the VM defunct already", api.StateDefunct, false, panicked, 503, api.CodeUnavailable, "VM dev is defunct: the call ended with it: the guest's kernel panicked"},
		{"a process that died", api.StateRunning, false, errors.New("EOF"), 503, api.CodeUnavailable, "its process stopped answering"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := &vm{rec: &vmrecord.Record{VM: api.VM{ID: "vm-000000000001", Name: "dev", State: tc.state}}, stopping: tc.stopping}
			err := s.vmError(v, tc.err)
			if StatusOf(err) != tc.status || CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.has) {
				t.Fatalf("%d %s %q, want %d %s saying %q", StatusOf(err), CodeOf(err), err, tc.status, tc.code, tc.has)
			}
			// The answer's code gives the hint (apiclient): none of the
			// process's is left in the message.
			if strings.Count((&apiclient.StatusError{Code: CodeOf(err), Message: err.Error()}).Error(), " (the ") > 1 {
				t.Fatalf("more than one hint: %q", err)
			}
		})
	}
}

// TestEveryVerbIsServed: each JSON verb of the service API reaches its
// handler (never the router's plain-text 404 or 405) and answers JSON: a
// body that is not JSON is a 400 naming the body, a call without one
// runs.
func TestEveryVerbIsServed(t *testing.T) {
	s := newTestService(t)
	h := s.Handler(nil)
	type verb struct {
		method, path string
		body         bool
	}
	of := func(method, path string, body bool) verb { return verb{method, path, body} }
	for name, v := range map[string]verb{
		"version":      of(api.VersionVerb.Method, api.VersionVerb.Path(""), api.VersionVerb.HasBody()),
		"list":         of(api.ListVerb.Method, api.ListVerb.Path(""), api.ListVerb.HasBody()),
		"create":       of(api.CreateVerb.Method, api.CreateVerb.Path(""), api.CreateVerb.HasBody()),
		"run":          of(api.RunVerb.Method, api.RunVerb.Path(""), api.RunVerb.HasBody()),
		"purge":        of(api.PurgeVerb.Method, api.PurgeVerb.Path(""), api.PurgeVerb.HasBody()),
		"info":         of(api.InfoVerb.Method, api.InfoVerb.Path("nope"), api.InfoVerb.HasBody()),
		"delete":       of(api.DeleteVerb.Method, api.DeleteVerb.Path("nope"), api.DeleteVerb.HasBody()),
		"exec":         of(api.ExecVerb.Method, api.ExecVerb.Path("nope"), api.ExecVerb.HasBody()),
		"stop":         of(api.StopVerb.Method, api.StopVerb.Path("nope"), api.StopVerb.HasBody()),
		"resume":       of(api.ResumeVerb.Method, api.ResumeVerb.Path("nope"), api.ResumeVerb.HasBody()),
		"suspend":      of(api.SuspendVerb.Method, api.SuspendVerb.Path("nope"), api.SuspendVerb.HasBody()),
		"persist":      of(api.PersistVerb.Method, api.PersistVerb.Path("nope"), api.PersistVerb.HasBody()),
		"fork":         of(api.ForkVerb.Method, api.ForkVerb.Path("nope"), api.ForkVerb.HasBody()),
		"images":       of(api.ImagesVerb.Method, api.ImagesVerb.Path(""), api.ImagesVerb.HasBody()),
		"image":        of(api.ImageVerb.Method, api.ImageVerb.Path("nope"), api.ImageVerb.HasBody()),
		"delete image": of(api.DeleteImageVerb.Method, api.DeleteImageVerb.Path("nope"), api.DeleteImageVerb.HasBody()),
		"publish":      of(api.PublishVerb.Method, api.PublishVerb.Path("nope"), api.PublishVerb.HasBody()),
		"read file":    of(api.ReadFileVerb.Method, api.ReadFileVerb.Path("nope"), api.ReadFileVerb.HasBody()),
		"write file":   of(api.WriteFileVerb.Method, api.WriteFileVerb.Path("nope"), api.WriteFileVerb.HasBody()),
		"vm schema":    of(api.VMSchemaVerb.Method, api.VMSchemaVerb.Path("nope"), api.VMSchemaVerb.HasBody()),
		"inspect":      of(api.InspectVerb.Method, api.InspectVerb.Path("nope"), api.InspectVerb.HasBody()),
		"mcp":          of(api.MCPVerb.Method, api.MCPVerb.Path("nope"), api.MCPVerb.HasBody()),
		"mcp servers":  of(api.MCPServersVerb.Method, api.MCPServersVerb.Path("nope"), api.MCPServersVerb.HasBody()),
		"stop service": of(api.ServiceStopVerb.Method, api.ServiceStopVerb.Path(""), api.ServiceStopVerb.HasBody()),
	} {
		body := ""
		if v.body {
			body = "{not json"
		}
		status, got := do(t, h, v.method, v.path, body)
		switch {
		case status == http.StatusNoContent || status/100 == 2 && !v.body:
		case v.body && status == http.StatusBadRequest && strings.Contains(got, "invalid request body"):
		case !v.body && status == http.StatusNotFound && strings.Contains(got, `"code":"not_found"`):
		default:
			t.Errorf("%s (%s %s): %d %s", name, v.method, v.path, status, got)
		}
	}
}
