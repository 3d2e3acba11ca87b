package aggregator

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Bounds on what one server's stderr may put in the aggregator's log.
const (
	stderrLineMax  = 2 << 10 // longer lines are cut (and say so)
	stderrTotalMax = 4 << 20 // past this much, lines are counted, not logged
)

// stderrLog turns a server's stderr into log entries of the aggregator's
// own: one per line, cut to stderrLineMax, attributed to the server, as a
// JSON string value (so no line can pose as an entry), and at most
// stderrTotalMax bytes in all before they are only counted.
type stderrLog struct {
	log     *slog.Logger
	server  string
	mu      sync.Mutex
	partial []byte
	total   int
	dropped int
}

func newStderrLog(log *slog.Logger, server string) *stderrLog {
	return &stderrLog{log: log, server: server}
}

func (s *stderrLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := stderrLineMax + 1 - len(s.partial)
			if room > 0 {
				s.partial = append(s.partial, p[:min(room, len(p))]...)
			}
			break
		}
		room := stderrLineMax + 1 - len(s.partial)
		if room > 0 {
			s.partial = append(s.partial, p[:min(room, i)]...)
		}
		s.emit()
		p = p[i+1:]
	}
	return n, nil
}

func (s *stderrLog) emit() {
	line := s.partial
	s.partial = s.partial[:0]
	cut := len(line) > stderrLineMax
	if cut {
		line = line[:stderrLineMax]
	}
	text := strings.TrimRight(string(line), "\r")
	if strings.TrimSpace(text) == "" {
		return
	}
	if s.total >= stderrTotalMax {
		s.dropped++
		if s.dropped == 1 {
			s.log.Warn("MCP server stderr past its bound; further lines are dropped", "server", s.server, "bound_bytes", stderrTotalMax)
		}
		return
	}
	s.total += len(text)
	s.log.Info("MCP server stderr", "server", s.server, "line", text, "cut", cut)
}
