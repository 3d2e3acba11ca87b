package cli

import (
	"context"
	"fmt"

	"github.com/capsem/capsem/core/api"
)

// SuspendCmd is `capsem suspend NAME`.
type SuspendCmd struct {
	VM string `arg:"" help:"The running persistent VM's name or id."`
}

// Run suspends the VM.
func (c *SuspendCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	v, err := cl.Suspend(ctx, c.VM)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", v.Name, v.State)
	return nil
}

// ResumeCmd is `capsem resume NAME [--boot]`.
type ResumeCmd struct {
	VM   string `arg:"" help:"The stopped or suspended persistent VM's name or id."`
	Boot bool   `help:"For a suspended VM: discard its saved state and boot its disk instead."`
}

// Run starts the VM again.
func (c *ResumeCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	v, err := cl.Resume(ctx, c.VM, api.ResumeRequest{Boot: c.Boot})
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", v.Name, v.State)
	return nil
}
