package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/printable"
)

// InspectCmd is `capsem inspect VM SQL` (or --schema).
type InspectCmd struct {
	VM      string `arg:"" help:"The VM's name or id."`
	SQL     string `arg:"" optional:"" help:"One read-only SQL statement on the VM's session.db."`
	Schema  bool   `help:"Print the ledger's CREATE TABLE statements."`
	MaxRows int    `help:"At most this many rows (default 100)."`
	JSON    bool   `help:"Print the answer as JSON."`
	Raw     bool   `help:"Print the cells as they are, control characters included (the guest writes much of the ledger: they can drive your terminal). By default they are shown escaped (ESC as \\x1b)."`
}

// Run queries the VM's ledger.
func (c *InspectCmd) Run(ctx context.Context) error {
	cl, err := client()
	if err != nil {
		return err
	}
	if c.Schema {
		r, err := cl.Schema(ctx, c.VM)
		if err != nil {
			return err
		}
		schema := strings.Join(r.Tables, ";\n\n") + ";"
		if !c.Raw {
			schema = printable.Text(schema)
		}
		fmt.Println(schema)
		return nil
	}
	if c.SQL == "" {
		return fmt.Errorf("give a SQL statement, or --schema")
	}
	r, err := cl.Inspect(ctx, c.VM, api.InspectRequest{SQL: c.SQL, MaxRows: c.MaxRows})
	if err != nil {
		return err
	}
	if c.JSON {
		return printJSON(r)
	}
	show := printable.Line
	if c.Raw {
		// As they are, but on one line: the table's shape is ours.
		show = strings.NewReplacer("\n", `\n`, "\t", `\t`).Replace
	}
	header := make([]string, len(r.Columns))
	for i, col := range r.Columns {
		header[i] = show(col)
	}
	rows := make([][]string, len(r.Rows))
	for i, row := range r.Rows {
		for _, v := range row {
			rows[i] = append(rows[i], show(cell(v)))
		}
	}
	table(header, rows)
	switch {
	case r.TruncatedBy == api.TruncatedByBytes:
		fmt.Printf("(more rows: the answer reached its %d MiB bound; select fewer or shorter columns)\n", api.MaxInspectAnswerBytes>>20)
	case r.TruncatedBy == api.TruncatedByRows, r.Truncated && r.TruncatedBy == "" && r.CutCells == 0:
		fmt.Printf("(more rows: raise --max-rows)\n")
	}
	if r.CutCells > 0 {
		fmt.Printf("(%d cell(s) cut to their first bytes: read a long value in parts with substr())\n", r.CutCells)
	}
	return nil
}

// cell is a value as text.
func cell(v any) string {
	if cut, ok := api.AsCutCell(v); ok {
		return fmt.Sprintf("%s…[cut: %d bytes in all]", cell(cut.Value), cut.Bytes)
	}
	switch v := v.(type) {
	case nil:
		return "NULL"
	case float64:
		if v == float64(int64(v)) {
			return fmt.Sprint(int64(v))
		}
	case string:
		return v
	}
	return fmt.Sprint(v)
}
