package api

import (
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// RouteTriage ranks what went wrong lately on this host, and in one VM
// when vm is given (GET ?vm=&since=&limit=: TriageResult).
const RouteTriage = "/v1/triage"

// Bounds and defaults of a triage.
const (
	DefaultTriageFindings = 20
	MaxTriageFindings     = 200
	DefaultTriageSince    = 24 * time.Hour
)

// Severities of a finding, the gravest first.
const (
	SeverityCritical = "critical" // a crash
	SeverityError    = "error"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// Severities is every severity, the gravest first: the triage's order.
var Severities = []string{SeverityCritical, SeverityError, SeverityWarning, SeverityInfo}

// Kinds of finding.
const (
	FindingPanic          = "panic"           // a crash of a capsem process (PanicReport)
	FindingErrorLog       = "error_log"       // a log record at error level
	FindingWarningLog     = "warning_log"     // a log record at warning level
	FindingFailedRequest  = "failed_request"  // a service answer of 5xx
	FindingRefusedRequest = "refused_request" // a service answer of 4xx
	FindingSlowRequest    = "slow_request"    // a service operation slower than 500 ms
	FindingDeniedNetwork  = "denied_network"  // a VM's connection or DNS query the policy refused
	FindingMCPError       = "mcp_error"       // a VM's MCP call that failed or was denied
	FindingFailedExec     = "failed_exec"     // a VM's command that failed or timed out
)

// TriageRequest asks for a triage.
type TriageRequest struct {
	VM    string    // "": the host's logs only
	Since time.Time // zero: DefaultTriageSince ago
	Limit int       // 0: DefaultTriageFindings
}

// Query is r as RouteTriage's query.
func (r TriageRequest) Query() url.Values {
	q := url.Values{}
	if r.VM != "" {
		q.Set("vm", r.VM)
	}
	if !r.Since.IsZero() {
		q.Set("since", r.Since.UTC().Format(time.RFC3339Nano))
	}
	if r.Limit != 0 {
		q.Set("limit", strconv.Itoa(r.Limit))
	}
	return q
}

// ParseTriageQuery reads RouteTriage's query, refusing what it does not
// know or cannot read, by name.
func ParseTriageQuery(q url.Values, now time.Time) (TriageRequest, error) {
	var r TriageRequest
	err := parseQuery(q,
		queryField{"vm", func(v string) error { r.VM = v; return nil }},
		queryField{"since", func(v string) (err error) { r.Since, err = ParseSince(v, now); return err }},
		queryField{"limit", func(v string) (err error) {
			if r.Limit, err = strconv.Atoi(v); err != nil || r.Limit < 0 || r.Limit > MaxTriageFindings {
				return fmt.Errorf("limit %q: want 1 to %d (0: %d)", v, MaxTriageFindings, DefaultTriageFindings)
			}
			return nil
		}})
	return r, err
}

// TriageFinding is one kind of trouble, its occurrences grouped.
type TriageFinding struct {
	Severity string `json:"severity"`
	Kind     string `json:"kind"`
	// Summary says what happened, in one line; Example is one occurrence
	// in full (a log record, a trace's location, a command).
	Summary string `json:"summary"`
	Example string `json:"example,omitempty"`
	Count   int    `json:"count"`
	First   string `json:"first,omitempty"` // RFC 3339
	Last    string `json:"last,omitempty"`
	// Source is where it was found: a component's log (the home directory
	// as ~) or "session.db" (the VM's ledger).
	Source string `json:"source"`
}

// TriageResult is the findings ranked: by severity, then how often, then
// how recently.
type TriageResult struct {
	Since    string          `json:"since"`
	Findings []TriageFinding `json:"findings"`
	Omitted  int             `json:"omitted,omitempty"`
}
