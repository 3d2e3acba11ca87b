package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/logs"
)

// CreateCmd is `capsem create [NAME]`.
type CreateCmd struct {
	Name         string `arg:"" optional:"" help:"A name makes the VM persistent (stop keeps its state for resume); without one it is removed when it stops."`
	Image        string `name:"image" help:"An image made by capsem fork to boot from: its disk, workspace and settings (flags given here win)."`
	api.VMConfig `embed:""`
	JSON         bool `help:"Print the VM as JSON."`
}

// Run creates the VM and prints it.
func (c *CreateCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	progress := logs.NewProgress(slog.Default(), "starting the VM")
	stage := func(s string) { progress.Stage(s, api.StageLogLevel(s)) }
	v, err := cl.CreateStream(ctx, api.CreateRequest{Name: c.Name, Image: c.Image, VMConfig: c.VMConfig}, stage)
	progress.Done()
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(v)
	}
	fmt.Println(v.ID)
	return nil
}
