//go:build cgo

package ledger

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// seeded returns a ledger path holding n mcp_calls rows, with the writer
// still open (as during a live session).
func seeded(t *testing.T, n int) string {
	t.Helper()
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	rows := make([]Row, n)
	for i := range rows {
		rows[i] = mcp(DecisionAllowed)
	}
	if err := l.Write(context.Background(), rows...); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestQueryRefusesWrites(t *testing.T) {
	path := seeded(t, 3)
	dir := filepath.Dir(path)
	attached := filepath.Join(dir, "other.db")
	vacuumed := filepath.Join(dir, "copy.db")
	tests := []struct {
		name, sql, want string
	}{
		{"insert", "INSERT INTO mcp_calls (event_id, timestamp, decision) VALUES ('a', 'b', 'allowed')", `got "INSERT"`},
		{"update", "UPDATE mcp_calls SET decision = 'denied'", `got "UPDATE"`},
		{"delete", "DELETE FROM mcp_calls", `got "DELETE"`},
		{"drop", "DROP TABLE mcp_calls", `got "DROP"`},
		{"create", "CREATE TABLE x (a)", `got "CREATE"`},
		{"attach", "ATTACH DATABASE '" + attached + "' AS other", `got "ATTACH"`},
		{"vacuum into", "VACUUM INTO '" + vacuumed + "'", `got "VACUUM"`},
		{"begin", "BEGIN", `got "BEGIN"`},
		{"lower-case insert", "insert into mcp_calls default values", `got "INSERT"`},
		{"comment-hidden insert", "/* SELECT */ INSERT INTO mcp_calls DEFAULT VALUES", `got "INSERT"`},
		{"cte insert", "WITH x AS (SELECT 1) INSERT INTO mcp_calls (event_id, timestamp, decision) SELECT 'a', 'b', 'allowed' FROM x", "INSERT into mcp_calls is not allowed"},
		{"cte delete", "WITH x AS (SELECT 1) DELETE FROM mcp_calls", "DELETE from mcp_calls is not allowed"},
		{"cte update", "WITH x AS (SELECT 1) UPDATE mcp_calls SET method = 'x'", "UPDATE of mcp_calls is not allowed"},
		{"pragma journal_mode", "PRAGMA journal_mode", "PRAGMA journal_mode is not allowed"},
		{"pragma journal_mode set", "PRAGMA journal_mode=DELETE", "PRAGMA journal_mode = DELETE is not allowed"},
		{"pragma journal_mode set spaced", "PRAGMA journal_mode = delete", "PRAGMA journal_mode = delete is not allowed"},
		{"pragma query_only off", "PRAGMA query_only = 0", "PRAGMA query_only = 0 is not allowed"},
		{"pragma user_version set", "PRAGMA user_version = 9", "PRAGMA user_version = 9 is not allowed"},
		{"pragma writable_schema", "PRAGMA writable_schema = ON", "writable_schema"},
		{"pragma wal_checkpoint", "PRAGMA wal_checkpoint(TRUNCATE)", "wal_checkpoint"},
		{"load_extension", "SELECT load_extension('/tmp/evil.so')", "load_extension() is not allowed"},
		{"multiple statements", "SELECT 1; DELETE FROM mcp_calls", "only one statement"},
		{"multiple selects", "SELECT 1; SELECT 2", "only one statement"},
		{"statement after comment", "SELECT 1; -- hi\nDROP TABLE mcp_calls", "only one statement"},
		{"nul byte", "SELECT 1\x00; DROP TABLE mcp_calls", "NUL byte"},
		{"empty", "  -- nothing\n /* at all */ ", "query is empty"},
		{"lone semicolon", ";", "empty statement"},
		{"parameters", "SELECT * FROM mcp_calls WHERE id = ?", "bound parameter"},
		{"syntax error", "SELECT FROM WHERE", "invalid SQL"},
		{"no such table", "SELECT * FROM nope", "no such table"},
		{"huge value", "SELECT zeroblob(100000000)", "too big"},
		{"huge string", "SELECT printf('%.*c', 100000000, 'x')", "too big"},
		{"too long", "SELECT " + strings.Repeat("1+", MaxQueryBytes) + "1", "over the"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Query(context.Background(), path, tt.sql, testLimits(10, 5*time.Second))
			if err == nil {
				t.Fatalf("Query(%q) succeeded, want refusal", tt.sql)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Query(%q) err = %v, want it to contain %q", tt.sql, err, tt.want)
			}
		})
	}
	// Nothing changed.
	if got := count(t, path, "mcp_calls"); got != 3 {
		t.Errorf("mcp_calls has %d rows, want 3", got)
	}
	if got := journalMode(t, path); got != "wal" {
		t.Errorf("journal_mode = %v", got)
	}
	if got := queryAll(t, path, "PRAGMA user_version")[0][0]; got != int64(SchemaVersion) {
		t.Errorf("user_version = %v", got)
	}
	for _, p := range []string{attached, vacuumed} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists (err %v)", p, err)
		}
	}
}

