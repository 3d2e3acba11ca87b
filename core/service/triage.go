package service

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/ledger"
)

// Triage ranks what went wrong since a time: crashes of capsem's
// processes, error and warning records in their logs, the service's
// failed, refused and slow requests, and, for a VM, the troubles its
// ledger recorded (connections refused, MCP calls failed or denied,
// commands failed). Occurrences of one trouble are grouped; the groups are
// ranked by severity, then count, then how recently.
func (s *Service) Triage(ctx context.Context, req api.TriageRequest) (api.TriageResult, error) {
	limit := cmp.Or(req.Limit, api.DefaultTriageFindings)
	if limit < 0 || limit > api.MaxTriageFindings {
		return api.TriageResult{}, badRequest("limit %d: want 1 to %d (0: %d)", limit, api.MaxTriageFindings, api.DefaultTriageFindings)
	}
	since := req.Since
	if since.IsZero() {
		since = time.Now().Add(-api.DefaultTriageSince)
	}
	var v *vm
	if req.VM != "" {
		var err error
		if v, err = s.lookup(req.VM); err != nil {
			return api.TriageResult{}, err
		}
	}
	g := findingGroups{}
	panics, err := s.Panics(ctx, api.PanicsRequest{Since: since, Limit: api.MaxPanics})
	if err != nil {
		return api.TriageResult{}, err
	}
	for _, p := range panics.Panics {
		first, _, _ := strings.Cut(p.Message, "\n")
		who := p.Component
		if p.VM != "" {
			who += " of " + p.VM
		}
		g.add(api.TriageFinding{Severity: api.SeverityCritical, Kind: api.FindingPanic, Summary: fmt.Sprintf("%s crashed: %s", who, first),
			Example: p.Location, Source: p.Log}, p.Time)
	}
	home, _ := os.UserHomeDir()
	for _, src := range s.logSources() {
		for _, path := range []string{src.path + ".1", src.path} {
			if err := ctx.Err(); err != nil {
				return api.TriageResult{}, err
			}
			scanRecords(path, since, func(rec logRecord, line string) {
				f := recordFinding(rec, line, src.component)
				if f.Kind != "" {
					f.Source = redact(path, home)
					f.Summary, f.Example = redact(f.Summary, home), redact(f.Example, home)
					g.add(f, rec.Time)
				}
			})
		}
	}
	if v != nil {
		found, err := ledger.Triage(ctx, s.sessionOf(v).DB(), since)
		if err != nil {
			return api.TriageResult{}, refuse(http.StatusNotFound, "session ledger: %v", err)
		}
		for _, f := range found {
			g.merge(f)
		}
	}
	out := api.TriageResult{Since: since.UTC().Format(time.RFC3339), Findings: g.ranked()}
	if len(out.Findings) > limit {
		out.Findings, out.Omitted = out.Findings[:limit], len(out.Findings)-limit
	}
	return out, nil
}

// logRecord is what a triage reads of a JSON log record.
type logRecord struct {
	Time   string `json:"time"`
	Level  string `json:"level"`
	Msg    string `json:"msg"`
	Method string `json:"method"`
	Route  string `json:"route"`
	Status int    `json:"status"`
	TookMS int64  `json:"took_ms"`
}

// scanRecords calls fn with each JSON record of a log's tail at or after
// since that is a warning or an error, or a note of the service's answers.
func scanRecords(path string, since time.Time, fn func(logRecord, string)) {
	r := openTail(path)
	if r == nil {
		return
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var rec logRecord
		if json.Unmarshal(line, &rec) != nil || !after(rec.Time, since) || rec.Time == "" {
			continue
		}
		fn(rec, string(line))
	}
}

// recordFinding is what a log record says, or nothing (Kind "").
func recordFinding(rec logRecord, line, component string) api.TriageFinding {
	switch {
	case component == "service" && rec.Msg == "request failed":
		return api.TriageFinding{Severity: api.SeverityError, Kind: api.FindingFailedRequest, Summary: fmt.Sprintf("%s %s answered %d", rec.Method, rec.Route, rec.Status), Example: cut(line)}
	case component == "service" && rec.Msg == "request refused":
		return api.TriageFinding{Severity: api.SeverityInfo, Kind: api.FindingRefusedRequest, Summary: fmt.Sprintf("%s %s refused with %d", rec.Method, rec.Route, rec.Status), Example: cut(line)}
	case component == "service" && rec.Msg == "slow request":
		return api.TriageFinding{Severity: api.SeverityInfo, Kind: api.FindingSlowRequest, Summary: fmt.Sprintf("%s %s slower than %v", rec.Method, rec.Route, SlowRequest), Example: cut(line)}
	case rec.Level == "ERROR":
		return api.TriageFinding{Severity: api.SeverityError, Kind: api.FindingErrorLog, Summary: component + ": " + cut(rec.Msg), Example: cut(line)}
	case rec.Level == "WARN":
		return api.TriageFinding{Severity: api.SeverityWarning, Kind: api.FindingWarningLog, Summary: component + ": " + cut(rec.Msg), Example: cut(line)}
	}
	return api.TriageFinding{}
}

// cut bounds a text a finding shows.
func cut(s string) string {
	if len(s) <= 600 {
		return s
	}
	return strings.ToValidUTF8(s[:600], "") + "…"
}

// findingGroups groups occurrences by kind, summary and source.
type findingGroups map[[3]string]*api.TriageFinding

// add counts one occurrence at time ts (its example the latest's).
func (g findingGroups) add(f api.TriageFinding, ts string) {
	f.Count, f.First, f.Last = 1, ts, ts
	g.merge(f)
}

// merge adds a group of occurrences.
func (g findingGroups) merge(f api.TriageFinding) {
	key := [3]string{f.Kind, f.Summary, f.Source}
	cur := g[key]
	if cur == nil {
		g[key] = &f
		return
	}
	cur.Count += f.Count
	if f.First != "" && (cur.First == "" || f.First < cur.First) {
		cur.First = f.First
	}
	if f.Last > cur.Last {
		cur.Last, cur.Example = f.Last, f.Example
	}
}

// ranked is the groups by severity, then count, then how recently.
func (g findingGroups) ranked() []api.TriageFinding {
	out := make([]api.TriageFinding, 0, len(g))
	for _, f := range g {
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b api.TriageFinding) int {
		return cmp.Or(cmp.Compare(slices.Index(api.Severities, a.Severity), slices.Index(api.Severities, b.Severity)),
			cmp.Compare(b.Count, a.Count), strings.Compare(b.Last, a.Last), strings.Compare(a.Summary, b.Summary))
	})
	return out
}
