package mcpframe

import (
	"fmt"
	"strings"
)

// The metadata line is what a relay may send once, before its first
// frame, about the connection as a whole:
//
//	NUL "CAPSEM_META:" <process name> { TAB <key> "=" <value> } "\n"
//
// The process name comes first (the only field of the line's first form);
// then keyed fields, of which a reader keeps those it knows and skips the
// rest, so a newer relay can add one. Known keys: "trace" (Meta.TraceID).
// Every value is the guest's word: it labels the connection's records and
// decides nothing.
const (
	// MetaPrefix starts a metadata line. A frame also starts with a NUL
	// (the high byte of its length), so only the whole prefix marks one.
	MetaPrefix = "\x00CAPSEM_META:"
	// MaxMetaLine bounds a metadata line, its newline included.
	MaxMetaLine = 4096
	// MaxTraceID bounds a trace id (as the service API's).
	MaxTraceID = 128
)

// Meta is what a metadata line says.
type Meta struct {
	Name    string // the relay's caller (SanitizeName applies)
	TraceID string // the trace its caller runs under ("" for none)
}

// AppendMetaLine appends m's metadata line to dst. A trace id that
// CheckTraceID refuses is left out rather than sent.
func AppendMetaLine(dst []byte, m Meta) []byte {
	dst = append(dst, MetaPrefix...)
	dst = append(dst, SanitizeName(m.Name)...)
	if m.TraceID != "" && CheckTraceID(m.TraceID) == nil {
		dst = append(dst, "\ttrace="...)
		dst = append(dst, m.TraceID...)
	}
	return append(dst, '\n')
}

// ParseMetaLine reads a metadata line (prefix to newline, the newline
// optional). The name is sanitized; a trace id that CheckTraceID refuses
// is an error naming it, as is a line without the prefix or past
// MaxMetaLine.
func ParseMetaLine(line []byte) (Meta, error) {
	if len(line) > MaxMetaLine {
		return Meta{}, fmt.Errorf("metadata line: %d bytes, more than %d", len(line), MaxMetaLine)
	}
	rest, ok := strings.CutPrefix(string(line), MetaPrefix)
	if !ok {
		return Meta{}, fmt.Errorf("metadata line: does not start with %q", MetaPrefix)
	}
	rest = strings.TrimSuffix(rest, "\n")
	fields := strings.Split(rest, "\t")
	m := Meta{Name: SanitizeName(fields[0])}
	for _, f := range fields[1:] {
		key, value, _ := strings.Cut(f, "=")
		if key != "trace" {
			continue // a newer relay's field
		}
		if err := CheckTraceID(value); err != nil {
			return Meta{}, fmt.Errorf("metadata line: %w", err)
		}
		m.TraceID = value
	}
	return m, nil
}

// CheckTraceID refuses a trace id that is empty, too long, or holds
// anything but letters, digits and . _ : -.
func CheckTraceID(id string) error {
	if id == "" || len(id) > MaxTraceID {
		return fmt.Errorf("trace id of %d bytes: want 1 to %d", len(id), MaxTraceID)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._:-", r)) {
			return fmt.Errorf("trace id %q: only letters, digits and . _ : - are allowed", id)
		}
	}
	return nil
}
