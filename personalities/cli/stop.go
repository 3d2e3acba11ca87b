package cli

import (
	"context"
	"fmt"
)

// StopCmd is `capsem stop VM`.
type StopCmd struct {
	VM string `arg:"" help:"The VM's name or id. A persistent VM keeps its state; an ephemeral one is removed."`
}

// Run stops the VM.
func (c *StopCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	v, err := cl.Stop(ctx, c.VM)
	if err != nil {
		return err
	}
	if v.Persistent {
		fmt.Printf("%s stopped (resume it with: capsem resume %s)\n", c.VM, v.Name)
	} else {
		fmt.Printf("%s stopped and removed\n", c.VM)
	}
	return nil
}