// TestAuthorizer checks the second layer on its own, for actions the text
// check would already stop.
func TestAuthorizer(t *testing.T) {
	tests := []struct {
		op         int
		arg1, arg2 string
		allowed    bool
	}{
		{sqlite3.SQLITE_SELECT, "", "", true},
		{sqlite3.SQLITE_READ, "mcp_calls", "decision", true},
		{sqliteRecursive, "", "", true},
		{sqlite3.SQLITE_FUNCTION, "", "count", true},
		{sqlite3.SQLITE_PRAGMA, "table_info", "mcp_calls", true},
		{sqlite3.SQLITE_PRAGMA, "USER_VERSION", "", true},
		{sqlite3.SQLITE_PRAGMA, "user_version", "3", false},
		{sqlite3.SQLITE_PRAGMA, "query_only", "", false},
		{sqlite3.SQLITE_ATTACH, "x", "", false},
		{sqlite3.SQLITE_INSERT, "mcp_calls", "", false},
		{sqlite3.SQLITE_TRANSACTION, "BEGIN", "", false},
		{sqlite3.SQLITE_CREATE_TABLE, "t", "", false},
		{sqlite3.SQLITE_CREATE_TEMP_TABLE, "t", "", false},
		{sqlite3.SQLITE_CREATE_VTABLE, "t", "fts5", false},
		{999, "", "", false},
	}
	for _, tt := range tests {
		why := authorize(tt.op, tt.arg1, tt.arg2)
		if (why == "") != tt.allowed {
			t.Errorf("authorize(%d, %q, %q) = %q, want allowed=%v", tt.op, tt.arg1, tt.arg2, why, tt.allowed)
		}
	}
}

func TestQueryAllowsReads(t *testing.T) {
	path := seeded(t, 3)
	tests := []struct {
		name, sql string
		wantCols  []string
		wantRows  int
	}{
		{"select", "SELECT decision, count(*) AS n FROM mcp_calls GROUP BY decision", []string{"decision", "n"}, 1},
		{"trailing semicolon and comments", "-- head\nSELECT id FROM mcp_calls; /* tail */ -- more\n", []string{"id"}, 3},
		{"semicolon inside string", "SELECT 'a;b' AS s, \"method\" FROM mcp_calls WHERE method != 'x;y'", []string{"s", "method"}, 3},
		{"quoted identifier with escaped quote", `SELECT 1 AS "a""; b"`, []string{`a"; b`}, 1},
		{"with", "WITH t(x) AS (SELECT 2) SELECT x FROM t", []string{"x"}, 1},
		{"recursive cte", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 5) SELECT x FROM c", []string{"x"}, 5},
		{"values", "VALUES (1, 'a'), (2, 'b')", []string{"column1", "column2"}, 2},
		{"pragma table_info", "PRAGMA table_info(mcp_calls)", nil, 26},
		{"pragma function", "SELECT name FROM pragma_table_info('fs_events')", []string{"name"}, 11},
		{"pragma user_version", "pragma user_version", []string{"user_version"}, 1},
		{"explain", "EXPLAIN QUERY PLAN SELECT * FROM mcp_calls WHERE trace_id = 'x'", nil, 1},
		{"empty result", "SELECT * FROM net_events", nil, 0},
		{"json", "SELECT json_extract('{\"a\":1}', '$.a')", nil, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Query(context.Background(), path, tt.sql, testLimits(100, 5*time.Second))
			if err != nil {
				t.Fatalf("Query: %v", err)
			}
			if res.Stopped != "" || res.CutCells != 0 {
				t.Errorf("truncated: %q, %d cells cut", res.Stopped, res.CutCells)
			}
			cols, rows := res.Columns, res.Rows
			if tt.wantCols != nil && strings.Join(cols, ",") != strings.Join(tt.wantCols, ",") {
				t.Errorf("columns = %q, want %q", cols, tt.wantCols)
			}
			if len(rows) != tt.wantRows {
				t.Errorf("%d rows, want %d: %v", len(rows), tt.wantRows, rows)
			}
			if cols == nil {
				t.Error("columns is nil")
			}
		})
	}
}

func TestQueryMaxRows(t *testing.T) {
	path := seeded(t, 10)
	tests := []struct {
		max       int
		wantRows  int
		truncated bool
	}{
		{1, 1, true},
		{3, 3, true},
		{9, 9, true},
		{10, 10, false},
		{11, 10, false},
	}
	for _, tt := range tests {
		res, err := Query(context.Background(), path, "SELECT id FROM mcp_calls ORDER BY id", testLimits(tt.max, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		rows, truncated := res.Rows, res.Stopped == StoppedRows
		if len(rows) != tt.wantRows || truncated != tt.truncated {
			t.Errorf("maxRows %d: %d rows truncated=%v, want %d truncated=%v", tt.max, len(rows), truncated, tt.wantRows, tt.truncated)
		}
	}
	// An endless result stops at the limit instead of running forever.
	res, err := Query(context.Background(), path,
		"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c", testLimits(5, 5*time.Second))
	if err != nil || len(res.Rows) != 5 || res.Stopped != StoppedRows {
		t.Fatalf("endless rows: %d rows stopped=%q err=%v", len(res.Rows), res.Stopped, err)
	}
}

func TestQueryTimeoutInterrupts(t *testing.T) {
	path := seeded(t, 1)
	tests := []struct{ name, sql string }{
		// Never yields a row: the interrupt must stop the first step.
		{"aggregate over endless cte", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT count(*) FROM c"},
		// Yields no row either, but scans forever.
		{"filter never matches", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x FROM c WHERE x < 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const limit = 200 * time.Millisecond
			start := time.Now()
			_, err := Query(context.Background(), path, tt.sql, testLimits(10, limit))
			elapsed := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want DeadlineExceeded", err)
			}
			if !strings.Contains(err.Error(), "time limit") {
				t.Errorf("err = %v, want it to name the time limit", err)
			}
			if elapsed > 10*time.Second {
				t.Errorf("took %v to interrupt a %v query", elapsed, limit)
			}
		})
	}
	// The caller's own context also interrupts.
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := Query(ctx, path, tests[0].sql, testLimits(10, time.Hour))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled query: err = %v, want context.Canceled", err)
	}
}

