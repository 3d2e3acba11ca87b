package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

var allTables = []string{"dns_events", "exec_events", "fs_events", "mcp_calls", "model_calls", "net_events"}

func tempDB(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "session.db")
}

func openLedger(t testing.TB, path string, opts Options) *Ledger {
	t.Helper()
	l, err := Open(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// readOnlyDB is a reader independent of the Ledger's connection, as
// capsem_inspect would be.
func readOnlyDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", fileURI(path, "mode=ro&_query_only=1"))
	if err != nil {
		t.Fatalf("open read-only: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func journalMode(t testing.TB, path string) string {
	t.Helper()
	var mode string
	if err := readOnlyDB(t, path).QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	return mode
}

func queryAll(t testing.TB, path, q string) [][]any {
	t.Helper()
	res, err := Query(context.Background(), path, q, QueryLimits{MaxRows: 1_000_000, MaxCellBytes: 1 << 30, MaxAnswerBytes: 1 << 30, Timeout: 30 * time.Second, MaxMemoryBytes: 1 << 30})
	if err != nil {
		t.Fatalf("Query(%q): %v", q, err)
	}
	if res.Stopped != "" || res.CutCells > 0 {
		t.Fatalf("Query(%q): the answer was cut (%q, %d cells)", q, res.Stopped, res.CutCells)
	}
	return res.Rows
}

// testLimits are the service's bounds on answers, with maxRows rows and the
// timeout given.
func testLimits(maxRows int, timeout time.Duration) QueryLimits {
	return QueryLimits{MaxRows: maxRows, MaxCellBytes: 1 << 20, MaxAnswerBytes: 8 << 20, Timeout: timeout, MaxMemoryBytes: 96 << 20}
}

func count(t testing.TB, path, table string) int64 {
	t.Helper()
	rows := queryAll(t, path, "SELECT count(*) FROM "+table)
	return rows[0][0].(int64)
}

func mcp(decision Decision) *MCPCall {
	return &MCPCall{ServerName: "srv", Method: "tools/call", ToolName: "srv__echo", Decision: decision}
}

func TestOpenCreatesSchemaIdempotently(t *testing.T) {
	path := tempDB(t)
	ctx := context.Background()
	for round := range 3 {
		l, err := Open(ctx, path, Options{})
		if err != nil {
			t.Fatalf("round %d: Open: %v", round, err)
		}
		if err := l.Write(ctx, mcp(DecisionAllowed)); err != nil {
			t.Fatalf("round %d: Write: %v", round, err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", round, err)
		}
		if got := count(t, path, "mcp_calls"); got != int64(round+1) {
			t.Fatalf("round %d: mcp_calls has %d rows, want %d", round, got, round+1)
		}
	}

	if got := queryAll(t, path, "PRAGMA user_version")[0][0]; got != int64(SchemaVersion) {
		t.Errorf("user_version = %v, want %d", got, SchemaVersion)
	}
	if got := journalMode(t, path); got != "wal" {
		t.Errorf("journal_mode = %v, want wal", got)
	}
	var names []string
	for _, r := range queryAll(t, path, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name") {
		names = append(names, r[0].(string))
	}
	if !slices.Equal(names, allTables) {
		t.Errorf("tables = %v, want %v", names, allTables)
	}
	stmts, err := Schema(ctx, path)
	if err != nil {
		t.Fatalf("Schema: %v", err)
	}
	if len(stmts) != len(allTables) {
		t.Fatalf("Schema returned %d statements, want %d: %q", len(stmts), len(allTables), stmts)
	}
	for i, s := range stmts {
		if !strings.HasPrefix(s, "CREATE TABLE "+allTables[i]+" (") {
			t.Errorf("Schema()[%d] = %.60q…, want CREATE TABLE %s", i, s, allTables[i])
		}
	}
}

func TestIndexesAndInsertColumnsMatchSchema(t *testing.T) {
	path := tempDB(t)
	openLedger(t, path, Options{})
	indexes := map[string]bool{}
	for _, r := range queryAll(t, path, "SELECT name FROM sqlite_schema WHERE type = 'index'") {
		indexes[r[0].(string)] = true
	}
	rows := map[tableID]Row{
		tableMCPCalls: &MCPCall{}, tableNetEvents: &NetEvent{}, tableExecEvents: &ExecEvent{},
		tableFSEvents: &FSEvent{}, tableModelCalls: &ModelCall{}, tableDNSEvents: &DNSEvent{},
	}
	for id, row := range rows {
		name := tables[id].name
		t.Run(name, func(t *testing.T) {
			for _, col := range []string{"timestamp", "trace_id"} {
				if idx := "idx_" + name + "_" + col; !indexes[idx] {
					t.Errorf("missing index %s", idx)
				}
			}
			var cols []string
			for _, r := range queryAll(t, path, fmt.Sprintf("PRAGMA table_info(%s)", name)) {
				cols = append(cols, r[1].(string))
			}
			want := []string{"id"}
			for _, f := range row.fields() {
				want = append(want, f.name)
			}
			if !slices.Equal(cols, want) {
				t.Errorf("columns %v\nfields  %v", cols, want)
			}
		})
	}
	for _, idx := range []string{"idx_mcp_calls_server_name", "idx_mcp_calls_tool_name"} {
		if indexes[idx] {
			t.Errorf("index %s is back: every MCP answer's commit would write its page", idx)
		}
	}
	// The trace id index holds only rows with a trace id, and a lookup by
	// trace id still uses it.
	plan := queryAll(t, path, "EXPLAIN QUERY PLAN SELECT id FROM mcp_calls WHERE trace_id = 'abc'")
	if len(plan) == 0 || !strings.Contains(fmt.Sprint(plan[len(plan)-1]), "idx_mcp_calls_trace_id") {
		t.Errorf("a lookup by trace id does not use the trace id index: %v", plan)
	}
	sqlText := queryAll(t, path, "SELECT sql FROM sqlite_schema WHERE name = 'idx_mcp_calls_trace_id'")[0][0].(string)
	if !strings.Contains(sqlText, "WHERE trace_id IS NOT NULL") {
		t.Errorf("idx_mcp_calls_trace_id is %q, want it partial", sqlText)
	}
}

// execClosed runs statements on a ledger file no Ledger has open, to make
// it look as another version of capsem left it.
func execClosed(t *testing.T, path string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite3", fileURI(path, ""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestOpenMigratesVersion1 opens a file as version 1 left it (its indexes
// on server, tool and every trace id): the rows stay, those indexes go, the
// trace id index comes back partial, and the file is version 2.
func TestOpenMigratesVersion1(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	if err := l.Write(context.Background(), mcp(DecisionAllowed), mcp(DecisionDenied)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	execClosed(t, path,
		"DROP INDEX idx_mcp_calls_trace_id",
		"CREATE INDEX idx_mcp_calls_trace_id ON mcp_calls(trace_id)",
		"CREATE INDEX idx_mcp_calls_server_name ON mcp_calls(server_name)",
		"CREATE INDEX idx_mcp_calls_tool_name ON mcp_calls(tool_name)",
		"PRAGMA user_version = 1",
	)

	l = openLedger(t, path, Options{})
	if err := l.Write(context.Background(), mcp(DecisionAllowed)); err != nil {
		t.Fatal(err)
	}
	if got := queryAll(t, path, "SELECT COUNT(*) FROM mcp_calls")[0][0]; got != int64(3) {
		t.Errorf("%v rows after the migration, want 3", got)
	}
	if got := queryAll(t, path, "PRAGMA user_version")[0][0]; got != int64(SchemaVersion) {
		t.Errorf("user_version = %v, want %d", got, SchemaVersion)
	}
	var idx []string
	for _, r := range queryAll(t, path, "SELECT name || ': ' || sql FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'mcp_calls' ORDER BY name") {
		idx = append(idx, r[0].(string))
	}
	want := []string{
		"idx_mcp_calls_event_id: CREATE UNIQUE INDEX idx_mcp_calls_event_id ON mcp_calls(event_id)",
		"idx_mcp_calls_timestamp: CREATE INDEX idx_mcp_calls_timestamp ON mcp_calls(timestamp)",
		"idx_mcp_calls_trace_id: CREATE INDEX idx_mcp_calls_trace_id ON mcp_calls(trace_id) WHERE trace_id IS NOT NULL",
	}
	if !slices.Equal(idx, want) {
		t.Errorf("mcp_calls indexes after the migration:\n%s\nwant\n%s", strings.Join(idx, "\n"), strings.Join(want, "\n"))
	}
}

// TestOpenMigratesVersion2: a version-2 file (no pending column, event_id
// not unique) gets both, its rows kept and not pending.
func TestOpenMigratesVersion2(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	if err := l.Write(context.Background(), mcp(DecisionAllowed), mcp(DecisionDenied)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	execClosed(t, path,
		"DROP INDEX idx_mcp_calls_event_id",
		"ALTER TABLE mcp_calls DROP COLUMN pending",
		"ALTER TABLE mcp_calls DROP COLUMN request_digest",
		"ALTER TABLE mcp_calls DROP COLUMN response_digest",
		"PRAGMA user_version = 2",
	)
	l = openLedger(t, path, Options{})
	if err := l.Write(context.Background(), mcp(DecisionAllowed)); err != nil {
		t.Fatal(err)
	}
	if got := queryAll(t, path, "SELECT COUNT(*), SUM(pending), COUNT(request_digest) FROM mcp_calls")[0]; got[0] != int64(3) || got[1] != int64(0) || got[2] != int64(0) {
		t.Errorf("rows, pending, digests after the migration: %v", got)
	}
	if got := queryAll(t, path, "SELECT COUNT(*) FROM sqlite_schema WHERE name = 'idx_mcp_calls_event_id'")[0][0]; got != int64(1) {
		t.Error("no unique event_id index after the migration")
	}
}

// TestOpenMigratesVersion4: a version-4 file gains dns_events and
// net_events' ip, source and action, its rows kept, and the seed's query
// on net_events works on it.
func TestOpenMigratesVersion4(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	ctx := context.Background()
	if err := l.Write(ctx, &NetEvent{Domain: "old.example", Decision: string(DecisionDenied)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	execClosed(t, path,
		"DROP TABLE dns_events",
		"ALTER TABLE net_events DROP COLUMN action",
		"ALTER TABLE net_events DROP COLUMN ip",
		"ALTER TABLE net_events DROP COLUMN source",
		"ALTER TABLE net_events DROP COLUMN policy_source",
		"PRAGMA user_version = 4",
	)
	l = openLedger(t, path, Options{})
	if err := l.Write(ctx, &NetEvent{Domain: "new.example", Decision: string(DecisionAllowed), IP: "203.0.113.1", Source: SourceGuest},
		&DNSEvent{Name: "new.example", RCode: "NOERROR", Decision: "allowed"}); err != nil {
		t.Fatal(err)
	}
	got := queryAll(t, path, "SELECT domain, action, status_code, ip, source FROM net_events ORDER BY timestamp, id")
	if len(got) != 2 || got[0][0] != "old.example" || got[0][1] != "denied" || got[1][1] != "allowed" || got[1][3] != "203.0.113.1" || got[1][4] != "guest" {
		t.Errorf("net_events after the migration: %v", got)
	}
	if n := count(t, path, "dns_events"); n != 1 {
		t.Errorf("dns_events has %d rows", n)
	}
}

func TestDNSEventValidation(t *testing.T) {
	for _, e := range []*DNSEvent{{RCode: "NOERROR", Decision: "maybe"}, {Decision: "allowed"}} {
		if err := e.fill(time.Now()); err == nil {
			t.Errorf("%+v accepted", e)
		}
	}
}

// TestOpenMigratesVersion3: a version-3 file's fs_events rows keep their
// operation under its new column name (the seed's
// `SELECT COUNT(*) AS n, operation FROM fs_events GROUP BY operation` works
// on an old session), and exec_events gains pending and a unique event id.
func TestOpenMigratesVersion3(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	ctx := context.Background()
	if err := l.Write(ctx, &FSEvent{Operation: "modified", Path: "/root/a"}, &ExecEvent{Command: "true"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	execClosed(t, path,
		"DROP INDEX idx_exec_events_event_id",
		"ALTER TABLE exec_events DROP COLUMN pending",
		"ALTER TABLE fs_events DROP COLUMN direction",
		"ALTER TABLE fs_events DROP COLUMN digest",
		"ALTER TABLE fs_events DROP COLUMN outcome",
		"ALTER TABLE fs_events DROP COLUMN error_message",
		"ALTER TABLE fs_events RENAME COLUMN operation TO action",
		"PRAGMA user_version = 3",
	)
	l = openLedger(t, path, Options{})
	if err := l.Write(ctx, &FSEvent{Operation: "read", Path: "/root/b", Direction: FromGuest, Outcome: OutcomeOK}); err != nil {
		t.Fatal(err)
	}
	got := queryAll(t, path, "SELECT COUNT(*) AS n, operation FROM fs_events GROUP BY operation ORDER BY operation")
	if len(got) != 2 || got[0][1] != "modified" || got[1][1] != "read" {
		t.Errorf("fs_events by operation after the migration: %v", got)
	}
	if got := queryAll(t, path, "SELECT COUNT(*), SUM(pending) FROM exec_events")[0]; got[0] != int64(1) || got[1] != int64(0) {
		t.Errorf("exec_events after the migration: %v", got)
	}
	if got := queryAll(t, path, "SELECT COUNT(*) FROM sqlite_schema WHERE name = 'idx_exec_events_event_id'")[0][0]; got != int64(1) {
		t.Error("no unique exec event_id index after the migration")
	}
}

// TestPendingExecIsCompleted: a command recorded pending and then ended is
// one row; one whose end never came stays pending.
func TestPendingExecIsCompleted(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	ctx := context.Background()
	ended := &ExecEvent{Command: "make", Pending: true}
	killed := &ExecEvent{Command: "sleep 99", Pending: true}
	if err := l.Write(ctx, ended, killed); err != nil {
		t.Fatal(err)
	}
	code := int64(2)
	done := *ended
	done.Pending, done.ExitCode, done.DurationMS = false, &code, 7
	if err := l.Write(ctx, &done); err != nil {
		t.Fatal(err)
	}
	rows := queryAll(t, path, "SELECT command, pending, exit_code, duration_ms FROM exec_events ORDER BY id")
	if len(rows) != 2 || rows[0][0] != "make" || rows[0][1] != int64(0) || rows[0][2] != int64(2) || rows[0][3] != int64(7) ||
		rows[1][0] != "sleep 99" || rows[1][1] != int64(1) || rows[1][2] != nil {
		t.Fatalf("rows %v", rows)
	}
}

// TestPendingRowIsCompleted: a call recorded pending and then answered is
// one row, completed; one never answered stays pending.
func TestPendingRowIsCompleted(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	ctx := context.Background()
	answered := mcp(DecisionAllowed)
	answered.Pending, answered.ResponsePreview = true, ""
	crashed := mcp(DecisionAllowed)
	crashed.Pending, crashed.ToolName = true, "srv__crashes"
	if err := l.Write(ctx, answered, crashed); err != nil {
		t.Fatal(err)
	}
	if got := queryAll(t, path, "SELECT COUNT(*), SUM(pending) FROM mcp_calls")[0]; got[0] != int64(2) || got[1] != int64(2) {
		t.Fatalf("before the answers: %v", got)
	}
	done := *answered
	done.Pending, done.ResponsePreview, done.DurationMS, done.Decision = false, `{"content":[]}`, 42, DecisionError
	if err := l.Write(ctx, &done); err != nil {
		t.Fatal(err)
	}
	rows := queryAll(t, path, "SELECT event_id, pending, response_preview, duration_ms, decision FROM mcp_calls ORDER BY id")
	if len(rows) != 2 || rows[0][0] != answered.EventID || rows[0][1] != int64(0) || rows[0][2] != `{"content":[]}` ||
		rows[0][3] != int64(42) || rows[0][4] != "error" || rows[1][1] != int64(1) {
		t.Fatalf("rows %v", rows)
	}
}

func TestOpenRefusesNewerSchema(t *testing.T) {
	path := tempDB(t)
	l, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	execClosed(t, path, fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion+1))

	_, err = Open(context.Background(), path, Options{})
	if want := fmt.Sprintf("schema version %d, newer than the %d", SchemaVersion+1, SchemaVersion); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open of a newer file: err = %v, want one containing %q", err, want)
	}
}

func TestFileMode(t *testing.T) {
	t.Run("new", func(t *testing.T) {
		path := tempDB(t)
		l := openLedger(t, path, Options{})
		if err := l.Write(context.Background(), mcp(DecisionAllowed)); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if m := fi.Mode().Perm(); m != 0o600 {
				t.Errorf("%s mode = %o, want 600", filepath.Base(p), m)
			}
		}
	})
	t.Run("existing file is tightened", func(t *testing.T) {
		path := tempDB(t)
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		openLedger(t, path, Options{})
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("mode = %o, want 600", m)
		}
	})
	t.Run("awkward path", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "a?b#c%20d.db")
		l := openLedger(t, path, Options{})
		if err := l.Write(context.Background(), mcp(DecisionAllowed)); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("ledger not at the literal path: %v", err)
		}
		if got := count(t, path, "mcp_calls"); got != 1 {
			t.Fatalf("rows = %d, want 1", got)
		}
	})
}

func TestRoundTrip(t *testing.T) {
	ts := time.Date(2026, 1, 2, 4, 4, 5, 6, time.FixedZone("CET", 3600))
	const wantTS = "2026-01-02T03:04:05.000000006Z"
	tests := []struct {
		name  string
		table string
		row   Row
		want  map[string]any
	}{
		{
			name: "mcp call full", table: "mcp_calls",
			row: &MCPCall{
				EventID: "0123456789ab", Timestamp: ts, TraceID: "trace-1", ServerName: "github",
				Method: "tools/call", ToolName: "github__search", RequestID: "7",
				RequestPreview: `{"q":"x"}`, ResponsePreview: `{"content":[]}`, Decision: DecisionWarned,
				DurationMS: 12, ErrorMessage: "boom", ErrorCode: new(int64(-32603)), ProcessName: "claude",
				BytesSent: 34, BytesReceived: 56, PolicyMode: "audit_only", PolicyAction: "allow",
				PolicyRule: "rule-1", PolicyReason: "because", StreamID: new(int64(9)), Transport: "frame",
			},
			want: map[string]any{
				"event_id": "0123456789ab", "timestamp": wantTS, "trace_id": "trace-1",
				"server_name": "github", "method": "tools/call", "tool_name": "github__search",
				"request_id": "7", "request_preview": `{"q":"x"}`, "response_preview": `{"content":[]}`,
				"decision": "warned", "duration_ms": int64(12), "error_message": "boom",
				"error_code": int64(-32603), "process_name": "claude", "bytes_sent": int64(34),
				"bytes_received": int64(56), "policy_mode": "audit_only", "policy_action": "allow",
				"policy_rule": "rule-1", "policy_reason": "because", "stream_id": int64(9), "transport": "frame",
			},
		},
		{
			name: "mcp call sparse stores NULLs", table: "mcp_calls",
			row: &MCPCall{EventID: "00000000000a", Timestamp: ts, Method: "notifications/initialized", Decision: DecisionAllowed},
			want: map[string]any{
				"trace_id": nil, "server_name": nil, "tool_name": nil, "request_id": nil,
				"request_preview": nil, "error_code": nil, "stream_id": nil, "transport": nil,
				"duration_ms": int64(0), "bytes_sent": int64(0), "decision": "allowed",
			},
		},
		{
			name: "net event", table: "net_events",
			row: &NetEvent{
				EventID: "aaaaaaaaaaaa", Timestamp: ts, TraceID: "t", Domain: "api.example.com", Port: 8443,
				Decision: "denied", ProcessName: "curl", PID: 42, Method: "POST", Path: "/v1", Query: "a=b",
				StatusCode: 403, BytesSent: 1, BytesReceived: 2, DurationMS: 3, MatchedRule: "r",
				ErrorMessage: "e", RequestHeaders: "h1", ResponseHeaders: "h2", RequestBodyPreview: "b1",
				ResponseBodyPreview: "b2", ConnType: "http", PolicyMode: "m", PolicyAction: "block",
				PolicyRule: "pr", PolicyReason: "why",
			},
			want: map[string]any{
				"event_id": "aaaaaaaaaaaa", "timestamp": wantTS, "trace_id": "t", "domain": "api.example.com",
				"port": int64(8443), "decision": "denied", "process_name": "curl", "pid": int64(42),
				"method": "POST", "path": "/v1", "query": "a=b", "status_code": int64(403),
				"bytes_sent": int64(1), "bytes_received": int64(2), "duration_ms": int64(3),
				"matched_rule": "r", "error_message": "e", "request_headers": "h1", "response_headers": "h2",
				"request_body_preview": "b1", "response_body_preview": "b2", "conn_type": "http",
				"policy_mode": "m", "policy_action": "block", "policy_rule": "pr", "policy_reason": "why",
			},
		},
		{
			name: "net event defaults", table: "net_events",
			row:  &NetEvent{EventID: "aaaaaaaaaaab", Timestamp: ts, Domain: "x"},
			want: map[string]any{"port": int64(443), "conn_type": "https", "status_code": int64(0)},
		},
		{
			name: "exec event", table: "exec_events",
			row: &ExecEvent{
				EventID: "bbbbbbbbbbbb", Timestamp: ts, TraceID: "t2", ExecID: "x1", Command: "ls -l",
				ExitCode: new(int64(2)), DurationMS: 5, StdoutPreview: "out", StderrPreview: "err",
				StdoutBytes: 3, StderrBytes: 4, Truncated: true, TimedOut: true, Source: "mcp",
				ProcessName: "bash", PID: 7,
			},
			want: map[string]any{
				"event_id": "bbbbbbbbbbbb", "timestamp": wantTS, "trace_id": "t2", "exec_id": "x1",
				"command": "ls -l", "exit_code": int64(2), "duration_ms": int64(5), "stdout_preview": "out",
				"stderr_preview": "err", "stdout_bytes": int64(3), "stderr_bytes": int64(4),
				"truncated": int64(1), "timed_out": int64(1), "source": "mcp", "process_name": "bash", "pid": int64(7),
			},
		},
		{
			name: "exec event killed", table: "exec_events",
			row:  &ExecEvent{EventID: "bbbbbbbbbbbc", Timestamp: ts, Command: "sleep 9"},
			want: map[string]any{"exit_code": nil, "source": "api", "truncated": int64(0), "timed_out": int64(0)},
		},
		{
			name: "fs event", table: "fs_events",
			row: &FSEvent{EventID: "cccccccccccc", Timestamp: ts, TraceID: "t3", Operation: "modified", Path: "/root/a.txt", Size: 99},
			want: map[string]any{
				"event_id": "cccccccccccc", "timestamp": wantTS, "trace_id": "t3",
				"operation": "modified", "path": "/root/a.txt", "size": int64(99),
				"direction": nil, "digest": nil, "outcome": nil, "error_message": nil,
			},
		},
		{
			name: "fs transfer", table: "fs_events",
			row: &FSEvent{EventID: "cccccccccccd", Timestamp: ts, Operation: "write", Path: "/root/b", Size: 3,
				Direction: ToGuest, Digest: "ab12", Outcome: OutcomeError, ErrorMessage: "no space left on device"},
			want: map[string]any{
				"operation": "write", "direction": "to_guest", "digest": "ab12", "outcome": "error",
				"error_message": "no space left on device", "trace_id": nil,
			},
		},
		{
			name: "model call", table: "model_calls",
			row: &ModelCall{
				EventID: "dddddddddddd", Timestamp: ts, TraceID: "t4", Provider: "anthropic", Model: "claude-x",
				ProcessName: "claude", RequestBytes: 10, ResponseBytes: 20, InputTokens: 30, OutputTokens: 40,
				DurationMS: 50, StatusCode: 200,
			},
			want: map[string]any{
				"event_id": "dddddddddddd", "timestamp": wantTS, "trace_id": "t4", "provider": "anthropic",
				"model": "claude-x", "process_name": "claude", "request_bytes": int64(10),
				"response_bytes": int64(20), "input_tokens": int64(30), "output_tokens": int64(40),
				"duration_ms": int64(50), "status_code": int64(200),
			},
		},
	}
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := l.Write(context.Background(), tt.row); err != nil {
				t.Fatalf("Write: %v", err)
			}
			var eventID string
			for _, f := range tt.row.fields() {
				if f.name == "event_id" {
					eventID = f.value.(string)
				}
			}
			res, err := Query(context.Background(), path,
				fmt.Sprintf("SELECT * FROM %s WHERE event_id = '%s'", tt.table, eventID), testLimits(10, 10*time.Second))
			if err != nil {
				t.Fatalf("Query: %v", err)
			}
			cols, rows := res.Columns, res.Rows
			if len(rows) != 1 {
				t.Fatalf("got %d rows for event %s, want 1", len(rows), eventID)
			}
			got := map[string]any{}
			for i, c := range cols {
				got[c] = rows[0][i]
			}
			for c, w := range tt.want {
				g, ok := got[c]
				if !ok {
					t.Errorf("no column %s", c)
					continue
				}
				if g != w {
					t.Errorf("%s = %#v, want %#v", c, g, w)
				}
			}
		})
	}
}

func TestDefaultsFilledOnCallerRow(t *testing.T) {
	l := openLedger(t, tempDB(t), Options{})
	before := time.Now()
	c := mcp(DecisionAllowed)
	if err := l.Write(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if !validEventID(c.EventID) {
		t.Errorf("EventID = %q, want 12 lowercase hex", c.EventID)
	}
	if c.Timestamp.Before(before) || c.Timestamp.After(time.Now()) {
		t.Errorf("Timestamp = %v, not the write time", c.Timestamp)
	}
	rows := queryAll(t, l.Path(), "SELECT timestamp FROM mcp_calls WHERE event_id = '"+c.EventID+"'")
	if got, want := rows[0][0], c.Timestamp.UTC().Format(TimeLayout); got != want {
		t.Errorf("timestamp = %v, want %v", got, want)
	}
	if _, err := time.Parse(time.RFC3339Nano, rows[0][0].(string)); err != nil {
		t.Errorf("timestamp %v is not RFC 3339: %v", rows[0][0], err)
	}
}

func TestTimestampsSortLexically(t *testing.T) {
	base := time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)
	// RFC3339Nano would render these as .1Z and .12Z, which sort wrongly.
	a, b := stamp(base.Add(100*time.Millisecond)), stamp(base.Add(120*time.Millisecond))
	if !(a < b) {
		t.Errorf("%s !< %s", a, b)
	}
}

func TestRequestIDText(t *testing.T) {
	tests := []struct {
		raw  string
		want string
	}{
		{`42`, "42"},
		{` 42 `, "42"},
		{`-1.5e3`, "-1.5e3"},
		{`12345678901234567890`, "12345678901234567890"},
		{`"abc"`, "abc"},
		{`"a\"b\u00e9"`, `a"bé`},
		{`"42"`, "42"},
		{`null`, ""},
		{``, ""},
	}
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			got := RequestIDText(json.RawMessage(tt.raw))
			if got != tt.want {
				t.Fatalf("RequestIDText(%s) = %q, want %q", tt.raw, got, tt.want)
			}
			c := mcp(DecisionAllowed)
			c.RequestID = got
			if err := l.Write(context.Background(), c); err != nil {
				t.Fatal(err)
			}
			rows := queryAll(t, path, "SELECT request_id, typeof(request_id) FROM mcp_calls WHERE event_id = '"+c.EventID+"'")
			if tt.want == "" {
				if rows[0][0] != nil {
					t.Fatalf("request_id = %#v, want NULL", rows[0][0])
				}
				return
			}
			if rows[0][0] != tt.want || rows[0][1] != "text" {
				t.Fatalf("request_id = %#v (%v), want text %q", rows[0][0], rows[0][1], tt.want)
			}
		})
	}
}

