package service

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmrecord"
)

// TestPanicsAcrossTheLogs: the reports in the service's log (its rotated
// one too), capsem mcp's and a VM's process and aggregator logs come back
// the latest first, each naming its component, VM and log, the home
// directory shown as ~; since and limit filter, and a bad limit is refused.
func TestPanicsAcrossTheLogs(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	s := newTestService(t)
	v := addVM(t, s, vmrecord.Record{VM: api.VM{ID: "vm-0000000000c1", State: api.StateDefunct}})
	report := func(ts, msg string) string {
		return `{"time":"` + ts + `","level":"INFO","msg":"x"}` + "\npanic: " + msg + "\n\ngoroutine 1 [running]:\nmain.crash()\n\t" + home + "/src/capsem/main.go:7 +0x1d\n\n"
	}
	write := func(path, text string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	serviceLog, _ := paths.ServiceLog()
	mcpLog, _ := paths.MCPLog()
	session := paths.Session{Dir: v.rec.SessionDir}
	write(serviceLog+".1", report("2026-12-03T10:00:00Z", "oldest"))
	write(serviceLog, report("2026-12-03T11:00:00Z", "service"))
	write(mcpLog, report("2026-12-03T12:00:00Z", "mcp"))
	write(session.ProcessLog(), report("2026-12-03T13:00:00Z", "process "+home+"/secret"))
	write(session.AggregatorLog(), "no crash here\n")

	r, err := s.Panics(context.Background(), api.PanicsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range r.Panics {
		got = append(got, p.Component+"/"+p.VM+"/"+p.Message)
		if strings.Contains(p.Message+p.Location+strings.Join(p.Frames, "")+p.Log, home) || !strings.HasPrefix(p.Location, "main.crash() ~/src/capsem/main.go:7") {
			t.Errorf("the home directory shows in %+v", p)
		}
	}
	if want := "process/vm-0000000000c1/process ~/secret mcp//mcp service//service service//oldest"; strings.Join(got, " ") != want {
		t.Fatalf("reports %q, want %q", strings.Join(got, " "), want)
	}
	r, err = s.Panics(context.Background(), api.PanicsRequest{Since: time.Date(2026, 12, 3, 11, 30, 0, 0, time.UTC), Limit: 1})
	if err != nil || len(r.Panics) != 1 || r.Panics[0].Component != "process" || r.Omitted != 1 || filepath.Base(r.Panics[0].Log) != "process.log" {
		t.Fatalf("since 11:30, limit 1: %+v, %v", r, err)
	}
	if _, err := s.Panics(context.Background(), api.PanicsRequest{Limit: api.MaxPanics + 1}); err == nil {
		t.Error("a limit past the bound was accepted")
	}
}
