// Package guestdoctor is `capsem-doctor`, the guest's health check: run
// inside a VM (`capsem run -- capsem-doctor -k mcp`), it checks the
// properties the VM promises, on the running guest, and prints one line per
// check (core/doctor) ending in RESULT: PASS or RESULT: FAIL, with the exit
// status to match. Groups: env, fs, exec, mcp, net, sandbox.
package guestdoctor

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/exitcode"
)

// Cmd is `capsem-doctor` (the guest-doctor subcommand).
type Cmd struct {
	Groups    []string `short:"k" name:"group" help:"Check group to run (repeatable; default all): env, fs, exec, mcp, net, sandbox."`
	JSON      bool     `name:"json" help:"Print JSON lines: one per check, then a summary."`
	ExpectEnv []string `name:"expect-env" help:"K=V that must be in this process's environment (as injected by the host), repeatable."`
	URL       string   `name:"url" help:"An http(s) URL the VM's [net] policy allows: the net group fetches it (without it, that check says so and passes)."`
}

// Run runs the selected groups.
func (c *Cmd) Run(ctx context.Context) error {
	expect := map[string]string{}
	for _, kv := range c.ExpectEnv {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--expect-env %q: want KEY=VALUE", kv)
		}
		expect[k] = v
	}
	groups, err := doctor.Select(checks(expect, c.URL), c.Groups)
	if err != nil {
		return err
	}
	if doctor.Run(ctx, doctor.NewReporter(os.Stdout, c.JSON), groups).Result != "PASS" {
		return exitcode.Error{Code: 1}
	}
	return nil
}
