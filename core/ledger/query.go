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
	"sync"
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
// returns its answer, bounded by lim: rows past lim.MaxRows or past
// lim.MaxAnswerBytes are left out (Stopped), and a text or blob longer than
// a cell may hold is cut to a prefix (CutValue). A SELECT, WITH or VALUES
// statement is run inside one that cuts its long values in SQLite, so that
// no whole value is copied out of it; the values of PRAGMA and EXPLAIN are
// short, and cut after. The statement is interrupted when lim.Timeout (or
// ctx) expires, and fails with a clear error when it needs more than
// lim.MaxMemoryBytes.
//
// Writes are made impossible in depth: the file is opened read-only with
// query_only set; the text must be exactly one statement starting with
// SELECT, WITH, VALUES, PRAGMA or EXPLAIN; an authorizer allows only reads,
// reading functions and a list of side-effect-free pragmas (so no ATTACH,
// no PRAGMA assignments, no temp tables); and SQLite must report the
// compiled statement read-only.
func Query(ctx context.Context, path, query string, lim QueryLimits) (QueryResult, error) {
	if err := lim.check(); err != nil {
		return QueryResult{}, err
	}
	text, err := checkQueryText(query)
	if err != nil {
		return QueryResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, lim.Timeout)
	defer cancel()

	db, conn, err := openReadOnly(ctx, path)
	if err != nil {
		return QueryResult{}, queryErr(ctx, lim.Timeout, lim.MaxMemoryBytes, err)
	}
	defer db.Close()
	defer conn.Close()

	// The limit is SQLite's, for the whole process: set on every query, it
	// is in force wherever Query runs.
	tuneAllocator.Do(returnLargeAllocations)
	if _, err := conn.ExecContext(ctx, fmt.Sprintf("PRAGMA hard_heap_limit = %d", lim.MaxMemoryBytes)); err != nil {
		return QueryResult{}, queryErr(ctx, lim.Timeout, lim.MaxMemoryBytes, fmt.Errorf("ledger: bounding SQLite's memory: %w", err))
	}

	var res QueryResult
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

		columns, err := statementColumns(ctx, c, query, &refused)
		if err != nil {
			return err
		}
		res.Columns = columns
		bound := lim.cellBound(len(columns))
		stmt, cutInSQL := query, text.selects && len(columns) > 0
		if cutInSQL {
			stmt = cuttingStatement(text.body, len(columns), bound)
		}
		ss, err := prepareChecked(ctx, c, stmt, &refused)
		if err != nil {
			return err
		}
		defer ss.Close()
		dr, err := ss.QueryContext(ctx, nil)
		if err != nil {
			return err
		}
		defer dr.Close()
		dest := make([]driver.Value, len(dr.Columns()))
		// The answer's frame: {"columns":[...],"rows":[...]} and the flags.
		size := 64
		for _, name := range columns {
			size += jsonStringLen(name) + 1
		}
		for {
			if err := dr.Next(dest); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if len(res.Rows) == lim.MaxRows {
				res.Stopped = StoppedRows
				return nil
			}
			row := make([]any, len(columns))
			rowSize, cut := 2, 0
			for i := range row {
				v, whole := dest[i], int64(-1)
				if cutInSQL {
					v = dest[2*i]
					if n, ok := dest[2*i+1].(int64); ok {
						whole = n
					}
				}
				// The driver returns fresh strings and []byte each step.
				cell, cost := boundCell(v, whole, bound)
				if _, ok := cell.(CutValue); ok {
					cut++
				}
				row[i] = cell
				rowSize += cost + 1
			}
			if len(res.Rows) > 0 && size+rowSize > lim.MaxAnswerBytes {
				res.Stopped = StoppedBytes
				return nil
			}
			size += rowSize
			res.CutCells += cut
			res.Rows = append(res.Rows, row)
		}
	})
	if err != nil {
		return QueryResult{}, queryErr(ctx, lim.Timeout, lim.MaxMemoryBytes, err)
	}
	if res.Columns == nil {
		res.Columns = []string{}
	}
	return res, nil
}

