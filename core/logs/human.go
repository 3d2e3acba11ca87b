package logs

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Log formats.
const (
	FormatAuto = "auto" // text on a terminal, else JSON lines
	FormatText = "text"
	FormatJSON = "json"
)

// ForStream returns the logger for f in format: JSON lines for machines
// (files, pipes, `--log-format json`), short human lines on a terminal.
func ForStream(f *os.File, level, format string) *slog.Logger {
	tty := isTerminal(f)
	if format == FormatText || (format != FormatJSON && tty) {
		h := NewHumanHandler(f, parseLevel(level))
		if tty {
			h.term = f
		}
		return slog.New(h)
	}
	return New(f, level)
}

func parseLevel(level string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return l
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// HumanHandler writes one short line per record for a person at a
// terminal: "capsem: message (key value, …)", warnings and errors
// marked, no timestamps.
type HumanHandler struct {
	mu     *sync.Mutex
	w      io.Writer
	level  slog.Leveler
	pre    []string // attributes given by WithAttrs, rendered
	groups []string
	// term is w when it is a terminal: it may hold a status line
	// (Progress), which records are written above.
	term   *os.File
	status *string // the status line shown now, "" for none (under mu)
}

// NewHumanHandler writes to w at level and above.
func NewHumanHandler(w io.Writer, level slog.Leveler) *HumanHandler {
	return &HumanHandler{mu: &sync.Mutex{}, w: w, level: level, status: new(string)}
}

// clearLine erases the status line, if one is shown (mu held).
func (h *HumanHandler) clearLine() {
	if *h.status != "" {
		io.WriteString(h.w, "\r\033[K")
	}
}

// setStatus shows line as the status line in place of the last one ("":
// none), cut to the terminal's width so that it never wraps.
func (h *HumanHandler) setStatus(line string) {
	if h.term == nil {
		return
	}
	if ws, err := unix.IoctlGetWinsize(int(h.term.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 1 {
		if r := []rune(line); len(r) > int(ws.Col)-1 {
			line = string(r[:int(ws.Col)-1])
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clearLine()
	*h.status = line
	io.WriteString(h.w, line)
}

func (h *HumanHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *HumanHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("capsem: ")
	switch {
	case r.Level >= slog.LevelError:
		b.WriteString("error: ")
	case r.Level >= slog.LevelWarn:
		b.WriteString("warning: ")
	case r.Level < slog.LevelInfo:
		b.WriteString("debug: ")
	}
	b.WriteString(oneLine(r.Message))
	parts := slices.Clone(h.pre)
	r.Attrs(func(a slog.Attr) bool { parts = appendAttr(parts, h.groups, a); return true })
	if len(parts) > 0 {
		b.WriteString(" (" + strings.Join(parts, ", ") + ")")
	}
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	h.clearLine()
	_, err := io.WriteString(h.w, b.String())
	io.WriteString(h.w, *h.status)
	return err
}

// appendAttr renders a as "key value", groups as dotted prefixes.
func appendAttr(parts, groups []string, a slog.Attr) []string {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return parts
	}
	if a.Value.Kind() == slog.KindGroup {
		g := groups
		if a.Key != "" {
			g = append(slices.Clone(groups), a.Key)
		}
		for _, sub := range a.Value.Group() {
			parts = appendAttr(parts, g, sub)
		}
		return parts
	}
	key := strings.Join(append(slices.Clone(groups), a.Key), ".")
	return append(parts, key+" "+value(a.Value))
}

func value(v slog.Value) string {
	s := v.String()
	if v.Kind() == slog.KindString && (s == "" || strings.ContainsAny(s, " ,()\"\n\t")) {
		return strconv.Quote(s)
	}
	return oneLine(s)
}

// oneLine keeps a record on its line: control characters are escaped.
func oneLine(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

func (h *HumanHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h2 := *h
	h2.pre = slices.Clone(h.pre)
	for _, a := range as {
		h2.pre = appendAttr(h2.pre, h.groups, a)
	}
	return &h2
}

func (h *HumanHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	h2 := *h
	h2.groups = append(slices.Clone(h.groups), name)
	return &h2
}
