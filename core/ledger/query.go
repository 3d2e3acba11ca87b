//go:build cgo

package ledger

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	sqlite3 "github.com/mattn/go-sqlite3"
)

// MaxQueryBytes bounds the SQL text Query accepts.
const MaxQueryBytes = 64 << 10

// MaxQueryValueBytes bounds any string or blob a query may build (SQLite's
// default is 1 GB, e.g. SELECT zeroblob(1e9)); stored values are far smaller.
const MaxQueryValueBytes = 16 << 20

// sqliteRecursive is SQLITE_RECURSIVE (a recursive CTE), which go-sqlite3
// does not export.
const sqliteRecursive = 33

// openReadOnly opens path so that no statement on it can change the file:
// mode=ro makes SQLite open the file O_RDONLY and query_only refuses writes
// even to the connection's temp schema. The caller closes the DB.
func openReadOnly(ctx context.Context, path string) (*sql.DB, *sql.Conn, error) {
	if path == "" {
		return nil, nil, errors.New("ledger: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: resolve %s: %w", path, err)
	}
	// SQLite would report only "unable to open database file".
	if _, err := os.Stat(abs); err != nil {
		return nil, nil, fmt.Errorf("ledger: %w", err)
	}
	params := fmt.Sprintf("mode=ro&_query_only=1&_busy_timeout=%d", DefaultBusyTimeout.Milliseconds())
	db, err := sql.Open("sqlite3", fileURI(abs, params))
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: open %s read-only: %w", abs, err)
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("ledger: open %s read-only: %w", abs, err)
	}
	return db, conn, nil
}

