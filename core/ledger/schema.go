package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// SchemaVersion is stored in PRAGMA user_version. Open refuses a file with a
// larger value: an older binary must not write rows into tables whose meaning
// it does not know. Version 2 indexes mcp_calls on time and set trace ids
// only (see mcpCallsV1Indexes). Version 3 adds mcp_calls.pending and makes
// event_id unique (a call is recorded pending before it is dispatched and
// completed in the same row by its answer: MCPCall.Pending), and adds the
// whole request's and response's digests. Version 4 records commands and
// file operations the way MCP calls are: exec_events.pending (a command is
// recorded before it starts, completed in the same row when it ends) with
// a unique event_id, and fs_events names its column operation (was
// action) and adds direction, digest, outcome and error_message. Version 5
// records the guest's network: net_events gains ip, source (who connected:
// the guest or the builtin tools), policy_source and the seed's name for decision, action
// (a generated column, so the two can never disagree), and dns_events
// holds every query the guest's resolver answered.
const SchemaVersion = 5

// mcpCallsV1Indexes are the version-1 mcp_calls indexes that version 2 drops
// (the trace id index comes back partial). Every MCP answer waits for its
// row's commit, and each index is one more page written per commit: with
// server_name and tool_name indexed, and every row without a trace id
// filed in the trace id index, a lone row's commit took 91 µs here; with
// them gone 60 µs (BenchmarkWriteMCPCallSingle; group commits per row 18.5
// -> 11.8 µs). A session's ledger is small enough that filtering by server
// or tool scans it quickly, and a lookup by trace id (trace_id = ?) uses the
// partial index.
var mcpCallsV1Indexes = []string{"idx_mcp_calls_server_name", "idx_mcp_calls_tool_name", "idx_mcp_calls_trace_id"}

// mcpCallsV3Columns are the mcp_calls columns version 3 adds to older
// files, as their DDL.
var mcpCallsV3Columns = []string{"pending INTEGER NOT NULL DEFAULT 0", "request_digest TEXT", "response_digest TEXT"}

// v4Columns are the columns version 4 adds to older files, per table.
var v4Columns = []struct{ table, ddl string }{
	{"exec_events", "pending INTEGER NOT NULL DEFAULT 0"},
	{"fs_events", "direction TEXT"},
	{"fs_events", "digest TEXT"},
	{"fs_events", "outcome TEXT"},
	{"fs_events", "error_message TEXT"},
}

// v5Columns are the columns version 5 adds to older files, per table.
var v5Columns = []struct{ table, ddl string }{
	{"net_events", "ip TEXT"},
	{"net_events", "source TEXT"},
	{"net_events", "policy_source TEXT"},
	{"net_events", "action TEXT GENERATED ALWAYS AS (decision) VIRTUAL"},
}

// tableID indexes the per-table prepared statements.
type tableID int

const (
	tableMCPCalls tableID = iota
	tableNetEvents
	tableExecEvents
	tableFSEvents
	tableModelCalls
	tableDNSEvents
	numTables
)

// tableDef is one ledger table. The DDL is written out literally (not
// generated from the Go structs) because the schema is a contract with every
// reader of session.db, and a literal is what a reviewer needs to see. The
// INSERT column list is derived from the row type's fields(), and a test
// checks the two agree.
type tableDef struct {
	name    string
	create  string
	indexes []string
}

