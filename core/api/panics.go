package api

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/capsem/capsem/core/logs"
)

// RoutePanics lists the Go panics and fatal errors in capsem's logs on
// this host (GET ?since=&limit=: PanicsResult; since as ParseSince).
const RoutePanics = "/v1/panics"

// Bounds of a panics answer.
const (
	DefaultPanics = 20
	MaxPanics     = 200
)

// PanicReport is a panic found in one of capsem's logs.
type PanicReport struct {
	logs.Panic
	// Component is who crashed: service, mcp, process (a VM's) or
	// aggregator (a VM's gateway's).
	Component string `json:"component"`
	VM        string `json:"vm,omitempty"` // the VM of a process or aggregator
	Log       string `json:"log"`          // the log it was found in, the home directory as ~
}

// PanicsResult is the panics found, the latest first.
type PanicsResult struct {
	Panics []PanicReport `json:"panics"`
	// Omitted counts the older ones past the limit.
	Omitted int `json:"omitted,omitempty"`
}

// PanicsRequest filters the panics.
type PanicsRequest struct {
	Since time.Time // zero: all
	Limit int       // 0: DefaultPanics
}

// Query is r as RoutePanics' query.
func (r PanicsRequest) Query() url.Values {
	q := url.Values{}
	if !r.Since.IsZero() {
		q.Set("since", r.Since.UTC().Format(time.RFC3339Nano))
	}
	if r.Limit != 0 {
		q.Set("limit", strconv.Itoa(r.Limit))
	}
	return q
}

// ParsePanicsQuery reads RoutePanics' query, refusing what it does not
// know or cannot read, by name.
func ParsePanicsQuery(q url.Values, now time.Time) (PanicsRequest, error) {
	var r PanicsRequest
	err := parseQuery(q,
		queryField{"since", func(v string) (err error) { r.Since, err = ParseSince(v, now); return err }},
		queryField{"limit", func(v string) (err error) {
			if r.Limit, err = strconv.Atoi(v); err != nil || r.Limit < 0 || r.Limit > MaxPanics {
				return fmt.Errorf("limit %q: want 1 to %d (0: %d)", v, MaxPanics, DefaultPanics)
			}
			return nil
		}})
	return r, err
}