func TestCapField(t *testing.T) {
	pad := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name    string
		in      string
		wantLen int
	}{
		{"empty", "", 0},
		{"short", "héllo", len("héllo")},
		{"exactly max", pad(MaxFieldBytes), MaxFieldBytes},
		{"one over ascii", pad(MaxFieldBytes + 1), MaxFieldBytes},
		{"2-byte rune ends at max", pad(MaxFieldBytes-2) + "é", MaxFieldBytes},
		{"2-byte rune straddles max", pad(MaxFieldBytes-1) + "é", MaxFieldBytes - 1},
		{"3-byte rune straddles by 1", pad(MaxFieldBytes-2) + "€", MaxFieldBytes - 2},
		{"3-byte rune straddles by 2", pad(MaxFieldBytes-1) + "€", MaxFieldBytes - 1},
		{"4-byte rune straddles by 1", pad(MaxFieldBytes-3) + "😀", MaxFieldBytes - 3},
		{"4-byte rune straddles by 3", pad(MaxFieldBytes-1) + "😀x", MaxFieldBytes - 1},
		{"4-byte rune then more", pad(MaxFieldBytes-4) + "😀😀", MaxFieldBytes},
		{"all multibyte", strings.Repeat("€", MaxFieldBytes), MaxFieldBytes - MaxFieldBytes%3},
		{"invalid continuation run", pad(MaxFieldBytes-8) + strings.Repeat("\x80", 20), MaxFieldBytes - 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CapField(tt.in)
			if len(got) != tt.wantLen {
				t.Fatalf("len = %d, want %d", len(got), tt.wantLen)
			}
			if !strings.HasPrefix(tt.in, got) {
				t.Fatal("result is not a prefix of the input")
			}
			if utf8.ValidString(tt.in) && !utf8.ValidString(got) {
				t.Fatal("valid input gave invalid UTF-8")
			}
		})
	}
}

