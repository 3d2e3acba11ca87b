//go:build !cgo

package ledger

import (
	"context"
	"errors"
	"time"

	"github.com/capsem/capsem/core/api"
)

// The guest build of capsem has no cgo and never opens a ledger; these keep
// the host-only API compiling there and fail clearly if ever reached.

// MaxQueryBytes bounds the SQL text of Query.
const MaxQueryBytes = 64 << 10

// MaxQueryValueBytes bounds one value read by Query.
const MaxQueryValueBytes = 16 << 20

var errNoCgo = errors.New("ledger: this capsem build has no SQLite (built without cgo)")

// Schema is unavailable without cgo.
func Schema(context.Context, string) ([]string, error) { return nil, errNoCgo }

// Query is unavailable without cgo.
func Query(context.Context, string, string, QueryLimits) (QueryResult, error) {
	return QueryResult{}, errNoCgo
}

// Timeline is unavailable without cgo.
func Timeline(context.Context, string, api.TimelineRequest) (api.TimelineResult, error) {
	return api.TimelineResult{}, errNoCgo
}

// Triage is unavailable without cgo.
func Triage(context.Context, string, time.Time) ([]api.TriageFinding, error) {
	return nil, errNoCgo
}