var tables = [numTables]tableDef{
	tableMCPCalls: {
		name: "mcp_calls",
		create: `CREATE TABLE IF NOT EXISTS mcp_calls (
	id INTEGER PRIMARY KEY,
	event_id TEXT NOT NULL,
	timestamp TEXT NOT NULL,
	trace_id TEXT,
	server_name TEXT,
	method TEXT,
	tool_name TEXT,
	request_id TEXT,
	request_preview TEXT,
	response_preview TEXT,
	decision TEXT NOT NULL CHECK (decision IN ('allowed', 'warned', 'denied', 'error')),
	duration_ms INTEGER NOT NULL DEFAULT 0,
	error_message TEXT,
	error_code INTEGER,
	process_name TEXT,
	bytes_sent INTEGER NOT NULL DEFAULT 0,
	bytes_received INTEGER NOT NULL DEFAULT 0,
	policy_mode TEXT,
	policy_action TEXT,
	policy_rule TEXT,
	policy_reason TEXT,
	stream_id INTEGER,
	transport TEXT,
	pending INTEGER NOT NULL DEFAULT 0,
	request_digest TEXT,
	response_digest TEXT
)`,
		indexes: []string{
			`CREATE UNIQUE INDEX IF NOT EXISTS idx_mcp_calls_event_id ON mcp_calls(event_id)`,
			`CREATE INDEX IF NOT EXISTS idx_mcp_calls_timestamp ON mcp_calls(timestamp)`,
			`CREATE INDEX IF NOT EXISTS idx_mcp_calls_trace_id ON mcp_calls(trace_id) WHERE trace_id IS NOT NULL`,
		},
	},
	tableNetEvents: {
		name: "net_events",
		create: `CREATE TABLE IF NOT EXISTS net_events (
	id INTEGER PRIMARY KEY,
	event_id TEXT NOT NULL,
	timestamp TEXT NOT NULL,
	trace_id TEXT,
	domain TEXT,
	port INTEGER NOT NULL DEFAULT 443,
	decision TEXT,
	process_name TEXT,
	pid INTEGER NOT NULL DEFAULT 0,
	method TEXT,
	path TEXT,
	query TEXT,
	status_code INTEGER NOT NULL DEFAULT 0,
	bytes_sent INTEGER NOT NULL DEFAULT 0,
	bytes_received INTEGER NOT NULL DEFAULT 0,
	duration_ms INTEGER NOT NULL DEFAULT 0,
	matched_rule TEXT,
	error_message TEXT,
	request_headers TEXT,
	response_headers TEXT,
	request_body_preview TEXT,
	response_body_preview TEXT,
	conn_type TEXT NOT NULL DEFAULT 'https',
	policy_mode TEXT,
	policy_action TEXT,
	policy_rule TEXT,
	policy_reason TEXT,
	ip TEXT,
	source TEXT,
	policy_source TEXT,
	action TEXT GENERATED ALWAYS AS (decision) VIRTUAL
)`,
		indexes: []string{
			`CREATE INDEX IF NOT EXISTS idx_net_events_timestamp ON net_events(timestamp)`,
			`CREATE INDEX IF NOT EXISTS idx_net_events_trace_id ON net_events(trace_id)`,
			`CREATE INDEX IF NOT EXISTS idx_net_events_domain ON net_events(domain)`,
		},
	},
	tableExecEvents: {
		name: "exec_events",
		create: `CREATE TABLE IF NOT EXISTS exec_events (
	id INTEGER PRIMARY KEY,
	event_id TEXT NOT NULL,
	timestamp TEXT NOT NULL,
	trace_id TEXT,
	exec_id TEXT,
	command TEXT,
	exit_code INTEGER,
	duration_ms INTEGER NOT NULL DEFAULT 0,
	stdout_preview TEXT,
	stderr_preview TEXT,
	stdout_bytes INTEGER NOT NULL DEFAULT 0,
	stderr_bytes INTEGER NOT NULL DEFAULT 0,
	truncated INTEGER NOT NULL DEFAULT 0 CHECK (truncated IN (0, 1)),
	timed_out INTEGER NOT NULL DEFAULT 0 CHECK (timed_out IN (0, 1)),
	source TEXT NOT NULL DEFAULT 'api',
	process_name TEXT,
	pid INTEGER NOT NULL DEFAULT 0,
	pending INTEGER NOT NULL DEFAULT 0
)`,
		indexes: []string{
			`CREATE UNIQUE INDEX IF NOT EXISTS idx_exec_events_event_id ON exec_events(event_id)`,
			`CREATE INDEX IF NOT EXISTS idx_exec_events_timestamp ON exec_events(timestamp)`,
			`CREATE INDEX IF NOT EXISTS idx_exec_events_trace_id ON exec_events(trace_id)`,
			`CREATE INDEX IF NOT EXISTS idx_exec_events_exec_id ON exec_events(exec_id)`,
		},
	},
	tableFSEvents: {
		name: "fs_events",
		create: `CREATE TABLE IF NOT EXISTS fs_events (
	id INTEGER PRIMARY KEY,
	event_id TEXT NOT NULL,
	timestamp TEXT NOT NULL,
	trace_id TEXT,
	operation TEXT NOT NULL,
	path TEXT NOT NULL,
	size INTEGER NOT NULL DEFAULT 0,
	direction TEXT,
	digest TEXT,
	outcome TEXT,
	error_message TEXT
)`,
		indexes: []string{
			`CREATE INDEX IF NOT EXISTS idx_fs_events_timestamp ON fs_events(timestamp)`,
			`CREATE INDEX IF NOT EXISTS idx_fs_events_trace_id ON fs_events(trace_id)`,
			`CREATE INDEX IF NOT EXISTS idx_fs_events_path ON fs_events(path)`,
		},
	},
	tableModelCalls: {
		name: "model_calls",
		create: `CREATE TABLE IF NOT EXISTS model_calls (
	id INTEGER PRIMARY KEY,
	event_id TEXT NOT NULL,
	timestamp TEXT NOT NULL,
	trace_id TEXT,
	provider TEXT,
	model TEXT,
	process_name TEXT,
	request_bytes INTEGER NOT NULL DEFAULT 0,
	response_bytes INTEGER NOT NULL DEFAULT 0,
	input_tokens INTEGER NOT NULL DEFAULT 0,
	output_tokens INTEGER NOT NULL DEFAULT 0,
	duration_ms INTEGER NOT NULL DEFAULT 0,
	status_code INTEGER NOT NULL DEFAULT 0
)`,
		indexes: []string{
			`CREATE INDEX IF NOT EXISTS idx_model_calls_timestamp ON model_calls(timestamp)`,
			`CREATE INDEX IF NOT EXISTS idx_model_calls_trace_id ON model_calls(trace_id)`,
			`CREATE INDEX IF NOT EXISTS idx_model_calls_provider ON model_calls(provider, timestamp)`,
		},
	},
	tableDNSEvents: {
		name: "dns_events",
		create: `CREATE TABLE IF NOT EXISTS dns_events (
	id INTEGER PRIMARY KEY,
	event_id TEXT NOT NULL,
	timestamp TEXT NOT NULL,
	trace_id TEXT,
	name TEXT,
	qtype TEXT,
	answers TEXT,
	rcode TEXT NOT NULL,
	decision TEXT NOT NULL CHECK (decision IN ('allowed', 'denied', 'error')),
	server TEXT,
	duration_ms INTEGER NOT NULL DEFAULT 0,
	policy_rule TEXT,
	policy_source TEXT,
	policy_reason TEXT
)`,
		indexes: []string{
			`CREATE INDEX IF NOT EXISTS idx_dns_events_timestamp ON dns_events(timestamp)`,
			`CREATE INDEX IF NOT EXISTS idx_dns_events_trace_id ON dns_events(trace_id)`,
			`CREATE INDEX IF NOT EXISTS idx_dns_events_name ON dns_events(name)`,
		},
	},
}

