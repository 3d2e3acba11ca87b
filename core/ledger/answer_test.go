//go:build cgo

package ledger

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// answerJSON is res as the service writes it: a cut value as
// {"cut":true,"bytes":N,"value":...}.
func answerJSON(t *testing.T, res QueryResult) []byte {
	t.Helper()
	rows := make([][]any, len(res.Rows))
	for i, row := range res.Rows {
		rows[i] = make([]any, len(row))
		for j, v := range row {
			if c, ok := v.(CutValue); ok {
				v = map[string]any{"cut": true, "bytes": c.Bytes, "value": c.Prefix}
			}
			rows[i][j] = v
		}
	}
	b, err := json.Marshal(map[string]any{"columns": res.Columns, "rows": rows, "truncated": true, "truncated_by": res.Stopped, "cut_cells": res.CutCells})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func columnsOf(n int, expr string) string {
	return "SELECT " + strings.TrimSuffix(strings.Repeat(expr+", ", n), ", ")
}

// TestQueryCutsLongValues: a text or blob over the cell bound comes back
// as its prefix and its whole length, whatever made it (a zeroblob SQLite
// never builds, random bytes, text with multi-byte runes or characters
// JSON escapes); short values come back whole.
func TestQueryCutsLongValues(t *testing.T) {
	path := seeded(t, 1)
	lim := testLimits(10, 5*time.Second)
	type want struct {
		whole  int64  // 0: the cell is not cut
		prefix string // what the prefix consists of (repeated), for text
		blob   bool
	}
	tests := []struct {
		name string
		sql  string
		want []want
	}{
		{"zeroblob and a short text", "SELECT zeroblob(16000000) AS big, 'x' AS small", []want{{whole: 16000000, blob: true}, {}}},
		{"random blob", "SELECT randomblob(2000000)", []want{{whole: 2000000, blob: true}}},
		{"long text", "SELECT printf('%.*c', 2000000, 'x')", []want{{whole: 2000000, prefix: "x"}}},
		{"multi-byte text", "SELECT replace(hex(zeroblob(600000)), '0', 'é')", []want{{whole: 2400000, prefix: "é"}}},
		// 400 KB of raw bytes, but 2.4 MB of JSON (each '<' is \u003c).
		{"escaped text", "SELECT replace(hex(zeroblob(200000)), '0', '<')", []want{{whole: 400000, prefix: "<"}}},
		{"control characters", "SELECT replace(hex(zeroblob(200000)), '0', char(1))", []want{{whole: 400000, prefix: "\x01"}}},
		{"short values", "SELECT printf('%.*c', 1000, 'y'), NULL, 42, 1.5, x'00ff'", []want{{}, {}, {}, {}, {}}},
		{"wide row", columnsOf(24, "zeroblob(1000000)"), func() []want {
			w := make([]want, 24)
			for i := range w {
				w[i] = want{whole: 1000000, blob: true}
			}
			return w
		}()},
		{"a cut value in a subquery with ORDER BY", "SELECT b FROM (SELECT 2 AS k, zeroblob(3000000) AS b UNION ALL SELECT 1, x'01') ORDER BY k DESC", []want{{whole: 3000000, blob: true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Query(context.Background(), path, tt.sql, lim)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Rows) < 1 || len(res.Rows[0]) != len(tt.want) {
				t.Fatalf("rows %d, columns %v", len(res.Rows), res.Columns)
			}
			bound := lim.cellBound(len(tt.want))
			cut := 0
			for i, w := range tt.want {
				v := res.Rows[0][i]
				c, isCut := v.(CutValue)
				if (w.whole != 0) != isCut {
					t.Fatalf("column %d: %T %.40v, want cut=%v", i, v, v, w.whole != 0)
				}
				if !isCut {
					continue
				}
				cut++
				if c.Bytes != w.whole {
					t.Errorf("column %d: whole length %d, want %d", i, c.Bytes, w.whole)
				}
				switch p := c.Prefix.(type) {
				case []byte:
					if !w.blob || len(p) == 0 || jsonBlobLen(len(p))+cutCellOverhead > bound {
						t.Errorf("column %d: a blob prefix of %d bytes for a cell bound of %d", i, len(p), bound)
					}
				case string:
					if w.blob || !utf8.ValidString(p) || p == "" || strings.Trim(p, w.prefix) != "" {
						t.Errorf("column %d: text prefix %.40q, want %q repeated", i, p, w.prefix)
					}
					if n := jsonStringLen(p) + cutCellOverhead; n > bound || n < bound-100 {
						t.Errorf("column %d: a prefix of %d JSON bytes for a cell bound of %d", i, n, bound)
					}
				default:
					t.Errorf("column %d: prefix %T", i, p)
				}
			}
			if res.CutCells != cut {
				t.Errorf("CutCells %d, want %d", res.CutCells, cut)
			}
			if n := len(answerJSON(t, res)); n > lim.MaxAnswerBytes {
				t.Errorf("answer of %d bytes, over %d", n, lim.MaxAnswerBytes)
			}
		})
	}
	// Values within the bound are the values.
	res, err := Query(context.Background(), path, "SELECT printf('%.*c', 1000, 'y'), NULL, 42, 1.5, x'00ff'", lim)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%q", res.Rows[0]); got != fmt.Sprintf("%q", []any{strings.Repeat("y", 1000), nil, int64(42), 1.5, []byte{0, 0xff}}) {
		t.Errorf("short values: %s", got)
	}
}

