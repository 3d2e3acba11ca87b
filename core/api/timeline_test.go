package api

import (
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestTimelineQuery: a request goes through its query and back whole; a
// parameter that is unknown, repeated or unreadable is refused by name.
func TestTimelineQuery(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	want := TimelineRequest{TraceID: "t-1", Since: now.Add(-time.Hour), Layers: []string{LayerExec, LayerMCP}, Limit: 7}
	got, err := ParseTimelineQuery(want.Query(), now)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, want)
	}
	if got, err := ParseTimelineQuery(url.Values{"since": {"15m"}}, now); err != nil || !got.Since.Equal(now.Add(-15*time.Minute)) {
		t.Fatalf("since 15m: %+v, %v", got, err)
	}
	for q, want := range map[string]string{
		"trace=t-1":             "query parameter trace: unknown",
		"limit=1&limit=2":       "limit: given 2 times",
		"limit=many":            `limit "many": not a number`,
		"limit=-1":              "limit -1: want 1 to 5000",
		"since=-5m":             `since "-5m"`,
		"since=yesterday":       `since "yesterday": want an RFC 3339 time`,
		"layers=exec,disk":      `layer "disk"`,
		"trace_id=a%20b":        `trace id "a b"`,
		"trace_id=" + long(129): "trace id of 129 bytes",
	} {
		v, _ := url.ParseQuery(q)
		if _, err := ParseTimelineQuery(v, now); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error containing %q", q, err, want)
		}
	}
}

func long(n int) string { return strings.Repeat("x", n) }

// FuzzParseTimelineQuery: any query a client sends is a checked request or
// an error, never a panic.
func FuzzParseTimelineQuery(f *testing.F) {
	for _, s := range []string{"trace_id=t&since=15m&layers=exec,mcp&limit=3", "since=2026-12-03T12:00:00Z", "limit=99999999999999999999", "layers=,", "x=1"} {
		f.Add(s)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		r, err := ParseTimelineQuery(q, now)
		if err == nil && r.Check() != nil {
			t.Fatalf("%q accepted as %+v, which Check refuses", raw, r)
		}
	})
}