func TestTextFieldsCappedOnWrite(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	big := strings.Repeat("a", MaxFieldBytes-1) + "€" + strings.Repeat("b", 1000)
	c := &MCPCall{Decision: DecisionAllowed, RequestPreview: big, ResponsePreview: big, ErrorMessage: big, ToolName: big}
	e := &ExecEvent{StdoutPreview: big, Command: big}
	if err := l.Write(context.Background(), c, e); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"SELECT request_preview, response_preview, error_message, tool_name FROM mcp_calls",
		"SELECT stdout_preview, command FROM exec_events",
	} {
		for _, v := range queryAll(t, path, q)[0] {
			s := v.(string)
			if len(s) != MaxFieldBytes-1 || !utf8.ValidString(s) {
				t.Errorf("%s: stored %d bytes (valid=%v), want %d valid", q, len(s), utf8.ValidString(s), MaxFieldBytes-1)
			}
		}
	}
}

func TestValidationFailsOnlyThatWrite(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	tests := []struct {
		name string
		rows []Row
		want string
	}{
		{"bad decision", []Row{&MCPCall{Decision: "maybe"}}, `decision "maybe" is not one of`},
		{"empty decision", []Row{&MCPCall{}}, `decision "" is not one of`},
		{"bad event id", []Row{&MCPCall{EventID: "XYZ", Decision: DecisionAllowed}}, "not 12 lowercase hex"},
		{"nil row", []Row{(*MCPCall)(nil)}, "row 0 is nil"},
		{"nil interface", []Row{mcp(DecisionAllowed), nil}, "row 1 is nil"},
		{"fs without path", []Row{&FSEvent{Operation: "read"}}, "operation and path are required"},
		// The valid first row must not be written either: a call is atomic.
		{"one bad row in a call", []Row{mcp(DecisionAllowed), &MCPCall{Decision: "x"}}, "not one of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := l.Write(context.Background(), tt.rows...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write err = %v, want %q", err, tt.want)
			}
			if err := l.Enqueue(tt.rows...); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Enqueue err = %v, want %q", err, tt.want)
			}
		})
	}
	if err := l.Write(context.Background(), mcp(DecisionDenied)); err != nil {
		t.Fatalf("valid write after invalid ones: %v", err)
	}
	if got := count(t, path, "mcp_calls"); got != 1 {
		t.Fatalf("mcp_calls has %d rows, want only the 1 valid one", got)
	}
	if err := l.Write(context.Background()); err != nil {
		t.Fatalf("Write of no rows: %v", err)
	}
}