// TestQueryCutsEachValueOnce: the statement is run once per row, so a
// value that differs between runs (random()) is measured and cut as the
// value it is: never a long value whole, never a short one marked cut.
func TestQueryCutsEachValueOnce(t *testing.T) {
	path := seeded(t, 1)
	res, err := Query(context.Background(), path,
		"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < 200) "+
			"SELECT CASE WHEN random() % 2 = 0 THEN zeroblob(2000000) ELSE 'short' END FROM n", testLimits(200, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for i, row := range res.Rows {
		switch v := row[0].(type) {
		case string:
			if v != "short" {
				t.Fatalf("row %d: %q", i, v)
			}
		case CutValue:
			if v.Bytes != 2000000 {
				t.Fatalf("row %d: cut with a whole length of %d, want 2000000", i, v.Bytes)
			}
		default:
			t.Fatalf("row %d: %T of %d bytes", i, v, len(fmt.Sprint(v)))
		}
	}
}

// TestQueryStopsAtAnswerBytes: rows past the answer's bound are left out,
// and the answer says so.
func TestQueryStopsAtAnswerBytes(t *testing.T) {
	path := seeded(t, 1)
	lim := testLimits(10000, 5*time.Second)
	res, err := Query(context.Background(), path,
		"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT x, zeroblob(500000) FROM c", lim)
	if err != nil {
		t.Fatal(err)
	}
	if res.Stopped != StoppedBytes || len(res.Rows) < 2 || res.CutCells != 0 {
		t.Fatalf("stopped %q after %d rows, %d cut", res.Stopped, len(res.Rows), res.CutCells)
	}
	if n := len(answerJSON(t, res)); n > lim.MaxAnswerBytes || n < lim.MaxAnswerBytes*3/4 {
		t.Errorf("answer of %d bytes, want close to and at most %d", n, lim.MaxAnswerBytes)
	}
	for i, row := range res.Rows {
		if row[0] != int64(i+1) {
			t.Fatalf("row %d: %v", i, row[0])
		}
	}
}

// TestQueryWrappingKeepsResults: a SELECT, run inside the statement that
// cuts its values, answers what it answers on its own: columns (duplicate
// names too), order, and values, whatever closes its text.
func TestQueryWrappingKeepsResults(t *testing.T) {
	path := seeded(t, 5)
	for _, q := range []string{
		"SELECT id, method FROM mcp_calls ORDER BY id DESC",
		"SELECT id FROM mcp_calls ORDER BY id DESC;",
		"SELECT 1 AS a, 2 AS a, 'x' AS \"b c\"",
		"SELECT id FROM mcp_calls ORDER BY id DESC LIMIT 2 -- a comment to the end",
		"SELECT id FROM mcp_calls /* unterminated",
		"SELECT id FROM mcp_calls ORDER BY id; -- after the statement",
		"VALUES (3, 'c'), (1, 'a'), (2, x'00')",
		"WITH RECURSIVE c(x) AS (SELECT 5 UNION ALL SELECT x-1 FROM c WHERE x > 1) SELECT x, x*x FROM c",
		"SELECT decision, count(*) FROM mcp_calls GROUP BY decision HAVING count(*) > 1",
		"SELECT * FROM mcp_calls ORDER BY id",
	} {
		t.Run(q, func(t *testing.T) {
			res, err := Query(context.Background(), path, q, testLimits(100, 5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			// database/sql runs what follows a ';' as statements of their own.
			reference, _, _ := strings.Cut(q, ";")
			rows, err := readOnlyDB(t, path).Query(reference)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			cols, _ := rows.Columns()
			if strings.Join(cols, "|") != strings.Join(res.Columns, "|") {
				t.Errorf("columns %q, want %q", res.Columns, cols)
			}
			var want [][]any
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				want = append(want, vals)
			}
			if got, w := fmt.Sprintf("%#v", res.Rows), fmt.Sprintf("%#v", want); got != w {
				t.Errorf("rows\n got %s\nwant %s", got, w)
			}
		})
	}
}

// memoryChildEnv makes the test binary the child of TestQueryMemoryIsBounded.
const memoryChildEnv = "CAPSEM_LEDGER_MEMORY_CHILD"

// TestQueryMemoryIsBounded attacks as the issue found: one statement of 24
// columns of zeroblob(16000000), each a 16 MB value, took a process past
// 1.7 GiB. In a process of its own (so that its peak is the query's), the
// query must end with an answer or a clear error, and the peak resident
// size stay under 200 MiB. (SQLite builds each value whole when it copies
// it between its registers, so 24 of them cannot be answered within the
// bound: they fail with the memory error; a single one is answered cut.)
func TestQueryMemoryIsBounded(t *testing.T) {
	if os.Getenv(memoryChildEnv) != "" {
		memoryChild(os.Getenv(memoryChildEnv))
		return
	}
	path := seeded(t, 1)
	for _, q := range []string{
		columnsOf(24, "zeroblob(16000000)"),
		columnsOf(24, "printf('%.*c', 16000000, 'x')"),
		columnsOf(12, "zeroblob(16000000)"),
		"SELECT zeroblob(16000000), 'x'",
		"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT zeroblob(16000000) FROM c",
	} {
		t.Run(q[:min(len(q), 60)], func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestQueryMemoryIsBounded$")
			cmd.Env = append(os.Environ(), memoryChildEnv+"="+path)
			cmd.Stdin = strings.NewReader(q)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var outcome string
			var peakKB int64
			sc := bufio.NewScanner(bytes.NewReader(out))
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "outcome: "); ok {
					outcome = v
				}
				if v, ok := strings.CutPrefix(sc.Text(), "peak-kb: "); ok {
					peakKB, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			t.Logf("%s; peak %d MiB", outcome, peakKB>>10)
			if !strings.HasPrefix(outcome, "answer: truncated=true") && !strings.Contains(outcome, "of memory queries may use") {
				t.Errorf("outcome %q, want a truncated answer or the memory error", outcome)
			}
			if strings.HasPrefix(q, "SELECT zeroblob(16000000), 'x'") && !strings.HasPrefix(outcome, "answer: truncated=true rows=1 cut=1") {
				t.Errorf("outcome %q, want the one value cut", outcome)
			}
			if peakKB == 0 || peakKB > 200<<10 {
				t.Errorf("peak resident size %d KiB, want under 200 MiB\n%s", peakKB, out)
			}
		})
	}
}

// memoryChild runs the statement on stdin against path with the
// service's bounds, and prints its outcome and the process's peak size.
func memoryChild(path string) {
	q, _ := bufio.NewReader(os.Stdin).ReadString(0)
	res, err := Query(context.Background(), path, q, testLimits(10000, 30*time.Second))
	switch {
	case err != nil:
		fmt.Printf("outcome: error: %v\n", err)
	default:
		fmt.Printf("outcome: answer: truncated=%v rows=%d cut=%d stopped=%q\n", res.Stopped != "" || res.CutCells > 0, len(res.Rows), res.CutCells, res.Stopped)
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fmt.Printf("peak-kb: %s\n", strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
}
