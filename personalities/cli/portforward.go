package cli

import (
	"context"
	"fmt"

	"github.com/capsem/capsem/core/api"
)

// PortForwardCmd is `capsem port-forward VM [ADDR:]HOST:GUEST`.
type PortForwardCmd struct {
	VM      string `arg:"" help:"The running VM's name or id."`
	Mapping string `arg:"" placeholder:"[ADDR:]HOST:GUEST" help:"The host's port HOST (on loopback unless ADDR is given) to the guest's port GUEST: 8080:3000, 0.0.0.0:8080:3000."`
}

// Run publishes the port, for as long as the VM runs.
func (c *PortForwardCmd) Run(ctx context.Context) error {
	m, err := api.ParsePortMapping(c.Mapping)
	if err != nil {
		return err
	}
	cl, err := client()
	if err != nil {
		return err
	}
	out, err := cl.Publish(ctx, c.VM, m)
	if err != nil {
		return err
	}
	fmt.Printf("%s -> %s port %d (while it runs)\n", out.Listen(), c.VM, out.Guest)
	return nil
}