// insertSQL is built from each row type's field list so the column order and
// the argument order cannot drift apart.
var insertSQL = [numTables]string{
	tableMCPCalls:   buildInsert(tableMCPCalls, (&MCPCall{}).fields()),
	tableNetEvents:  buildInsert(tableNetEvents, (&NetEvent{}).fields()),
	tableExecEvents: buildInsert(tableExecEvents, (&ExecEvent{}).fields()),
	tableFSEvents:   buildInsert(tableFSEvents, (&FSEvent{}).fields()),
	tableModelCalls: buildInsert(tableModelCalls, (&ModelCall{}).fields()),
	tableDNSEvents:  buildInsert(tableDNSEvents, (&DNSEvent{}).fields()),
}

func buildInsert(t tableID, fs []field) string {
	names := make([]string, len(fs))
	marks := make([]string, len(fs))
	var sets []string
	for i, f := range fs {
		names[i] = f.name
		marks[i] = "?"
		if f.name != "event_id" {
			sets = append(sets, f.name+" = excluded."+f.name)
		}
	}
	insert := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)",
		tables[t].name, strings.Join(names, ", "), strings.Join(marks, ", "))
	if t == tableMCPCalls || t == tableExecEvents {
		// A call's answer (a command's end) completes the row its pending
		// record started (same event_id): one row per call, whatever
		// happened between.
		insert += " ON CONFLICT(event_id) DO UPDATE SET " + strings.Join(sets, ", ")
	}
	return insert
}

