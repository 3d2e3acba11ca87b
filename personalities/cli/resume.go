package cli

import (
	"context"
	"fmt"
)

// ResumeCmd is `capsem resume NAME`.
type ResumeCmd struct {
	VM string `arg:"" help:"The stopped persistent VM's name or id."`
}

// Run boots the VM again.
func (c *ResumeCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	v, err := cl.Resume(ctx, c.VM)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", v.Name, v.State)
	return nil
}
