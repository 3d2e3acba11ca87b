package api

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Layers of a VM's timeline: one per ledger table.
const (
	LayerExec  = "exec"  // exec_events: commands run in the VM
	LayerMCP   = "mcp"   // mcp_calls: the gateway's calls
	LayerNet   = "net"   // net_events: connections and HTTP requests
	LayerDNS   = "dns"   // dns_events: the guest's DNS queries
	LayerFS    = "fs"    // fs_events: files moved through the API
	LayerModel = "model" // model_calls: model API requests
)

// TimelineLayers are every layer, in the order events of one instant are
// listed.
var TimelineLayers = []string{LayerExec, LayerMCP, LayerDNS, LayerNet, LayerModel, LayerFS}

// Bounds of a timeline answer.
const (
	DefaultTimelineEvents = 200
	MaxTimelineEvents     = 5000
	// MaxTimelineSummary bounds one event's summary, in characters.
	MaxTimelineSummary = 400
)

// TimelineRequest asks for a VM's timeline (the query of RouteVMTimeline).
type TimelineRequest struct {
	// TraceID keeps the events of one trace ("": all).
	TraceID string
	// Since keeps the events at or after it (zero: from the start).
	Since time.Time
	// Layers keeps those layers (nil: every one).
	Layers []string
	// Limit bounds the events (0: DefaultTimelineEvents): the latest ones.
	Limit int
}

// Check reports what makes r unusable, naming it.
func (r TimelineRequest) Check() error {
	if err := CheckTraceID(r.TraceID); err != nil {
		return err
	}
	for _, l := range r.Layers {
		if !slices.Contains(TimelineLayers, l) {
			return fmt.Errorf("layer %q: want one of %s", l, strings.Join(TimelineLayers, ", "))
		}
	}
	if r.Limit < 0 || r.Limit > MaxTimelineEvents {
		return fmt.Errorf("limit %d: want 1 to %d (0: %d)", r.Limit, MaxTimelineEvents, DefaultTimelineEvents)
	}
	return nil
}

// ParseSince reads a since bound: an RFC 3339 time, or a duration back
// from now ("15m", "2h").
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-12-03T12:00:00Z) or a duration back from now (15m, 2h)", s)
	}
	return now.Add(-d).UTC(), nil
}

// TimelineEvent is one row of a VM's ledger on its timeline.
type TimelineEvent struct {
	Timestamp string `json:"ts"` // the row's timestamp (RFC 3339, UTC)
	Layer     string `json:"layer"`
	ID        int64  `json:"id"` // the row's id in its layer's table
	TraceID   string `json:"trace_id,omitempty"`
	Summary   string `json:"summary"`
}

// TimelineResult is a VM's timeline: its events in time order.
type TimelineResult struct {
	Events []TimelineEvent `json:"events"`
	// Omitted counts the earlier events that matched but were left out
	// (past Limit).
	Omitted int64 `json:"omitted,omitempty"`
}

// Query is r as RouteVMTimeline's query.
func (r TimelineRequest) Query() url.Values {
	q := url.Values{}
	if r.TraceID != "" {
		q.Set("trace_id", r.TraceID)
	}
	if !r.Since.IsZero() {
		q.Set("since", r.Since.UTC().Format(time.RFC3339Nano))
	}
	if len(r.Layers) > 0 {
		q.Set("layers", strings.Join(r.Layers, ","))
	}
	if r.Limit != 0 {
		q.Set("limit", strconv.Itoa(r.Limit))
	}
	return q
}

// ParseTimelineQuery reads RouteVMTimeline's query (since relative to
// now), refusing a parameter it does not know or cannot read, by name.
func ParseTimelineQuery(q url.Values, now time.Time) (TimelineRequest, error) {
	var r TimelineRequest
	err := parseQuery(q,
		queryField{"trace_id", func(v string) error { r.TraceID = v; return nil }},
		queryField{"since", func(v string) (err error) { r.Since, err = ParseSince(v, now); return err }},
		queryField{"layers", func(v string) error { r.Layers = strings.Split(v, ","); return nil }},
		queryField{"limit", func(v string) (err error) {
			if r.Limit, err = strconv.Atoi(v); err != nil {
				return fmt.Errorf("limit %q: not a number", v)
			}
			return nil
		}})
	if err != nil {
		return r, err
	}
	return r, r.Check()
}
