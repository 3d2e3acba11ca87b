package hostmcp

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
)

type (
	PanicsIn struct {
		Since string `json:"since,omitempty" jsonschema:"only reports at or after this: an RFC 3339 time or a duration back from now (15m, 2h)"`
		Limit int    `json:"limit,omitempty" jsonschema:"at most this many, the latest (default 20, at most 200)"`
	}
	PanicsOut struct {
		Panics  []PanicOut `json:"panics" jsonschema:"the latest first"`
		Omitted int        `json:"omitted,omitempty" jsonschema:"older reports left out (past limit)"`
	}
	PanicOut struct {
		TS        string   `json:"ts,omitempty" jsonschema:"the time of the last log record before it"`
		Component string   `json:"component" jsonschema:"who crashed: service, mcp, process (a VM's) or aggregator (a VM's gateway's MCP servers' host)"`
		VM        string   `json:"vm,omitempty"`
		Log       string   `json:"log" jsonschema:"the log it was found in"`
		Message   string   `json:"message"`
		Fatal     bool     `json:"fatal,omitempty" jsonschema:"a fatal error or a crash by a signal, not a panic"`
		Goroutine int      `json:"goroutine,omitempty"`
		Location  string   `json:"location,omitempty" jsonschema:"where it was raised: function and file:line"`
		Frames    []string `json:"frames,omitempty"`
	}
)

func (t *tools) panics(ctx context.Context, _ *mcp.CallToolRequest, in PanicsIn) (*mcp.CallToolResult, PanicsOut, error) {
	since, err := api.ParseSince(in.Since, time.Now())
	if err != nil {
		return nil, PanicsOut{}, err
	}
	r, err := t.svc.Panics(ctx, api.PanicsRequest{Since: since, Limit: in.Limit})
	if err != nil {
		return nil, PanicsOut{}, err
	}
	out := PanicsOut{Panics: []PanicOut{}, Omitted: r.Omitted}
	for _, p := range r.Panics {
		out.Panics = append(out.Panics, PanicOut{TS: p.Time, Component: p.Component, VM: p.VM, Log: p.Log, Message: p.Message, Fatal: p.Fatal,
			Goroutine: p.Goroutine, Location: p.Location, Frames: p.Frames})
	}
	return nil, out, nil
}

type (
	TriageIn struct {
		ID    string `json:"id,omitempty" jsonschema:"a VM's id or name: also what its ledger recorded (connections and DNS queries refused, MCP calls failed or denied, commands failed)"`
		Since string `json:"since,omitempty" jsonschema:"only what happened at or after this: an RFC 3339 time or a duration back from now (default 24h)"`
		Limit int    `json:"limit,omitempty" jsonschema:"at most this many findings, the gravest (default 20, at most 200)"`
	}
	TriageOut struct {
		Since    string       `json:"since"`
		Findings []FindingOut `json:"findings" jsonschema:"ranked: by severity (critical, error, warning, info), then count, then how recently"`
		Omitted  int          `json:"omitted,omitempty"`
	}
	FindingOut struct {
		Severity string `json:"severity"`
		Kind     string `json:"kind" jsonschema:"panic, error_log, warning_log, failed_request, refused_request, slow_request, denied_network, mcp_error or failed_exec"`
		Summary  string `json:"summary"`
		Example  string `json:"example,omitempty" jsonschema:"one occurrence in full"`
		Count    int    `json:"count"`
		First    string `json:"first,omitempty"`
		Last     string `json:"last,omitempty"`
		Source   string `json:"source" jsonschema:"the log it was found in, or session.db"`
	}
)

func (t *tools) triage(ctx context.Context, _ *mcp.CallToolRequest, in TriageIn) (*mcp.CallToolResult, TriageOut, error) {
	since, err := api.ParseSince(in.Since, time.Now())
	if err != nil {
		return nil, TriageOut{}, err
	}
	r, err := t.svc.Triage(ctx, api.TriageRequest{VM: in.ID, Since: since, Limit: in.Limit})
	if err != nil {
		return nil, TriageOut{}, err
	}
	out := TriageOut{Since: r.Since, Findings: []FindingOut{}, Omitted: r.Omitted}
	for _, f := range r.Findings {
		out.Findings = append(out.Findings, FindingOut(f))
	}
	return nil, out, nil
}
