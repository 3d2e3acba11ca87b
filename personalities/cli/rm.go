package cli

import (
	"context"
	"fmt"
)

// RmCmd is `capsem rm VM...`.
type RmCmd struct {
	VMs []string `arg:"" name:"vm" help:"Names or ids of the VMs to destroy, with all their state."`
}

// Run destroys the VMs; it goes on past a failure and reports each.
func (c *RmCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	var failed error
	for _, vm := range c.VMs {
		if err := cl.Delete(ctx, vm); err != nil {
			failed = fmt.Errorf("%s: %w", vm, err)
			fmt.Println("capsem:", failed)
			continue
		}
		fmt.Println(vm, "removed")
	}
	return failed
}
