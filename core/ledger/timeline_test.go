package ledger

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
)

// TestTimeline: rows of every table come back as one stream in time order,
// each with its layer and a summary; filters by trace, time and layer; the
// latest events when there are more than the limit, with the count left
// out; a bad request is refused by name.
func TestTimeline(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "session.db")
	l, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	zero := int64(0)
	rows := []Row{
		&ExecEvent{Timestamp: at(0), TraceID: "t1", Command: "claude -p hi", ExitCode: &zero, DurationMS: 900},
		&MCPCall{Timestamp: at(100), TraceID: "t1", Method: "tools/call", ToolName: "everything__echo", ProcessName: "claude", Decision: DecisionAllowed, DurationMS: 3},
		&DNSEvent{Timestamp: at(200), TraceID: "t1", Name: "api.anthropic.com", QType: "A", Answers: "203.0.113.5", RCode: "NOERROR", Decision: "allowed"},
		&NetEvent{Timestamp: at(300), TraceID: "t1", Domain: "api.anthropic.com", Port: 443, Decision: string(DecisionAllowed), Method: "POST", Path: "/v1/messages", StatusCode: 200, ConnType: "https-terminated"},
		&ModelCall{Timestamp: at(300), TraceID: "t1", Provider: "anthropic", Model: "claude-x", ProcessName: "claude", InputTokens: 10, OutputTokens: 5, StatusCode: 200},
		&MCPCall{Timestamp: at(400), Method: "tools/call", ToolName: "everything__echo", ProcessName: "python3", Decision: DecisionDenied, PolicyReason: "rule no-echo"},
		&FSEvent{Timestamp: at(500), Operation: "write", Path: "/root/workspace/a.txt", Size: 12, Direction: "in", Outcome: "ok"},
	}
	if err := l.Write(ctx, rows...); err != nil {
		t.Fatal(err)
	}
	layersOf := func(r api.TimelineResult) string {
		var s []string
		for _, e := range r.Events {
			s = append(s, e.Layer)
		}
		return strings.Join(s, ",")
	}
	for _, tc := range []struct {
		name    string
		req     api.TimelineRequest
		layers  string
		omitted int64
	}{
		{"all", api.TimelineRequest{}, "exec,mcp,dns,net,model,mcp,fs", 0},
		{"one trace", api.TimelineRequest{TraceID: "t1"}, "exec,mcp,dns,net,model", 0},
		{"since", api.TimelineRequest{Since: at(300)}, "net,model,mcp,fs", 0},
		{"layers", api.TimelineRequest{Layers: []string{api.LayerMCP, api.LayerExec}}, "exec,mcp,mcp", 0},
		{"the latest when limited", api.TimelineRequest{Limit: 2}, "mcp,fs", 5},
		{"an unknown trace", api.TimelineRequest{TraceID: "nope"}, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Timeline(ctx, path, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if got := layersOf(r); got != tc.layers || r.Omitted != tc.omitted {
				t.Fatalf("layers %q omitted %d, want %q and %d: %+v", got, r.Omitted, tc.layers, tc.omitted, r.Events)
			}
		})
	}
	r, err := Timeline(ctx, path, api.TimelineRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{
		"api: claude -p hi → exit 0 (900 ms)",
		"tools/call everything__echo by claude: allowed (3 ms)",
		"A api.anthropic.com → NOERROR allowed 203.0.113.5",
		"https-terminated api.anthropic.com:443 allowed POST /v1/messages → 200",
		"anthropic claude-x by claude: 10 in, 5 out tokens, status 200 (0 ms)",
		"tools/call everything__echo by python3: denied — rule no-echo (0 ms)",
		"in write /root/workspace/a.txt (12 bytes) ok",
	} {
		if r.Events[i].Summary != want {
			t.Errorf("event %d: %q, want %q", i, r.Events[i].Summary, want)
		}
	}
	if r.Events[0].Timestamp != stamp(at(0)) || r.Events[0].TraceID != "t1" || r.Events[5].TraceID != "" || r.Events[0].ID == 0 {
		t.Errorf("first event %+v, sixth %+v", r.Events[0], r.Events[5])
	}
	for _, bad := range []struct {
		req  api.TimelineRequest
		want string
	}{
		{api.TimelineRequest{Layers: []string{"disk"}}, `layer "disk": want one of`},
		{api.TimelineRequest{Limit: api.MaxTimelineEvents + 1}, "limit 5001"},
		{api.TimelineRequest{TraceID: "a b"}, `trace id "a b"`},
	} {
		if _, err := Timeline(ctx, path, bad.req); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want an error containing %q", bad.req, err, bad.want)
		}
	}
	if _, err := Timeline(ctx, filepath.Join(t.TempDir(), "none.db"), api.TimelineRequest{}); err == nil {
		t.Error("a missing ledger gave a timeline")
	}
}