// Schema returns the CREATE TABLE statements of the ledger at path, ordered
// by table name (what capsem_inspect_schema shows).
func Schema(ctx context.Context, path string) ([]string, error) {
	db, conn, err := openReadOnly(ctx, path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	defer conn.Close()
	rows, err := conn.QueryContext(ctx,
		`SELECT sql FROM sqlite_schema WHERE type = 'table' AND sql IS NOT NULL AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("ledger: read schema of %s: %w", path, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("ledger: read schema of %s: %w", path, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: read schema of %s: %w", path, err)
	}
	return out, nil
}

// Query runs one read-only SQL statement against the ledger at path and
// returns at most maxRows rows; truncated reports that more rows existed.
// The statement is interrupted when timeout (or ctx) expires. Values are
// int64, float64, string, []byte or nil.
//
// Writes are made impossible in depth: the file is opened read-only with
// query_only set; the text must be exactly one statement starting with
// SELECT, WITH, VALUES, PRAGMA or EXPLAIN; an authorizer allows only reads,
// reading functions and a list of side-effect-free pragmas (so no ATTACH,
// no PRAGMA assignments, no temp tables); and SQLite must report the
// compiled statement read-only.
func Query(ctx context.Context, path, query string, maxRows int, timeout time.Duration) (columns []string, rows [][]any, truncated bool, err error) {
	if maxRows <= 0 {
		return nil, nil, false, fmt.Errorf("ledger: query row limit must be positive, got %d", maxRows)
	}
	if timeout <= 0 {
		return nil, nil, false, fmt.Errorf("ledger: query timeout must be positive, got %s", timeout)
	}
	if err := checkQueryText(query); err != nil {
		return nil, nil, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	db, conn, err := openReadOnly(ctx, path)
	if err != nil {
		return nil, nil, false, queryErr(ctx, timeout, err)
	}
	defer db.Close()
	defer conn.Close()

	err = conn.Raw(func(dc any) error {
		c, ok := dc.(*sqlite3.SQLiteConn)
		if !ok {
			return fmt.Errorf("ledger: unexpected driver connection %T", dc)
		}
		c.SetLimit(sqlite3.SQLITE_LIMIT_LENGTH, MaxQueryValueBytes)
		// The authorizer runs synchronously inside prepare (and any
		// re-prepare during step) on this goroutine, so refused needs no lock.
		var refused string
		c.RegisterAuthorizer(func(op int, arg1, arg2, _ string) int {
			if why := authorize(op, arg1, arg2); why != "" {
				if refused == "" {
					refused = why
				}
				return sqlite3.SQLITE_DENY
			}
			return sqlite3.SQLITE_OK
		})
		defer c.RegisterAuthorizer(nil)

		st, err := c.PrepareContext(ctx, query)
		if err != nil {
			if refused != "" {
				return fmt.Errorf("ledger: query refused: %s; the ledger is read-only", refused)
			}
			return fmt.Errorf("ledger: invalid SQL: %w", err)
		}
		defer st.Close()
		ss, ok := st.(*sqlite3.SQLiteStmt)
		if !ok {
			return fmt.Errorf("ledger: unexpected driver statement %T", st)
		}
		if !ss.Readonly() {
			return errors.New("ledger: query refused: the statement would modify the database; the ledger is read-only")
		}
		if n := ss.NumInput(); n > 0 {
			return fmt.Errorf("ledger: query refused: it has %d bound parameter(s) (?, :name); write the values into the SQL", n)
		}
		dr, err := ss.QueryContext(ctx, nil)
		if err != nil {
			return err
		}
		defer dr.Close()
		columns = dr.Columns()
		dest := make([]driver.Value, len(columns))
		for {
			if err := dr.Next(dest); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if len(rows) == maxRows {
				truncated = true
				return nil
			}
			row := make([]any, len(dest))
			for i, v := range dest {
				row[i] = v // the driver returns fresh strings and []byte each step
			}
			rows = append(rows, row)
		}
	})
	if err != nil {
		return nil, nil, false, queryErr(ctx, timeout, err)
	}
	if columns == nil {
		columns = []string{}
	}
	return columns, rows, truncated, nil
}

// queryErr names a timeout as such; SQLite itself reports only "interrupted".
func queryErr(ctx context.Context, timeout time.Duration, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return fmt.Errorf("ledger: query interrupted after its %s time limit: %w", timeout, ctxErr)
		}
		return fmt.Errorf("ledger: query interrupted: %w", ctxErr)
	}
	if strings.HasPrefix(err.Error(), "ledger:") {
		return err
	}
	return fmt.Errorf("ledger: query failed: %w", err)
}

// readPragmas are allowed with or without an argument, because their
// argument names an object to describe rather than a value to set.
var readPragmas = map[string]bool{
	"table_info": true, "table_xinfo": true, "table_list": true,
	"index_list": true, "index_info": true, "index_xinfo": true,
	"foreign_key_list": true, "foreign_key_check": true,
	"quick_check": true, "integrity_check": true,
}

// queryPragmas are allowed only without an argument: with one they set.
// journal_mode is absent: SQLite compiles even its query form as a write.
var queryPragmas = map[string]bool{
	"user_version": true, "schema_version": true, "application_id": true,
	"page_count": true, "page_size": true, "freelist_count": true,
	"encoding": true, "data_version": true,
	"database_list": true, "compile_options": true, "function_list": true,
	"pragma_list": true, "collation_list": true, "module_list": true,
}

// authorize returns why an action is refused, or "" to allow it. It is an
// allowlist: anything SQLite adds later is refused by default.
func authorize(op int, arg1, arg2 string) string {
	switch op {
	case sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqliteRecursive:
		return ""
	case sqlite3.SQLITE_FUNCTION:
		// Disabled in go-sqlite3 by default; refused here regardless.
		if strings.EqualFold(arg2, "load_extension") {
			return "load_extension() is not allowed"
		}
		return ""
	case sqlite3.SQLITE_PRAGMA:
		name := strings.ToLower(arg1)
		if readPragmas[name] || (queryPragmas[name] && arg2 == "") {
			return ""
		}
		if arg2 != "" {
			return fmt.Sprintf("PRAGMA %s = %s is not allowed (only reading pragmas)", arg1, arg2)
		}
		return fmt.Sprintf("PRAGMA %s is not allowed", arg1)
	case sqlite3.SQLITE_ATTACH:
		return "ATTACH is not allowed"
	case sqlite3.SQLITE_DETACH:
		return "DETACH is not allowed"
	case sqlite3.SQLITE_INSERT:
		return fmt.Sprintf("INSERT into %s is not allowed", arg1)
	case sqlite3.SQLITE_UPDATE:
		return fmt.Sprintf("UPDATE of %s is not allowed", arg1)
	case sqlite3.SQLITE_DELETE:
		return fmt.Sprintf("DELETE from %s is not allowed", arg1)
	case sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT:
		return "transaction control is not allowed"
	}
	return fmt.Sprintf("operation %d (schema change or other write) is not allowed", op)
}

// allowedFirstWords are the statements Query will even try to compile.
var allowedFirstWords = map[string]bool{
	"SELECT": true, "WITH": true, "VALUES": true, "PRAGMA": true, "EXPLAIN": true,
}

// checkQueryText does what only the text can tell: one statement, not empty,
// a reading verb, no NUL (SQLite would silently stop reading at it). It
// lexes strings, quoted identifiers and comments so a ';' inside them does
// not count. A CREATE TRIGGER body would look like several statements, which
// is fine: it is refused either way.
func checkQueryText(q string) error {
	if len(q) > MaxQueryBytes {
		return fmt.Errorf("ledger: query is %d bytes, over the %d-byte limit", len(q), MaxQueryBytes)
	}
	if strings.IndexByte(q, 0) >= 0 {
		return errors.New("ledger: query contains a NUL byte")
	}
	var first string
	sawToken, ended := false, false
	for i := 0; i < len(q); {
		c := q[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
			continue
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			if j := strings.IndexByte(q[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(q)
			}
			continue
		case c == '/' && i+1 < len(q) && q[i+1] == '*':
			if j := strings.Index(q[i+2:], "*/"); j >= 0 {
				i += j + 4
			} else {
				i = len(q)
			}
			continue
		}
		if ended {
			return errors.New("ledger: query refused: only one statement is allowed (text follows the first ';')")
		}
		if c == ';' {
			if !sawToken {
				return errors.New("ledger: query refused: empty statement before ';'")
			}
			ended = true
			i++
			continue
		}
		if !sawToken {
			sawToken = true
			j := i
			for j < len(q) && isWordByte(q[j]) {
				j++
			}
			first = strings.ToUpper(q[i:j])
			if !allowedFirstWords[first] {
				if first == "" {
					first = string(c)
				}
				return fmt.Errorf("ledger: query refused: only SELECT, WITH, VALUES, PRAGMA or EXPLAIN statements are allowed, got %q", capString(first, 32))
			}
			i = j
			continue
		}
		switch c {
		case '\'', '"', '`':
			i = skipQuoted(q, i, c)
		case '[':
			if j := strings.IndexByte(q[i:], ']'); j >= 0 {
				i += j + 1
			} else {
				i = len(q)
			}
		default:
			i++
		}
	}
	if !sawToken {
		return errors.New("ledger: query is empty")
	}
	return nil
}

// skipQuoted returns the index after the quoted token starting at q[i];
// a doubled quote character is an escaped quote.
func skipQuoted(q string, i int, quote byte) int {
	for j := i + 1; j < len(q); j++ {
		if q[j] == quote {
			if j+1 < len(q) && q[j+1] == quote {
				j++
				continue
			}
			return j + 1
		}
	}
	return len(q)
}

func isWordByte(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
