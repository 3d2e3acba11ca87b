// Package envcmd is `capsem env`: the CAPSEM_* environment settings (the
// registry in core/envvars), what each means, and its value here, checked
// as capsem's commands would read it.
package envcmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/printable"
)

// Cmd is `capsem env`.
type Cmd struct {
	All bool `help:"Also list the variables capsem processes set for one another and those of the tests."`
}

// Run prints the settings.
func (c *Cmd) Run(context.Context) error {
	return Write(os.Stdout, os.LookupEnv, c.All)
}

// Write prints each setting (every declared variable when all is set) with
// its value in the environment lookup reads: a line NAME=value (or NAME
// unset), then its meaning, then its kind, what unset means and whether the
// service passes it on to the VMs' processes; a value the readers refuse
// gets a line saying why.
func Write(w io.Writer, lookup func(string) (string, bool), all bool) error {
	var b strings.Builder
	for _, s := range envvars.All() {
		if s.Audience() != envvars.User && !all {
			continue
		}
		value, set := lookup(s.Name())
		if set {
			fmt.Fprintf(&b, "%s=%s\n", s.Name(), printable.Line(value))
		} else {
			fmt.Fprintf(&b, "%s unset\n", s.Name())
		}
		fmt.Fprintf(&b, "    %s\n", s.Meaning())
		about := []string{s.Kind()}
		if s.Unset() != "" {
			about = append(about, "unset: "+s.Unset())
		}
		if s.PassedOn() {
			about = append(about, "passed on to VM processes")
		}
		if s.Audience() != envvars.User {
			about = append(about, s.Audience().String()+", read by "+s.Readers().String())
		}
		fmt.Fprintf(&b, "    %s\n", strings.Join(about, "; "))
		if err := s.Check(value); err != nil {
			fmt.Fprintf(&b, "    refused: %s\n", printable.Line(err.Error()))
		}
	}
	if !all {
		b.WriteString("(capsem env --all lists the internal and test variables too)\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
