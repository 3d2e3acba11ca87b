package service

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/ledger"
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

// TestAnsweredNotesFailuresAndSlowRequests: the service's log notes a
// failed request (5xx) as a warning, a refused one (4xx), and one that took
// SlowRequest or more unless its route takes a command's or a transfer's
// time; a quick success is not noted.
func TestAnsweredNotesFailuresAndSlowRequests(t *testing.T) {
	var log bytes.Buffer
	s := &Service{log: slog.New(slog.NewJSONHandler(&log, nil))}
	req := func(pattern string) *http.Request {
		method, _, _ := strings.Cut(pattern, " ")
		r := httptest.NewRequest(method, "/", nil)
		r.Pattern = pattern
		return r
	}
	s.answered(req("POST "+api.RouteVMs), 201, 3*time.Second)
	s.answered(req("GET "+api.RouteVM), 404, time.Millisecond)
	s.answered(req("POST "+api.RouteVMStop), 502, time.Millisecond)
	s.answered(req("POST "+api.RouteVMExec), 200, time.Minute)
	s.answered(req("GET "+api.RouteVMs), 200, time.Millisecond)
	got := log.String()
	for _, want := range []string{
		`"level":"INFO","msg":"slow request","method":"POST","route":"/v1/vms","status":201,"took_ms":3000`,
		`"level":"INFO","msg":"request refused","method":"GET","route":"/v1/vms/{vm}","status":404`,
		`"level":"WARN","msg":"request failed","method":"POST","route":"/v1/vms/{vm}/stop","status":502`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %s:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 3 {
		t.Errorf("%d lines logged, want 3 (not the exec's time, not a quick list):\n%s", n, got)
	}
}

// TestTriageRanks: crashes first, then errors, warnings and notes, each
// kind of trouble grouped with its count, first and last time; with a VM,
// its ledger's refused connections, denied MCP calls and failed commands
// join in; what happened before since is left out.
func TestTriageRanks(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	s := newTestService(t)
	v := addVM(t, s, vmrecord.Record{VM: api.VM{ID: "vm-0000000000d1", State: api.StateRunning}})
	now := time.Now().UTC()
	ts := func(ago time.Duration) string { return now.Add(-ago).Format(time.RFC3339Nano) }
	rec := func(ago time.Duration, level, msg, extra string) string {
		return `{"time":"` + ts(ago) + `","level":"` + level + `","msg":"` + msg + `"` + extra + "}\n"
	}
	serviceLog, _ := paths.ServiceLog()
	session := paths.Session{Dir: v.rec.SessionDir}
	os.WriteFile(serviceLog, []byte(
		rec(48*time.Hour, "ERROR", "long ago", "")+
			rec(3*time.Minute, "INFO", "request refused", `,"method":"GET","route":"/v1/vms/{vm}","status":404`)+
			rec(2*time.Minute, "INFO", "request refused", `,"method":"GET","route":"/v1/vms/{vm}","status":404`)+
			rec(2*time.Minute, "WARN", "request failed", `,"method":"POST","route":"/v1/vms/{vm}/stop","status":502`)+
			rec(90*time.Second, "INFO", "slow request", `,"method":"POST","route":"/v1/vms","status":201,"took_ms":4000`)+
			rec(time.Minute, "ERROR", "VM process died", `,"vm":"vm-0000000000d1"`)+
			rec(time.Minute, "ERROR", "cannot read "+home+"/.capsem/user.toml", "")), 0o600)
	os.WriteFile(session.ProcessLog(), []byte(rec(30*time.Second, "WARN", "guest missed its heartbeat", "")+
		"panic: boom\n\ngoroutine 1 [running]:\nmain.crash()\n\t"+home+"/main.go:7 +0x1d\n\n"), 0o600)
	led, err := ledger.Open(context.Background(), session.DB(), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	one := int64(1)
	led.Write(context.Background(),
		&ledger.NetEvent{Timestamp: now.Add(-time.Minute), Domain: "evil.example", Port: 443, Decision: "denied", PolicyReason: "not allowed"},
		&ledger.NetEvent{Timestamp: now.Add(-time.Minute), Domain: "evil.example", Port: 443, Decision: "denied", PolicyReason: "not allowed"},
		&ledger.ExecEvent{Timestamp: now.Add(-time.Minute), Command: "make test", ExitCode: &one, StderrPreview: "FAIL"},
		&ledger.MCPCall{Timestamp: now.Add(-time.Minute), Method: "tools/call", ToolName: "builtin__http_get", Decision: ledger.DecisionDenied, PolicyReason: "rule no-get"},
		&ledger.ExecEvent{Timestamp: now.Add(-48 * time.Hour), Command: "old", ExitCode: &one})
	led.Close()

	r, err := s.Triage(context.Background(), api.TriageRequest{VM: "vm-0000000000d1"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range r.Findings {
		got = append(got, fmt.Sprintf("%s %s %d: %s", f.Severity, f.Kind, f.Count, f.Summary))
		if strings.Contains(f.Summary+f.Example+f.Source, home) {
			t.Errorf("the home directory shows in %+v", f)
		}
	}
	want := []string{
		"critical panic 1: process of vm-0000000000d1 crashed: boom",
		"error error_log 1: service: VM process died",                       // a minute ago
		"error error_log 1: service: cannot read ~/.capsem/user.toml",       // the home directory as ~
		"error failed_request 1: POST /v1/vms/{vm}/stop answered 502",       // two minutes ago
		"warning denied_network 2: connections to evil.example:443 refused", // twice
		"warning warning_log 1: process: guest missed its heartbeat",        // 30 s ago
		"warning failed_exec 1: exit 1: make test",
		"warning mcp_error 1: tools/call builtin__http_get denied",
		"info refused_request 2: GET /v1/vms/{vm} refused with 404",
		"info slow_request 1: POST /v1/vms slower than 500ms",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if f := r.Findings[8]; f.First != ts(3*time.Minute) || f.Last != ts(2*time.Minute) {
		t.Errorf("the 404s' times: %+v", f)
	}
	// Without a VM: the host's logs alone; a limit keeps the gravest.
	r, err = s.Triage(context.Background(), api.TriageRequest{Limit: 2})
	if err != nil || len(r.Findings) != 2 || r.Findings[0].Kind != api.FindingPanic || r.Omitted != 5 {
		t.Fatalf("host only, limit 2: %+v, %v", r, err)
	}
	if _, err := s.Triage(context.Background(), api.TriageRequest{VM: "vm-000000000999"}); StatusOf(err) != http.StatusNotFound {
		t.Errorf("an unknown VM: %v", err)
	}
}
