package cli

import (
	"context"
	"fmt"
)

// LogsCmd is `capsem logs VM` (or `capsem logs --service`).
type LogsCmd struct {
	VM      string `arg:"" optional:"" help:"The VM's name or id."`
	Service bool   `help:"The service's own log instead of a VM's."`
	Tail    int    `short:"n" help:"Only the last N lines (default 200)."`
	Grep    string `help:"Only lines containing this text."`
}

// Run prints the logs.
func (c *LogsCmd) Run(ctx context.Context) error {
	if c.Service == (c.VM != "") {
		return fmt.Errorf("name a VM, or give --service")
	}
	cl, err := client()
	if err != nil {
		return err
	}
	if c.Service {
		r, err := cl.ServiceLogs(ctx, c.Tail, c.Grep)
		if err != nil {
			return err
		}
		fmt.Print(r.Service)
		return nil
	}
	r, err := cl.Logs(ctx, c.VM, c.Tail, c.Grep)
	if err != nil {
		return err
	}
	fmt.Println("== serial console ==")
	fmt.Print(r.Serial)
	fmt.Println("== VM process ==")
	fmt.Print(r.Process)
	return nil
}