// statementColumns compiles query, with every check prepareChecked makes,
// and returns the names of its result columns without running it.
func statementColumns(ctx context.Context, c *sqlite3.SQLiteConn, query string, refused *string) ([]string, error) {
	ss, err := prepareChecked(ctx, c, query, refused)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	// go-sqlite3 steps a statement only on Next: this binds and names.
	dr, err := ss.QueryContext(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer dr.Close()
	return dr.Columns(), nil
}

// prepareChecked compiles stmt under the authorizer and refuses what would
// write or wants parameters.
func prepareChecked(ctx context.Context, c *sqlite3.SQLiteConn, stmt string, refused *string) (*sqlite3.SQLiteStmt, error) {
	st, err := c.PrepareContext(ctx, stmt)
	if err != nil {
		if *refused != "" {
			return nil, fmt.Errorf("ledger: query refused: %s; the ledger is read-only", *refused)
		}
		return nil, fmt.Errorf("ledger: invalid SQL: %w", err)
	}
	ss, ok := st.(*sqlite3.SQLiteStmt)
	if !ok {
		st.Close()
		return nil, fmt.Errorf("ledger: unexpected driver statement %T", st)
	}
	if !ss.Readonly() {
		ss.Close()
		return nil, errors.New("ledger: query refused: the statement would modify the database; the ledger is read-only")
	}
	if n := ss.NumInput(); n > 0 {
		ss.Close()
		return nil, fmt.Errorf("ledger: query refused: it has %d bound parameter(s) (?, :name); write the values into the SQL", n)
	}
	return ss, nil
}

// cuttingStatement runs the SELECT body (cols result columns) inside one
// that answers, for each column, the value cut to the bytes a cell of
// bound bytes of JSON could hold (text stays text), and its whole length
// when it was cut (else NULL). octet_length reads a stored value's length
// without loading it and a zeroblob's without building it. The OFFSET keeps
// SQLite from merging the body into the outer statement, which would
// evaluate each of its expressions once per reference (a random() would
// differ between its length and its value).
func cuttingStatement(body string, cols, bound int) string {
	n := bound // bytes: JSON never takes fewer than the raw bytes of text
	var b strings.Builder
	b.WriteString("WITH capsem_answer(")
	for i := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "c%d", i)
	}
	// The newline ends a -- comment the body may close with.
	b.WriteString(") AS (SELECT * FROM (\n")
	b.WriteString(body)
	b.WriteString("\n) LIMIT -1 OFFSET 0) SELECT ")
	for i := range cols {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "CASE WHEN octet_length(c%[1]d) > %[2]d THEN "+
			"CASE WHEN typeof(c%[1]d) = 'blob' THEN substr(c%[1]d, 1, %[2]d) "+
			"ELSE CAST(substr(CAST(c%[1]d AS BLOB), 1, %[2]d) AS TEXT) END "+
			"ELSE c%[1]d END, "+
			"CASE WHEN octet_length(c%[1]d) > %[2]d THEN octet_length(c%[1]d) END", i, n)
	}
	b.WriteString(" FROM capsem_answer")
	return b.String()
}

// tuneAllocator sets the C allocator up for Query once per process.
var tuneAllocator sync.Once

// queryErr names a timeout as such; SQLite itself reports only
// "interrupted". Running out of the memory bound is named too.
func queryErr(ctx context.Context, timeout time.Duration, memory int64, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return fmt.Errorf("ledger: query interrupted after its %s time limit: %w", timeout, ctxErr)
		}
		return fmt.Errorf("ledger: query interrupted: %w", ctxErr)
	}
	var serr sqlite3.Error
	if errors.As(err, &serr) && serr.Code == sqlite3.ErrNomem {
		return fmt.Errorf("ledger: query needs more than the %d MiB of memory queries may use; select fewer or shorter values (substr, length): %w", memory>>20, err)
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

// queryText is what checkQueryText learnt of a statement.
type queryText struct {
	// body is the statement without its ';' and what follows it (only
	// blanks and comments may).
	body string
	// selects: the statement is a SELECT (or WITH or VALUES), which can
	// run inside another as a subquery.
	selects bool
}

// checkQueryText does what only the text can tell: one statement, not empty,
// a reading verb, no NUL (SQLite would silently stop reading at it). It
// lexes strings, quoted identifiers and comments so a ';' inside them does
// not count. A CREATE TRIGGER body would look like several statements, which
// is fine: it is refused either way.
func checkQueryText(q string) (queryText, error) {
	if len(q) > MaxQueryBytes {
		return queryText{}, fmt.Errorf("ledger: query is %d bytes, over the %d-byte limit", len(q), MaxQueryBytes)
	}
	if strings.IndexByte(q, 0) >= 0 {
		return queryText{}, errors.New("ledger: query contains a NUL byte")
	}
	var first string
	sawToken, ended := false, false
	end := 0 // just past the statement's last token
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
			return queryText{}, errors.New("ledger: query refused: only one statement is allowed (text follows the first ';')")
		}
		if c == ';' {
			if !sawToken {
				return queryText{}, errors.New("ledger: query refused: empty statement before ';'")
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
				return queryText{}, fmt.Errorf("ledger: query refused: only SELECT, WITH, VALUES, PRAGMA or EXPLAIN statements are allowed, got %q", capString(first, 32))
			}
			i = j
			end = i
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
		end = i
	}
	if !sawToken {
		return queryText{}, errors.New("ledger: query is empty")
	}
	return queryText{body: q[:end], selects: first == "SELECT" || first == "WITH" || first == "VALUES"}, nil
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
