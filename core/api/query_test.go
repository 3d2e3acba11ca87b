package api

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestParseQueries(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, raw, wantErr string
		parse              func(url.Values) (any, error)
		want               any
	}{
		{"panics", "since=15m&limit=3", "", panicsOf(now), PanicsRequest{Since: now.Add(-15 * time.Minute), Limit: 3}},
		{"panics, none", "", "", panicsOf(now), PanicsRequest{}},
		{"panics, twice", "limit=1&limit=2", "query parameter limit: given 2 times, want once", panicsOf(now), nil},
		{"panics, unknown", "vm=a", "query parameter vm: unknown (want since, limit)", panicsOf(now), nil},
		{"panics, limit over", "limit=100000", `limit "100000": want 1 to`, panicsOf(now), nil},
		{"triage", "vm=dev&since=2026-12-03T11:00:00Z&limit=5", "", triageOf(now), TriageRequest{VM: "dev", Since: now.Add(-time.Hour), Limit: 5}},
		{"triage, unknown", "trace_id=x", "query parameter trace_id: unknown (want vm, since, limit)", triageOf(now), nil},
		{"triage, bad since", "since=yesterday", "since", triageOf(now), nil},
		{"triage, negative limit", "limit=-1", `limit "-1": want 1 to`, triageOf(now), nil},
	} {
		q, err := url.ParseQuery(tc.raw)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tc.parse(q)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !sameRequest(got, tc.want) {
			t.Errorf("%s: %+v, %v; want %+v", tc.name, got, err, tc.want)
		}
	}
}

func panicsOf(now time.Time) func(url.Values) (any, error) {
	return func(q url.Values) (any, error) { return ParsePanicsQuery(q, now) }
}

func triageOf(now time.Time) func(url.Values) (any, error) {
	return func(q url.Values) (any, error) { return ParseTriageQuery(q, now) }
}

// sameRequest compares two requests, their times as instants.
func sameRequest(a, b any) bool {
	switch a := a.(type) {
	case PanicsRequest:
		b := b.(PanicsRequest)
		return a.Since.Equal(b.Since) && a.Limit == b.Limit
	case TriageRequest:
		b := b.(TriageRequest)
		return a.VM == b.VM && a.Since.Equal(b.Since) && a.Limit == b.Limit
	}
	return false
}

// fuzzRoundTrip: whatever query parse accepts, written back by the
// request's Query, reads as the same request.
func fuzzRoundTrip[R interface{ Query() url.Values }](f *testing.F, seeds []string, parse func(url.Values, time.Time) (R, error)) {
	for _, s := range seeds {
		f.Add(s)
	}
	now := time.Now()
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		r, err := parse(q, now)
		if err != nil {
			return
		}
		back, err := parse(r.Query(), now)
		if err != nil || !sameRequest(r, back) {
			t.Fatalf("%q read as %+v, written back as %q, read again as %+v (%v)", raw, r, r.Query().Encode(), back, err)
		}
	})
}

func FuzzParsePanicsQuery(f *testing.F) {
	fuzzRoundTrip(f, []string{"since=15m&limit=3", "since=2026-12-03T12:00:00Z", "limit=99999999999999999999", "x=1", "limit=1&limit=1"}, ParsePanicsQuery)
}

func FuzzParseTriageQuery(f *testing.F) {
	fuzzRoundTrip(f, []string{"vm=dev&since=15m&limit=3", "vm=&since=1h", "limit=-5", "vm=a&vm=b", "since=2026-12-03T12:00:00.123456789Z"}, ParseTriageQuery)
}