func TestQueryArguments(t *testing.T) {
	path := seeded(t, 1)
	tests := []struct {
		name    string
		path    string
		maxRows int
		timeout time.Duration
		want    string
	}{
		{"zero rows", path, 0, time.Second, "row limit must be positive"},
		{"zero timeout", path, 1, 0, "timeout must be positive"},
		{"missing file", filepath.Join(t.TempDir(), "nope.db"), 1, time.Second, "no such file"},
		{"empty path", "", 1, time.Second, "empty path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Query(context.Background(), tt.path, "SELECT 1", testLimits(tt.maxRows, tt.timeout))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := Schema(context.Background(), filepath.Join(t.TempDir(), "nope.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Schema of a missing file: %v", err)
	}
}

func TestQueryAfterCloseAndDuringWrites(t *testing.T) {
	path := tempDB(t)
	l, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	wrote := make(chan struct{}) // closed once the first row is durable
	go func() {
		defer close(done)
		var once sync.Once
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := l.Write(context.Background(), mcp(DecisionAllowed)); err != nil {
				t.Error(err)
				return
			}
			once.Do(func() { close(wrote) })
		}
	}()
	for range 20 {
		if _, err := Query(context.Background(), path, "SELECT count(*) FROM mcp_calls", testLimits(1, 5*time.Second)); err != nil {
			t.Fatalf("Query during writes: %v", err)
		}
	}
	// The queries may all have run before the writer's first row: wait
	// for it, or the count below depends on the scheduler.
	select {
	case <-wrote:
	case <-done:
	}
	close(stop)
	<-done
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := count(t, path, "mcp_calls"); n == 0 {
		t.Fatal("no rows")
	}
}

func TestCheckQueryText(t *testing.T) {
	tests := []struct {
		sql string
		ok  bool
	}{
		{"SELECT 1", true},
		{"select 1;", true},
		{"SELECT 1 ; ", true},
		{"SELECT ';' ; -- x", true},
		{"SELECT [a;b] FROM t", true},
		{"SELECT `a;b` FROM t", true},
		{"SELECT 'it''s; fine'", true},
		{"SELECT 1 /* ; */", true},
		{"SELECT 1 /* unterminated ;", true},
		{"SELECT 'unterminated ;", true}, // SQLite will reject it
		{"SELECT 1;;", false},
		{"SELECT 1; SELECT 2", false},
		{"(SELECT 1)", false},
		{"REPLACE INTO t VALUES (1)", false},
		{"", false},
		{"--", false},
	}
	for _, tt := range tests {
		_, err := checkQueryText(tt.sql)
		if (err == nil) != tt.ok {
			t.Errorf("checkQueryText(%q) = %v, want ok=%v", tt.sql, err, tt.ok)
		}
	}
}

// TestAllowedPragmasRun keeps the pragma allowlists honest: each entry must
// pass every layer, including SQLite's own read-only verdict.
func TestAllowedPragmasRun(t *testing.T) {
	path := seeded(t, 1)
	var stmts []string
	for name := range queryPragmas {
		stmts = append(stmts, "PRAGMA "+name)
	}
	for name := range readPragmas {
		stmts = append(stmts, "PRAGMA "+name+"(mcp_calls)")
	}
	for _, q := range stmts {
		if _, err := Query(context.Background(), path, q, testLimits(1000, 5*time.Second)); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
}

// TestReadOnlyConnectionCannotWrite checks the bottom layer alone: even a
// statement that got past every check could not change the file.
func TestReadOnlyConnectionCannotWrite(t *testing.T) {
	path := seeded(t, 1)
	db, conn, err := openReadOnly(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	defer conn.Close()
	for _, q := range []string{
		"DELETE FROM mcp_calls",
		"CREATE TEMP TABLE x (a)",
		"PRAGMA user_version = 7",
	} {
		if _, err := conn.ExecContext(context.Background(), q); err == nil {
			t.Errorf("%s succeeded on the read-only connection", q)
		}
	}
	if got := count(t, path, "mcp_calls"); got != 1 {
		t.Errorf("rows = %d, want 1", got)
	}
}
