// Package doctor runs diagnostic checks and reports them the same way on
// the host (`capsem doctor`) and in the guest (`capsem-doctor`): one line
// per check, `ok`, `warn` or `fail`, what was found, and for warn and fail
// a hint at the fix; then `RESULT: PASS` or `RESULT: FAIL`. With JSON the
// same results are JSON lines, one per check, then one summary line, so a
// caller (the host doctor running the guest's) can stream them.
//
// Checks are grouped (`-k GROUP` selects groups; none selected means all).
// A check asserts a real property of the machine it runs on; a failed
// check never stops the others.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	"github.com/capsem/capsem/core/printable"
)

// Status is a check's outcome.
type Status string

// The outcomes. Only Fail makes the result FAIL.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is one check's outcome.
type Result struct {
	Group  string `json:"group"`
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
}

// Summary is the last JSON line.
type Summary struct {
	Result string `json:"result"` // PASS or FAIL
	OK     int    `json:"ok"`
	Warn   int    `json:"warn"`
	Fail   int    `json:"fail"`
}

// Check is one named check. Run reports through the Reporter: usually one
// result, several when a check streams (the host's vm group relays the
// guest's).
type Check struct {
	Group string
	Name  string
	Run   func(ctx context.Context, r *Reporter)
	// Hint is the fix a warning or failure of this check gets when it
	// names none of its own (the group's Hint when empty).
	Hint string
}

// Group is a named set of checks, in the order they run.
type Group struct {
	Name   string
	Checks []Check
	// Hint is its checks' fallback fix (Check.Hint).
	Hint string
}

// Reporter prints results as they come and counts them.
type Reporter struct {
	mu      sync.Mutex
	w       io.Writer
	json    bool
	current Check
	sum     Summary
}

// NewReporter writes to w, as JSON lines when asJSON.
func NewReporter(w io.Writer, asJSON bool) *Reporter { return &Reporter{w: w, json: asJSON} }

// Add reports a result as it is.
func (r *Reporter) Add(res Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch res.Status {
	case OK:
		r.sum.OK++
	case Warn:
		r.sum.Warn++
	default:
		res.Status = Fail
		r.sum.Fail++
	}
	if r.json {
		b, _ := json.Marshal(res)
		fmt.Fprintf(r.w, "%s\n", printable.JSON(b))
		return
	}
	fmt.Fprintln(r.w, FormatLine(res))
}

// FormatLine is a result's text line. A guest's doctor reports through
// the host's, so the text is escaped for the terminal.
func FormatLine(res Result) string {
	line := fmt.Sprintf("%-4s  %-8s  %-18s  %s", res.Status, oneLine(res.Group), oneLine(res.Name), oneLine(res.Detail))
	if res.Hint != "" && res.Status != OK {
		line += "  (fix: " + oneLine(res.Hint) + ")"
	}
	return line
}

func oneLine(s string) string { return printable.Line(strings.Join(strings.Fields(s), " ")) }

// Okf, Warnf and Failf report the running check's result.
func (r *Reporter) Okf(format string, a ...any) { r.report(OK, "", format, a...) }

// Warnf reports a warning with a hint.
func (r *Reporter) Warnf(hint, format string, a ...any) { r.report(Warn, hint, format, a...) }

// Failf reports a failure with a hint.
func (r *Reporter) Failf(hint, format string, a ...any) { r.report(Fail, hint, format, a...) }

func (r *Reporter) report(s Status, hint, format string, a ...any) {
	r.mu.Lock()
	c := r.current
	r.mu.Unlock()
	if hint == "" {
		hint = c.Hint
	}
	r.Add(Result{Group: c.Group, Name: c.Name, Status: s, Detail: fmt.Sprintf(format, a...), Hint: hint})
}

// Summary is the tally so far.
func (r *Reporter) Summary() Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sum
	s.Result = "PASS"
	if s.Fail > 0 {
		s.Result = "FAIL"
	}
	return s
}

// Finish prints the summary: `RESULT: PASS|FAIL`, or its JSON line.
func (r *Reporter) Finish() Summary {
	s := r.Summary()
	if r.json {
		b, _ := json.Marshal(s)
		fmt.Fprintf(r.w, "%s\n", b)
	} else {
		fmt.Fprintf(r.w, "RESULT: %s (%d ok, %d warn, %d fail)\n", s.Result, s.OK, s.Warn, s.Fail)
	}
	return s
}

// Select returns the groups named in want, in the order of all; none named
// means all. An unknown name is an error that lists the known ones.
func Select(all []Group, want []string) ([]Group, error) {
	if len(want) == 0 {
		return all, nil
	}
	names := make([]string, len(all))
	for i, g := range all {
		names[i] = g.Name
	}
	for _, w := range want {
		if !slices.Contains(names, w) {
			return nil, fmt.Errorf("unknown check group %q (groups: %s)", w, strings.Join(names, ", "))
		}
	}
	var out []Group
	for _, g := range all {
		if slices.Contains(want, g.Name) {
			out = append(out, g)
		}
	}
	return out, nil
}

// Run runs every check of groups in order and prints the summary. A check
// that reports nothing is a failure: a check must assert something.
func Run(ctx context.Context, r *Reporter, groups []Group) Summary {
	for _, g := range groups {
		for _, c := range g.Checks {
			c.Group = g.Name
			if c.Hint == "" {
				c.Hint = g.Hint
			}
			r.mu.Lock()
			r.current = c
			before := r.sum.OK + r.sum.Warn + r.sum.Fail
			r.mu.Unlock()
			runOne(ctx, r, c)
			r.mu.Lock()
			after := r.sum.OK + r.sum.Warn + r.sum.Fail
			r.mu.Unlock()
			if after == before {
				r.Failf("this is a bug in the check", "the check reported nothing")
			}
		}
	}
	return r.Finish()
}

// runOne runs a check, turning a panic into its failure so the rest run.
func runOne(ctx context.Context, r *Reporter, c Check) {
	defer func() {
		if p := recover(); p != nil {
			r.Failf("this is a bug in the check", "the check panicked: %v", p)
		}
	}()
	c.Run(ctx, r)
}

// ParseLine reads one JSON line of a doctor's output: a result, or the
// summary (ok false for a line that is neither).
func ParseLine(line []byte) (res *Result, sum *Summary, ok bool) {
	var probe map[string]json.RawMessage
	if json.Unmarshal(line, &probe) != nil {
		return nil, nil, false
	}
	if _, isSum := probe["result"]; isSum {
		var s Summary
		if json.Unmarshal(line, &s) != nil || (s.Result != "PASS" && s.Result != "FAIL") {
			return nil, nil, false
		}
		return nil, &s, true
	}
	var r Result
	if json.Unmarshal(line, &r) != nil || r.Group == "" || r.Name == "" {
		return nil, nil, false
	}
	switch r.Status {
	case OK, Warn, Fail:
	default:
		return nil, nil, false
	}
	return &r, nil, true
}