// migrate creates the schema, or brings a version-1 file to this version.
// Every statement is idempotent, so reopening a file of the current version
// is a no-op; a newer version is refused.
func migrate(ctx context.Context, db *sql.DB, path string) error {
	var version int
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("ledger: read schema version of %s: %w", path, err)
	}
	if version > SchemaVersion {
		return fmt.Errorf("ledger: %s has schema version %d, newer than the %d this build supports; use a newer capsem to write to it",
			path, version, SchemaVersion)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: begin schema transaction on %s: %w", path, err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if version >= 1 && version < 3 {
		for _, col := range mcpCallsV3Columns {
			name, _, _ := strings.Cut(col, " ")
			var has int
			if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM pragma_table_info('mcp_calls') WHERE name = ?", name).Scan(&has); err != nil {
				return fmt.Errorf("ledger: read the columns of mcp_calls in %s: %w", path, err)
			}
			if has > 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx, "ALTER TABLE mcp_calls ADD COLUMN "+col); err != nil {
				return fmt.Errorf("ledger: add mcp_calls.%s in %s: %w", name, path, err)
			}
		}
	}
	if version >= 1 && version < 4 {
		if err := migrateV4(ctx, tx, path); err != nil {
			return err
		}
	}
	if version >= 1 && version < 5 {
		if err := addColumns(ctx, tx, path, v5Columns); err != nil {
			return err
		}
	}
	if version == 1 {
		for _, idx := range mcpCallsV1Indexes {
			if _, err := tx.ExecContext(ctx, "DROP INDEX IF EXISTS "+idx); err != nil {
				return fmt.Errorf("ledger: drop version-1 index %s in %s: %w", idx, path, err)
			}
		}
	}
	for _, t := range tables {
		stmts := append([]string{t.create}, t.indexes...)
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("ledger: create %s in %s: %w", t.name, path, err)
			}
		}
	}
	// PRAGMA does not take bound parameters; the value is our own constant.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion)); err != nil {
		return fmt.Errorf("ledger: set schema version of %s: %w", path, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: commit schema of %s: %w", path, err)
	}
	return nil
}

// migrateV4 brings a version 1-3 file's exec_events and fs_events to
// version 4: the new columns, and fs_events.action renamed operation.
func migrateV4(ctx context.Context, tx *sql.Tx, path string) error {
	has := func(table, column string) (bool, error) {
		var n int
		err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?", table, column).Scan(&n)
		if err != nil {
			return false, fmt.Errorf("ledger: read the columns of %s in %s: %w", table, path, err)
		}
		return n > 0, nil
	}
	if old, err := has("fs_events", "action"); err != nil {
		return err
	} else if old {
		if _, err := tx.ExecContext(ctx, "ALTER TABLE fs_events RENAME COLUMN action TO operation"); err != nil {
			return fmt.Errorf("ledger: rename fs_events.action in %s: %w", path, err)
		}
	}
	return addColumns(ctx, tx, path, v4Columns)
}

// addColumns adds each column its table lacks. pragma_table_xinfo lists
// generated columns too.
func addColumns(ctx context.Context, tx *sql.Tx, path string, cols []struct{ table, ddl string }) error {
	for _, c := range cols {
		name, _, _ := strings.Cut(c.ddl, " ")
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM pragma_table_xinfo(?) WHERE name = ?", c.table, name).Scan(&n); err != nil {
			return fmt.Errorf("ledger: read the columns of %s in %s: %w", c.table, path, err)
		}
		if n > 0 {
			continue
		}
		if _, err := tx.ExecContext(ctx, "ALTER TABLE "+c.table+" ADD COLUMN "+c.ddl); err != nil {
			return fmt.Errorf("ledger: add %s.%s in %s: %w", c.table, name, path, err)
		}
	}
	return nil
}
