package cli

import (
	"context"
	"fmt"

	"github.com/capsem/capsem/core/printable"
)

// LogsCmd is `capsem logs VM` (or `capsem logs --service`).
type LogsCmd struct {
	VM      string `arg:"" optional:"" help:"The VM's name or id."`
	Service bool   `help:"The service's own log instead of a VM's."`
	Tail    int    `short:"n" help:"Only the last N lines (default 200)."`
	Grep    string `help:"Only lines containing this text."`
	Raw     bool   `help:"Print the logs as they are, control characters included (the guest writes them: they can drive your terminal). By default they are shown escaped (ESC as \\x1b)."`
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
	show := printable.Text
	if c.Raw {
		show = func(s string) string { return s }
	}
	if c.Service {
		r, err := cl.ServiceLogs(ctx, c.Tail, c.Grep)
		if err != nil {
			return err
		}
		fmt.Print(show(r.Service))
		return nil
	}
	r, err := cl.Logs(ctx, c.VM, c.Tail, c.Grep)
	if err != nil {
		return err
	}
	fmt.Println("== serial console ==")
	fmt.Print(show(r.Serial))
	fmt.Println("== VM process ==")
	fmt.Print(show(r.Process))
	return nil
}