// TestConcurrentWritersVisibleOnReturn is the property the gateway relies
// on: when Write returns nil, an independent reader already sees the row.
func TestConcurrentWritersVisibleOnReturn(t *testing.T) {
	const writers, perWriter = 64, 100
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	reader := readOnlyDB(t, path)
	reader.SetMaxOpenConns(8)

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				c := mcp(DecisionAllowed)
				c.TraceID = fmt.Sprintf("w%d-%d", w, i)
				c.RequestID = fmt.Sprint(i)
				if err := l.Write(context.Background(), c); err != nil {
					errs <- fmt.Errorf("writer %d row %d: %w", w, i, err)
					return
				}
				var n int
				if err := reader.QueryRow("SELECT count(*) FROM mcp_calls WHERE trace_id = ?", c.TraceID).Scan(&n); err != nil {
					errs <- fmt.Errorf("reader: %w", err)
					return
				}
				if n != 1 {
					errs <- fmt.Errorf("writer %d row %d: Write returned but reader sees %d rows for %s", w, i, n, c.TraceID)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := count(t, path, "mcp_calls"); got != writers*perWriter {
		t.Fatalf("mcp_calls has %d rows, want %d", got, writers*perWriter)
	}
	st := l.Stats()
	if st.Rows != writers*perWriter || st.FailedRows != 0 {
		t.Errorf("stats = %+v", st)
	}
	// With 64 callers blocked at once, commits must have been shared.
	if st.Commits >= st.Rows {
		t.Errorf("%d commits for %d rows: no group commit happened", st.Commits, st.Rows)
	}
	t.Logf("%d rows in %d commits", st.Rows, st.Commits)
}

// blockWriter makes the writer wait inside its next transaction until the
// returned release func is called; entered is closed once it is waiting.
func blockWriter(l *Ledger) (entered <-chan struct{}, release func()) {
	in := make(chan struct{})
	gate := make(chan struct{})
	var once sync.Once
	l.testHookBeforeCommit = func(int) error {
		once.Do(func() { close(in) })
		<-gate
		return nil
	}
	var rel sync.Once
	return in, func() { rel.Do(func() { close(gate) }) }
}

func TestCancelledWaiterRowStillLands(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	entered, release := blockWriter(l)
	defer release()

	first := make(chan error, 1)
	go func() { first <- l.Write(context.Background(), mcp(DecisionAllowed)) }()
	<-entered // the writer is now stuck inside the first transaction

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	c := mcp(DecisionDenied)
	go func() { done <- l.Write(ctx, c) }()
	time.Sleep(20 * time.Millisecond) // let it queue and wait
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Write returned %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled Write did not return while the writer was blocked")
	}

	// Already-cancelled context: the row is still recorded.
	c2 := mcp(DecisionError)
	if err := l.Write(ctx, c2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Write with a done ctx returned %v, want context.Canceled", err)
	}

	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{c.EventID, c2.EventID} {
		rows := queryAll(t, path, "SELECT count(*) FROM mcp_calls WHERE event_id = '"+id+"'")
		if rows[0][0] != int64(1) {
			t.Errorf("row %s of a cancelled waiter was not written", id)
		}
	}
}

