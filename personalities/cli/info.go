package cli

import "context"

// InfoCmd is `capsem info VM`.
type InfoCmd struct {
	VM   string `arg:"" help:"The VM's name or id."`
	JSON bool   `help:"Print the VM as JSON."`
}

// Run describes the VM.
func (c *InfoCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	v, err := cl.Info(ctx, c.VM)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(v)
	}
	printVM(v)
	return nil
}
