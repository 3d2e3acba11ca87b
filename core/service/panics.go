package service

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
)

// maxPanicScan bounds what Panics reads of one log: its last bytes.
const maxPanicScan = 16 << 20

// panicLog is a log a capsem component's crashes land in.
type panicLog struct {
	component, vm, path string
}

// Panics returns the Go panics and fatal errors in capsem's logs on this
// host, the latest first: the service's (its stderr is its log), capsem
// mcp's (its crash output is copied to its log), and each known VM's
// process and aggregator logs, the rotated one of each too.
func (s *Service) Panics(ctx context.Context, req api.PanicsRequest) (api.PanicsResult, error) {
	limit := req.Limit
	if limit == 0 {
		limit = api.DefaultPanics
	}
	if limit < 0 || limit > api.MaxPanics {
		return api.PanicsResult{}, badRequest("limit %d: want 1 to %d (0: %d)", limit, api.MaxPanics, api.DefaultPanics)
	}
	home, _ := os.UserHomeDir()
	var found []api.PanicReport
	for _, src := range s.logSources() {
		for _, path := range []string{src.path + ".1", src.path} {
			if ctx.Err() != nil {
				return api.PanicsResult{}, ctx.Err()
			}
			for _, p := range scanPanics(path) {
				if !req.Since.IsZero() && !after(p.Time, req.Since) {
					continue
				}
				found = append(found, api.PanicReport{Panic: redactPanic(p, home), Component: src.component, VM: src.vm, Log: redact(path, home)})
			}
		}
	}
	// The latest first; a report without a time last.
	slices.SortStableFunc(found, func(a, b api.PanicReport) int { return strings.Compare(b.Time, a.Time) })
	out := api.PanicsResult{Panics: found}
	if len(found) > limit {
		out.Panics, out.Omitted = found[:limit], len(found)-limit
	}
	if out.Panics == nil {
		out.Panics = []api.PanicReport{}
	}
	return out, nil
}

// logSources are the logs capsem's processes on this host write, their
// crashes included: the service's (its stderr is its log), capsem mcp's
// (its crash output is copied to its log), and each known VM's process
// and aggregator logs.
func (s *Service) logSources() []panicLog {
	var sources []panicLog
	if p, err := paths.ServiceLog(); err == nil {
		sources = append(sources, panicLog{component: "service", path: p})
	}
	if p, err := paths.MCPLog(); err == nil {
		sources = append(sources, panicLog{component: "mcp", path: p})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.vms {
		session := paths.Session{Dir: v.rec.SessionDir}
		sources = append(sources, panicLog{component: "process", vm: v.rec.ID, path: session.ProcessLog()},
			panicLog{component: "aggregator", vm: v.rec.ID, path: session.AggregatorLog()})
	}
	return sources
}

// openTail opens a log at its last maxPanicScan bytes; nil for a log that
// is missing, unreadable or not a regular file.
func openTail(path string) io.ReadCloser {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil
	}
	if fi.Size() > maxPanicScan {
		f.Seek(fi.Size()-maxPanicScan, io.SeekStart)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, maxPanicScan), f}
}

// scanPanics reads the last maxPanicScan bytes of a log for panics; a log
// that is missing or unreadable has none.
func scanPanics(path string) []logs.Panic {
	r := openTail(path)
	if r == nil {
		return nil
	}
	defer r.Close()
	return logs.FindPanics(r)
}

// after reports whether the record time ts is at or after t; a time that
// does not parse counts as after (it is shown rather than hidden).
func after(ts string, t time.Time) bool {
	at, err := time.Parse(time.RFC3339Nano, ts)
	return err != nil || !at.Before(t)
}

// redact shows the home directory as ~.
func redact(s, home string) string {
	if home == "" || home == "/" {
		return s
	}
	return strings.ReplaceAll(s, filepath.Clean(home)+"/", "~/")
}

func redactPanic(p logs.Panic, home string) logs.Panic {
	p.Message, p.Location = redact(p.Message, home), redact(p.Location, home)
	frames := make([]string, len(p.Frames))
	for i, f := range p.Frames {
		frames[i] = redact(f, home)
	}
	p.Frames = frames
	return p
}
