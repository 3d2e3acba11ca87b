//go:build cgo

package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
)

// TimelineTimeout bounds reading a timeline.
const TimelineTimeout = 10 * time.Second

// timelineLayers are each layer's rows as timeline events: the table, and
// the summary of a row in SQL (short; long fields cut).
var timelineLayers = map[string]struct{ table, summary string }{
	api.LayerExec: {"exec_events", `printf('%s: %s → %s (%d ms)', source, substr(coalesce(command, '?'), 1, 160),
		CASE WHEN pending THEN 'running' WHEN timed_out THEN 'timed out' ELSE 'exit ' || coalesce(exit_code, '?') END, duration_ms)`},
	api.LayerMCP: {"mcp_calls", `printf('%s%s by %s: %s%s (%d ms)', coalesce(method, '?'), coalesce(' ' || tool_name, ''), coalesce(process_name, '?'),
		CASE WHEN pending THEN 'pending' ELSE decision END,
		coalesce(' — ' || substr(coalesce(policy_reason, error_message), 1, 160), ''), duration_ms)`},
	api.LayerNet: {"net_events", `printf('%s %s:%d %s%s%s%s', conn_type, coalesce(domain, ip, '?'), port, coalesce(decision, '?'),
		coalesce(' ' || method || ' ' || substr(coalesce(path, ''), 1, 120), ''),
		CASE WHEN status_code > 0 THEN ' → ' || status_code ELSE '' END,
		coalesce(' — ' || substr(coalesce(policy_reason, error_message), 1, 160), ''))`},
	api.LayerDNS: {"dns_events", `printf('%s %s → %s %s%s', coalesce(qtype, '?'), coalesce(name, '?'), rcode, decision, coalesce(' ' || substr(answers, 1, 120), ''))`},
	api.LayerFS: {"fs_events", `printf('%s%s %s (%d bytes)%s', coalesce(direction || ' ', ''), operation, substr(path, 1, 160), size,
		coalesce(' ' || outcome, '') || coalesce(' — ' || substr(error_message, 1, 160), ''))`},
	api.LayerModel: {"model_calls", `printf('%s %s by %s: %d in, %d out tokens, status %d (%d ms)', coalesce(provider, '?'), coalesce(model, '?'),
		coalesce(process_name, '?'), input_tokens, output_tokens, status_code, duration_ms)`},
}

// Timeline reads the rows of the session ledger at path as one stream of
// events in time order: of the layers asked for, at or after Since, of one
// trace when TraceID is set; the latest Limit of them, with the count of
// earlier ones left out. The database is opened read-only.
func Timeline(ctx context.Context, path string, req api.TimelineRequest) (api.TimelineResult, error) {
	if err := req.Check(); err != nil {
		return api.TimelineResult{}, err
	}
	limit := req.Limit
	if limit == 0 {
		limit = api.DefaultTimelineEvents
	}
	layers := req.Layers
	if len(layers) == 0 {
		layers = api.TimelineLayers
	}
	ctx, cancel := context.WithTimeout(ctx, TimelineTimeout)
	defer cancel()
	db, conn, err := openReadOnly(ctx, path)
	if err != nil {
		return api.TimelineResult{}, err
	}
	defer db.Close()
	defer conn.Close()

	var parts []string
	for _, l := range api.TimelineLayers { // fixed order: the SQL depends on the set only
		if !slices.Contains(layers, l) {
			continue
		}
		tl := timelineLayers[l]
		parts = append(parts, fmt.Sprintf(`SELECT timestamp AS ts, '%s' AS layer, %d AS ord, id, trace_id, substr(%s, 1, %d) AS summary FROM %s
			WHERE timestamp >= :since AND (:trace = '' OR trace_id = :trace)`,
			l, slices.Index(api.TimelineLayers, l), tl.summary, api.MaxTimelineSummary, tl.table))
	}
	union := strings.Join(parts, " UNION ALL ")
	args := []any{sql.Named("since", stamp(req.Since)), sql.Named("trace", req.TraceID)}
	if req.Since.IsZero() {
		args[0] = sql.Named("since", "")
	}
	// One read transaction: the count and the rows see the same snapshot
	// while the VM writes on.
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return api.TimelineResult{}, fmt.Errorf("ledger: timeline: %w", err)
	}
	defer tx.Rollback()
	var res api.TimelineResult
	var total int64
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM ("+union+")", args...).Scan(&total); err != nil {
		return api.TimelineResult{}, fmt.Errorf("ledger: timeline: %w", err)
	}
	rows, err := tx.QueryContext(ctx, "SELECT ts, layer, id, coalesce(trace_id, ''), summary FROM ("+union+") ORDER BY ts DESC, ord DESC, id DESC LIMIT :limit",
		append(args, sql.Named("limit", limit))...)
	if err != nil {
		return api.TimelineResult{}, fmt.Errorf("ledger: timeline: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e api.TimelineEvent
		if err := rows.Scan(&e.Timestamp, &e.Layer, &e.ID, &e.TraceID, &e.Summary); err != nil {
			return api.TimelineResult{}, fmt.Errorf("ledger: timeline: %w", err)
		}
		res.Events = append(res.Events, e)
	}
	if err := rows.Err(); err != nil {
		return api.TimelineResult{}, fmt.Errorf("ledger: timeline: %w", err)
	}
	slices.Reverse(res.Events)
	res.Omitted = total - int64(len(res.Events))
	if res.Events == nil {
		res.Events = []api.TimelineEvent{}
	}
	return res, nil
}
