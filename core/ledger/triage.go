//go:build cgo

package ledger

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/capsem/capsem/core/api"
)

// triageGroupLimit bounds the groups one triage query returns.
const triageGroupLimit = 50

// triageQueries group a session's troubles since a time: each yields
// severity, kind, summary, example, count, first and last.
var triageQueries = []string{
	// Connections the policy refused, by name.
	`SELECT 'warning', 'denied_network', printf('connections to %s:%d refused', coalesce(domain, ip, '?'), port),
		substr(coalesce(policy_reason, error_message, ''), 1, 300), count(*), min(timestamp), max(timestamp)
	FROM net_events WHERE decision = 'denied' AND timestamp >= :since GROUP BY domain, ip, port`,
	// DNS queries the policy refused, by name.
	`SELECT 'warning', 'denied_network', printf('DNS queries for %s refused', coalesce(name, '?')),
		substr(coalesce(policy_reason, ''), 1, 300), count(*), min(timestamp), max(timestamp)
	FROM dns_events WHERE decision = 'denied' AND timestamp >= :since GROUP BY name`,
	// MCP calls that failed or were refused, by method, tool and reason.
	`SELECT CASE decision WHEN 'error' THEN 'error' ELSE 'warning' END, 'mcp_error',
		printf('%s%s %s', method, coalesce(' ' || tool_name, ''), CASE decision WHEN 'error' THEN 'failed' ELSE 'denied' END),
		substr(coalesce(error_message, policy_reason, ''), 1, 300), count(*), min(timestamp), max(timestamp)
	FROM mcp_calls WHERE decision IN ('error', 'denied') AND pending = 0 AND timestamp >= :since
	GROUP BY method, tool_name, decision, coalesce(error_message, policy_reason)`,
	// Commands that failed or ran out of time, by command.
	`SELECT 'warning', 'failed_exec',
		printf('%s: %s', CASE WHEN timed_out THEN 'timed out' ELSE 'exit ' || exit_code END, substr(coalesce(command, '?'), 1, 160)),
		substr(coalesce(stderr_preview, ''), 1, 300), count(*), min(timestamp), max(timestamp)
	FROM exec_events WHERE pending = 0 AND (timed_out OR exit_code != 0) AND timestamp >= :since
	GROUP BY command, timed_out, exit_code`,
}

// Triage groups the troubles the session ledger at path recorded since a
// time: connections and DNS queries the policy refused, MCP calls that
// failed or were denied, commands that failed or timed out.
func Triage(ctx context.Context, path string, since time.Time) ([]api.TriageFinding, error) {
	ctx, cancel := context.WithTimeout(ctx, TimelineTimeout)
	defer cancel()
	db, conn, err := openReadOnly(ctx, path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	defer conn.Close()
	var out []api.TriageFinding
	for _, q := range triageQueries {
		rows, err := conn.QueryContext(ctx, q+fmt.Sprintf(" ORDER BY count(*) DESC LIMIT %d", triageGroupLimit), sql.Named("since", stamp(since)))
		if err != nil {
			return nil, fmt.Errorf("ledger: triage: %w", err)
		}
		for rows.Next() {
			f := api.TriageFinding{Source: "session.db"}
			if err := rows.Scan(&f.Severity, &f.Kind, &f.Summary, &f.Example, &f.Count, &f.First, &f.Last); err != nil {
				rows.Close()
				return nil, fmt.Errorf("ledger: triage: %w", err)
			}
			out = append(out, f)
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("ledger: triage: %w", err)
		}
	}
	return out, nil
}