func TestCancelledWhileQueueFullRowStillLands(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{QueueRows: 1})
	entered, release := blockWriter(l)
	defer release()

	first := make(chan error, 1)
	go func() { first <- l.Write(context.Background(), mcp(DecisionAllowed)) }()
	<-entered

	// Fill the queue (1 row) with a fire-and-forget row.
	if err := l.Enqueue(mcp(DecisionAllowed)); err != nil {
		t.Fatal(err)
	}
	// The queue is full: this Write waits for room, then gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := l.Write(ctx, mcp(DecisionWarned)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write on a full queue returned %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Write took %v to honour its deadline", d)
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := count(t, path, "mcp_calls"); got != 3 {
		t.Fatalf("mcp_calls has %d rows, want 3 (none lost)", got)
	}
}

func TestBackpressureWhenQueueFull(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{QueueRows: 2})
	entered, release := blockWriter(l)
	defer release()
	go func() { _ = l.Write(context.Background(), mcp(DecisionAllowed)) }()
	<-entered
	if err := l.Enqueue(mcp(DecisionAllowed), mcp(DecisionAllowed)); err != nil {
		t.Fatal(err)
	}
	admitted := make(chan error, 1)
	go func() { admitted <- l.Enqueue(mcp(DecisionAllowed)) }()
	select {
	case err := <-admitted:
		t.Fatalf("Enqueue into a full queue returned at once (%v), want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-admitted; err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := count(t, path, "mcp_calls"); got != 4 {
		t.Fatalf("rows = %d, want 4", got)
	}
}

