package cli

import (
	"context"
	"fmt"
)

// PurgeCmd is `capsem purge [--all]`.
type PurgeCmd struct {
	All bool `help:"Persistent VMs too."`
}

// Run destroys every ephemeral VM (every VM with --all).
func (c *PurgeCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	r, err := cl.Purge(ctx, c.All)
	if err != nil {
		return err
	}
	fmt.Printf("%d VM(s) removed\n", len(r.Removed))
	return nil
}
