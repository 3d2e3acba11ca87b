package ledger

import (
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// QueryLimits bound what Query answers. The byte bounds count the answer
// as encoding/json writes it, since that is what the service and its
// clients hold.
type QueryLimits struct {
	// MaxRows: rows past it are left out (StoppedRows).
	MaxRows int
	// MaxCellBytes: a text or blob cell whose JSON would be longer is cut
	// to a prefix that fits (a CutValue). With many columns the bound per
	// cell shrinks to MaxAnswerBytes over their number, so that any one row
	// fits in the answer.
	MaxCellBytes int
	// MaxAnswerBytes: rows past it are left out (StoppedBytes); the first
	// row is always kept.
	MaxAnswerBytes int
	// Timeout interrupts the statement.
	Timeout time.Duration
	// MaxMemoryBytes bounds the memory SQLite may allocate in this
	// process; a statement that needs more fails with an error that says
	// so. SQLite builds a computed value whole even when the answer keeps
	// only its prefix, and holds a row's values at once, so without it one
	// statement of a few wide values (SELECT zeroblob(16000000), ... in 24
	// columns) takes gigabytes. The bound is SQLite's, for the whole
	// process, and can only be lowered: the smallest given holds. The
	// ledger writers of a process that queries need a few MiB.
	MaxMemoryBytes int64
}

func (l QueryLimits) check() error {
	switch {
	case l.MaxRows <= 0:
		return fmt.Errorf("ledger: query row limit must be positive, got %d", l.MaxRows)
	case l.MaxCellBytes < minCellBytes:
		return fmt.Errorf("ledger: query cell limit must be at least %d bytes, got %d", minCellBytes, l.MaxCellBytes)
	case l.MaxAnswerBytes < l.MaxCellBytes:
		return fmt.Errorf("ledger: query answer limit (%d bytes) is below its cell limit (%d bytes)", l.MaxAnswerBytes, l.MaxCellBytes)
	case l.Timeout <= 0:
		return fmt.Errorf("ledger: query timeout must be positive, got %s", l.Timeout)
	case l.MaxMemoryBytes < minMemoryBytes:
		return fmt.Errorf("ledger: query memory limit must be at least %d bytes, got %d", minMemoryBytes, l.MaxMemoryBytes)
	}
	return nil
}

// Why rows were left out of an answer.
const (
	StoppedRows  = "rows"  // QueryLimits.MaxRows
	StoppedBytes = "bytes" // QueryLimits.MaxAnswerBytes
)

// QueryResult is Query's answer.
type QueryResult struct {
	Columns []string
	// Rows hold int64, float64, string, []byte, nil or CutValue.
	Rows [][]any
	// Stopped says why rows were left out (StoppedRows, StoppedBytes), ""
	// when the answer has them all.
	Stopped string
	// CutCells counts the CutValue cells.
	CutCells int
}

// CutValue stands in an answer for a text or blob value too long for a
// cell: its first bytes and its whole length.
type CutValue struct {
	Prefix any   // a string for text, []byte for a blob
	Bytes  int64 // the whole value's length in bytes
}

// minMemoryBytes is what SQLite needs to read the ledger at all.
const minMemoryBytes = 8 << 20

// minCellBytes keeps a cut cell long enough to show what it held.
const minCellBytes = 2 * cutCellOverhead

// cutCellOverhead is what a cut cell's JSON takes besides its prefix (the
// service writes {"cut":true,"bytes":N,"value":...}).
const cutCellOverhead = 64

// cellBound is the JSON bound on one cell of a result with cols columns.
func (l QueryLimits) cellBound(cols int) int {
	bound := l.MaxCellBytes
	if cols > 0 && l.MaxAnswerBytes/cols < bound {
		bound = l.MaxAnswerBytes / cols
	}
	return max(bound, minCellBytes)
}

// boundCell returns v as it goes into an answer whose cells take at most
// bound bytes of JSON, and what it takes. whole is the value's length when
// SQLite already cut it to a prefix, else -1.
func boundCell(v any, whole int64, bound int) (cell any, cost int) {
	switch v := v.(type) {
	case string:
		if n := jsonStringLen(v); whole < 0 && n <= bound {
			return v, n
		}
		if whole < 0 {
			whole = int64(len(v))
		} else {
			v = trimPartialRune(v) // SQLite cut it by bytes
		}
		p := cutText(v, bound-cutCellOverhead)
		return CutValue{Prefix: p, Bytes: whole}, cutCellOverhead + jsonStringLen(p)
	case []byte:
		if n := jsonBlobLen(len(v)); whole < 0 && n <= bound {
			return v, n
		}
		if whole < 0 {
			whole = int64(len(v))
		}
		p := v[:min(len(v), blobFits(bound-cutCellOverhead))]
		return CutValue{Prefix: p, Bytes: whole}, cutCellOverhead + jsonBlobLen(len(p))
	case int64:
		return v, len(strconv.AppendInt(nil, v, 10))
	case float64:
		return v, len(strconv.AppendFloat(nil, v, 'g', -1, 64)) + 4 // encoding/json may add an exponent's digits
	case nil:
		return nil, len("null")
	}
	return v, len(fmt.Sprint(v)) + 2
}

// jsonBlobLen is the length of a blob of n bytes in JSON: base64, quoted.
func jsonBlobLen(n int) int { return (n+2)/3*4 + 2 }

// blobFits is the most bytes of a blob whose JSON takes at most budget.
func blobFits(budget int) int { return max(budget-2, 0) / 4 * 3 }

// jsonStringLen is the length of s as encoding/json writes it: quoted,
// with HTML characters, control characters, invalid bytes and the line and
// paragraph separators escaped.
func jsonStringLen(s string) int {
	n := 2
	for i := 0; i < len(s); {
		size, cost := jsonRuneLen(s[i:])
		n += cost
		i += size
	}
	return n
}

// jsonRuneLen reads the rune (or invalid byte) s starts with and returns
// its size in s and its length in JSON.
func jsonRuneLen(s string) (size, cost int) {
	c := s[0]
	if c < utf8.RuneSelf {
		switch {
		case c == '"' || c == '\\' || c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f':
			return 1, 2
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			return 1, 6 // \u00XX
		}
		return 1, 1
	}
	r, size := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && size == 1:
		return 1, 6 // \ufffd
	case r == '\u2028' || r == '\u2029':
		return size, 6
	}
	return size, size
}

// trimPartialRune drops the start of a rune a byte cut left at the end of
// s; stray bytes that begin no rune stay.
func trimPartialRune(s string) string {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				return s[:i]
			}
			return s
		}
	}
	return s
}

// cutText returns the longest prefix of s, ending on a rune boundary,
// whose JSON takes at most budget bytes.
func cutText(s string, budget int) string {
	n := 2
	for i := 0; i < len(s); {
		size, cost := jsonRuneLen(s[i:])
		if n+cost > budget {
			return s[:i]
		}
		n += cost
		i += size
	}
	return s
}
