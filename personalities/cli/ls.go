package cli

import (
	"context"
	"fmt"
)

// LsCmd is `capsem ls`.
type LsCmd struct {
	JSON bool `help:"Print the VMs as JSON."`
}

// Run lists the VMs.
func (c *LsCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	vms, err := cl.List(ctx)
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(vms)
	}
	var rows [][]string
	for _, v := range vms {
		kind := "ephemeral"
		switch {
		case v.Persistent:
			kind = "persistent"
		case v.Run:
			kind = "run" // removed when its capsem run ends
		}
		rows = append(rows, []string{v.ID, orDash(v.Name), string(v.State), kind, fmt.Sprintf("%d MB", v.RAMMB), fmt.Sprint(v.CPUs), age(v.CreatedAt)})
	}
	table([]string{"ID", "NAME", "STATE", "KIND", "MEMORY", "CPUS", "AGE"}, rows)
	return nil
}
