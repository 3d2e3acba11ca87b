package endpoint

import (
	"context"
	"time"

	"github.com/capsem/capsem/core/ledger"
)

// LedgerRecorder writes records to session.db: the mcp_calls row and the
// builtin's net_events rows commit together, and Record returns after commit.
type LedgerRecorder struct{ Ledger *ledger.Ledger }

// Record implements Recorder.
func (l LedgerRecorder) Record(ctx context.Context, r *Record) error {
	rows := make([]ledger.Row, 0, 1+len(r.NetEvents))
	call := &ledger.MCPCall{
		EventID:         r.EventID,
		Pending:         r.Pending,
		RequestDigest:   r.RequestDigest,
		ResponseDigest:  r.ResponseDigest,
		Timestamp:       r.Time,
		ServerName:      r.ServerName,
		Method:          r.Method,
		ToolName:        r.ToolName,
		RequestID:       r.RequestID,
		RequestPreview:  r.Request,
		ResponsePreview: r.Response,
		Decision:        ledger.Decision(r.Decision),
		DurationMS:      r.DurationMS,
		ErrorMessage:    r.ErrorMessage,
		ProcessName:     r.ProcessName,
		TraceID:         r.TraceID,
		BytesSent:       r.BytesSent,
		BytesReceived:   r.BytesReceived,
		PolicyMode:      r.PolicyMode,
		PolicyAction:    r.PolicyAction,
		PolicyRule:      r.PolicyRule,
		PolicyReason:    r.PolicyReason,
		Transport:       r.Transport,
	}
	if r.ErrorCode != 0 {
		code := r.ErrorCode
		call.ErrorCode = &code
	}
	if r.Transport == "frame" {
		sid := int64(r.StreamID)
		call.StreamID = &sid
	}
	rows = append(rows, call)
	for _, e := range r.NetEvents {
		// As the guest network's rows: the rule that decided, the action
		// and, for a refusal, why (a failure is no policy verdict).
		var action, reason string
		switch ledger.Decision(e.Decision) {
		case ledger.DecisionAllowed:
			action = "allow"
		case ledger.DecisionDenied:
			action, reason = "deny", e.Error
		}
		rows = append(rows, &ledger.NetEvent{
			Timestamp:     time.Unix(0, e.TimestampUnixNano).UTC(),
			Domain:        e.Domain,
			Port:          int64(e.Port),
			Decision:      e.Decision,
			ProcessName:   r.ProcessName,
			TraceID:       r.TraceID,
			Method:        e.Method,
			Path:          e.Path,
			Query:         e.Query,
			StatusCode:    int64(e.StatusCode),
			BytesSent:     e.BytesSent,
			BytesReceived: e.BytesReceived,
			DurationMS:    e.DurationMS,
			MatchedRule:   e.MatchedRule,
			ErrorMessage:  e.Error,
			ConnType:      "mcp_builtin",
			IP:            e.IP,
			Source:        ledger.SourceBuiltin,
			PolicyRule:    e.MatchedRule,
			PolicyAction:  action,
			PolicyReason:  reason,
		})
	}
	return l.Ledger.Write(ctx, rows...)
}
