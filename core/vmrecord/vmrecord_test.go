package vmrecord

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
)

// TestRegistrySurvivesDamage: records are replaced atomically; a damaged
// or foreign file is reported, and the others read. Read changes nothing;
// Load, the owner's, sets the damaged file aside and removes an unfinished
// write.
func TestRegistrySurvivesDamage(t *testing.T) {
	g := Registry{Dir: t.TempDir()}
	good := &Record{VM: api.VM{ID: "vm-0000000000aa", Name: "keep", State: api.StateStopped, CreatedAt: time.Unix(1, 0).UTC(), VMConfig: api.VMConfig{DiskGB: new(8)}}, Socket: "/s"}
	if err := g.Save(good); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(g.Dir, "vm-0000000000bb.json"), []byte(`{"id":`), 0o600)
	os.WriteFile(filepath.Join(g.Dir, "vm-0000000000cc.json"), []byte(`{"id":"vm-0000000000dd"}`), 0o600)
	os.WriteFile(filepath.Join(g.Dir, "vm-0000000000ee.json.123.tmp"), []byte(`{`), 0o600)
	for _, read := range []struct {
		name string
		f    func() ([]*Record, []error)
	}{{"Read", g.Read}, {"Load", g.Load}} {
		recs, errs := read.f()
		if len(recs) != 1 || !reflect.DeepEqual(recs[0], good) || len(errs) != 2 {
			t.Fatalf("%s: %+v, errors %v", read.name, recs, errs)
		}
		_, badErr := os.Stat(filepath.Join(g.Dir, "vm-0000000000bb.json.bad"))
		_, tmpErr := os.Stat(filepath.Join(g.Dir, "vm-0000000000ee.json.123.tmp"))
		if moved, kept := badErr == nil, tmpErr == nil; moved != (read.name == "Load") || kept != (read.name == "Read") {
			t.Errorf("after %s: damaged record moved aside %v, unfinished write kept %v", read.name, moved, kept)
		}
	}
	if err := g.Save(&Record{VM: api.VM{ID: "../x"}}); err == nil {
		t.Error("a record with a path for an id was saved")
	}
	if err := g.Remove("vm-0000000000aa"); err != nil {
		t.Fatal(err)
	}
	if recs, _ := g.Read(); len(recs) != 0 {
		t.Errorf("removed record still read: %+v", recs)
	}
}

func TestIsSessionProcess(t *testing.T) {
	dir := "/r/sessions/vm-0123456789ab"
	for _, tc := range []struct {
		cmdline string
		want    bool
	}{
		{"/bin/capsem\x00process\x00--session-dir\x00" + dir + "\x00--socket\x00x\x00", true},
		{"/bin/capsem\x00process\x00--session-dir\x00" + dir + "-other\x00", false},
		{"/bin/capsem\x00run\x00--session-dir\x00" + dir + "\x00", false},
		{"sh\x00-c\x00capsem process --session-dir " + dir + "\x00", false},
		{"", false},
	} {
		if got := IsSessionProcess([]byte(tc.cmdline), dir); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.cmdline, got, tc.want)
		}
	}
}

// TestProcessAlive: a record's pid counts only while it is that VM's
// process: not another process under the same pid, not after it exits.
func TestProcessAlive(t *testing.T) {
	dir := t.TempDir()
	// A shell whose argv is a per-VM process's (the "; :" keeps it from
	// exec'ing sleep in its place).
	cmd := exec.Command("sh", "-c", "sleep 30; :", "capsem", "process", "--session-dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := &Record{VM: api.VM{ID: "vm-0000000000aa", PID: cmd.Process.Pid, SessionDir: dir}}
	deadline := time.Now().Add(10 * time.Second)
	for !r.ProcessAlive() {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.PID))
			t.Fatalf("the VM's process is not seen alive: cmdline %q", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	other := *r
	other.SessionDir = dir + "-other"
	if other.ProcessAlive() {
		t.Error("another VM's record claims this process")
	}
	cmd.Process.Kill()
	cmd.Wait()
	if r.ProcessAlive() {
		t.Error("an exited process is alive")
	}
	if (&Record{}).ProcessAlive() {
		t.Error("a record without a pid is alive")
	}
}

// FuzzRead: whatever a record file holds, reading it is an error or a
// record, never a panic; a record read saves and reads back the same.
func FuzzRead(f *testing.F) {
	for _, s := range []string{`{"id":"vm-0000000000aa"}`, `{"id":`, `[]`, `null`, `{"id":"vm-0000000000aa","pid":-1,"env":{"a":"b"}}`, "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g := Registry{Dir: t.TempDir()}
		os.WriteFile(filepath.Join(g.Dir, "vm-0000000000aa.json"), data, 0o600)
		recs, errs := g.Read()
		if len(recs)+len(errs) != 1 {
			t.Fatalf("%d records and %d errors from one file", len(recs), len(errs))
		}
		if len(recs) == 1 {
			if err := g.Save(recs[0]); err != nil {
				t.Fatal(err)
			}
			again, errs := g.Read()
			if len(again) != 1 || len(errs) != 0 {
				t.Fatalf("saved and read back: %+v %v", again, errs)
			}
			if a, b := mustJSON(t, again[0]), mustJSON(t, recs[0]); a != b {
				t.Fatalf("saved and read back %s, want %s", a, b)
			}
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRecordVersions: a record written before the configuration had a
// version (its sizes beside the VM's fields) reads as the same
// configuration; one of a newer version than this capsem's is reported
// and left where it is, for the capsem that wrote it, not moved aside.
func TestRecordVersions(t *testing.T) {
	g := Registry{Dir: t.TempDir()}
	old := `{"id":"vm-0000000000a1","name":"old","persistent":true,"state":"stopped","ram_mb":512,"cpus":1,"image":"default","base":"minimal",` +
		`"created_at":"2026-11-01T00:00:00Z","session_dir":"/s/a1","ports":[{"address":"127.0.0.1","host":8080,"guest":80}],"disk_gb":0,"workspace_mib":64,"socket":"/s/a1/api.sock"}`
	newer := `{"id":"vm-0000000000a2","config_version":99,"state":"stopped","created_at":"2026-11-01T00:00:00Z","session_dir":"/s/a2","socket":"/s/a2/api.sock"}`
	os.WriteFile(filepath.Join(g.Dir, "vm-0000000000a1.json"), []byte(old), 0o600)
	os.WriteFile(filepath.Join(g.Dir, "vm-0000000000a2.json"), []byte(newer), 0o600)
	recs, errs := g.Load()
	if len(recs) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "config_version 99, newer than this capsem reads (1): left alone") {
		t.Fatalf("records %+v, errors %v", recs, errs)
	}
	want := api.VMConfig{RAMMB: 512, CPUs: 1, Base: api.BaseMinimal, DiskGB: new(0), WorkspaceMiB: 64, Ports: []api.PortMapping{{Address: "127.0.0.1", Host: 8080, Guest: 80}}}
	if !reflect.DeepEqual(recs[0].VMConfig, want) {
		t.Errorf("the old record's configuration: %+v, want %+v", recs[0].VMConfig, want)
	}
	if _, err := os.Stat(filepath.Join(g.Dir, "vm-0000000000a2.json")); err != nil {
		t.Errorf("the newer record was moved: %v", err)
	}
}
