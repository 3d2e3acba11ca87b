package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/printable"
)

// TimelineCmd is `capsem timeline VM`.
type TimelineCmd struct {
	VM      string   `arg:"" help:"The VM's name or id."`
	TraceID string   `name:"trace-id" help:"Only the events of this trace (capsem exec --trace-id: the command and what it caused)."`
	Since   string   `help:"Only events at or after this: an RFC 3339 time or a duration back from now (15m, 2h)."`
	Layer   []string `name:"layer" enum:"exec,mcp,dns,net,model,fs" help:"Only this layer (repeatable): exec, mcp, dns, net, model, fs."`
	Limit   int      `help:"At most this many events, the latest (default 200)."`
	JSON    bool     `help:"Print the events as JSON."`
}

// Run prints the VM's timeline, one event a line.
func (c *TimelineCmd) Run(ctx context.Context) error {
	since, err := api.ParseSince(c.Since, time.Now())
	if err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	cl, err := client()
	if err != nil {
		return err
	}
	r, err := cl.Timeline(ctx, c.VM, api.TimelineRequest{TraceID: c.TraceID, Since: since, Layers: c.Layer, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(r)
	}
	if r.Omitted > 0 {
		fmt.Printf("(%d earlier events left out: --limit or --since)\n", r.Omitted)
	}
	for _, e := range r.Events {
		trace := ""
		if e.TraceID != "" {
			trace = " [" + e.TraceID + "]"
		}
		// The guest writes much of the ledger: its text is shown escaped.
		fmt.Printf("%s  %-5s %s%s\n", e.Timestamp, e.Layer, printable.Text(e.Summary), trace)
	}
	return nil
}