func TestCloseFlushesEnqueued(t *testing.T) {
	path := tempDB(t)
	l, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 600
	for i := range n {
		var r Row
		switch i % 6 {
		case 0:
			r = mcp(DecisionAllowed)
		case 1:
			r = &NetEvent{Domain: "d"}
		case 2:
			r = &ExecEvent{Command: "c"}
		case 3:
			r = &FSEvent{Operation: "read", Path: "/p"}
		case 4:
			r = &ModelCall{Provider: "p"}
		case 5:
			r = &DNSEvent{Name: "n", RCode: "NOERROR", Decision: "allowed"}
		}
		if err := l.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, tbl := range allTables {
		if got := count(t, path, tbl); got != n/6 {
			t.Errorf("%s has %d rows after Close, want %d", tbl, got, n/6)
		}
	}
}

func TestWriteAfterCloseErrors(t *testing.T) {
	l, err := Open(context.Background(), tempDB(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := l.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Write(context.Background(), mcp(DecisionAllowed)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Write after Close = %v, want ErrClosed", err)
	}
	if err := l.Enqueue(mcp(DecisionAllowed)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Enqueue after Close = %v, want ErrClosed", err)
	}
}

func TestCloseStopsWriter(t *testing.T) {
	before := runtime.NumGoroutine()
	l, err := Open(context.Background(), tempDB(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if err := l.Write(context.Background(), mcp(DecisionAllowed)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.writerDone:
	default:
		t.Fatal("writer goroutine still running after Close")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFailedTransactionReportedToEveryWaiter(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	entered, release := blockWriter(l)
	go func() { _ = l.Write(context.Background(), mcp(DecisionAllowed)) }()
	<-entered

	boom := errors.New("disk on fire")
	const waiters = 8
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- l.Write(context.Background(), mcp(DecisionAllowed)) }()
	}
	waitQueued(t, l, waiters)
	// From now on every transaction fails, as a broken file would.
	l.mu.Lock()
	l.testHookBeforeCommit = func(int) error { return boom }
	l.mu.Unlock()
	release()
	for range waiters {
		if err := <-errs; !errors.Is(err, boom) {
			t.Errorf("waiter got %v, want %v", err, boom)
		}
	}
	if got := count(t, path, "mcp_calls"); got != 1 {
		t.Errorf("rows = %d, want only the first", got)
	}
	if st := l.Stats(); st.FailedRows != waiters {
		t.Errorf("FailedRows = %d, want %d", st.FailedRows, waiters)
	}
}

func TestBatchFailureRetriesEachWriteAlone(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	entered, release := blockWriter(l)
	go func() { _ = l.Write(context.Background(), mcp(DecisionAllowed)) }()
	<-entered

	const waiters = 5
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- l.Write(context.Background(), mcp(DecisionAllowed)) }()
	}
	waitQueued(t, l, waiters)
	// Fail only a transaction carrying more than one row.
	l.mu.Lock()
	l.testHookBeforeCommit = func(rows int) error {
		if rows > 1 {
			return errors.New("poisoned batch")
		}
		return nil
	}
	l.mu.Unlock()
	release()
	for range waiters {
		if err := <-errs; err != nil {
			t.Errorf("waiter got %v, want nil after the retry", err)
		}
	}
	if got := count(t, path, "mcp_calls"); got != waiters+1 {
		t.Errorf("rows = %d, want %d", got, waiters+1)
	}
}

func waitQueued(t *testing.T, l *Ledger, rows int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		n := l.queuedRows
		l.mu.Unlock()
		if n >= rows {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d rows queued", n, rows)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(notDB, []byte(strings.Repeat("not a database ", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path, want string
	}{
		{"empty path", "", "empty path"},
		{"missing directory", filepath.Join(dir, "nope", "session.db"), "no such file or directory"},
		{"not a database", notDB, "not a database"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Open(context.Background(), tt.path, Options{})
			if err == nil {
				_ = l.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// Callers that become runnable together share a commit even on one P: the
// first one's wake-up readies the writer to run next, and the writer lets
// the others queue their rows before it commits (without that yield, each
// such caller committed alone: 1.1 rows per commit in the parallel
// benchmark at -cpu 1, 28 with it).
func TestRunnableCallersShareACommitOnOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	l := openLedger(t, tempDB(t), Options{})
	ctx := context.Background()
	const rounds, callers = 10, 16
	before := l.Stats()
	for range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if err := l.Write(ctx, &MCPCall{ServerName: "s", Method: "tools/call", Decision: DecisionAllowed}); err != nil {
					t.Error(err)
				}
			}()
		}
		runtime.Gosched() // let them all reach the start line
		close(start)
		wg.Wait()
	}
	st := l.Stats()
	rows, commits := st.Rows-before.Rows, st.Commits-before.Commits
	if rows != rounds*callers {
		t.Fatalf("%d rows committed, want %d", rows, rounds*callers)
	}
	if commits > 3*rounds {
		t.Fatalf("%d commits for %d rounds of %d callers readied together: they did not share commits", commits, rounds, callers)
	}
	t.Logf("%d rows in %d commits", rows, commits)
}
