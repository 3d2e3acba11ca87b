package cli

import (
	"context"
	"fmt"
)

// PersistCmd is `capsem persist VM NAME`.
type PersistCmd struct {
	VM   string `arg:"" help:"The running ephemeral VM's id."`
	Name string `arg:"" help:"The name it keeps from now on."`
}

// Run names the VM.
func (c *PersistCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	v, err := cl.Persist(ctx, c.VM, c.Name)
	if err != nil {
		return err
	}
	fmt.Printf("%s is now the persistent VM %s\n", v.ID, v.Name)
	return nil
}
