package guestdoctor

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"time"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/printable"
)

// agentCLI is an AI CLI the full root ships, and how to ask it whether it
// sees the gateway: its own list of MCP servers, which for Claude Code and
// Gemini CLI starts each server and reports it connected.
type agentCLI struct {
	name    string   // the executable
	version []string // its version command's arguments
	servers []string // its MCP server list's arguments
	// connected is what the server list says of a server it reached
	// ("" when the list does not start the servers).
	connected string
}

var agentCLIs = []agentCLI{
	{name: "claude", version: []string{"--version"}, servers: []string{"mcp", "list"}, connected: "connected"},
	{name: "gemini", version: []string{"--version"}, servers: []string{"mcp", "list"}, connected: "connected"},
	{name: "codex", version: []string{"--version"}, servers: []string{"mcp", "list"}},
}

// agentWait bounds each command of a check: a cold start of a CLI under
// emulation takes seconds.
const agentWait = 2 * time.Minute

func agentChecks() []doctor.Check {
	var checks []doctor.Check
	for _, a := range agentCLIs {
		checks = append(checks, doctor.Check{Name: a.name, Run: func(ctx context.Context, r *doctor.Reporter) { checkAgent(ctx, r, a) }})
	}
	return checks
}

const cliHint = "the full root ships it wired to the gateway: see capsem doctor on the host for the image"

func checkAgent(ctx context.Context, r *doctor.Reporter, a agentCLI) {
	path, err := exec.LookPath(a.name)
	if err != nil {
		if cmdlineValue(guestwire.CmdlineLowerDisk) == "" {
			r.Warnf("create the VM with --base full for the AI CLIs", "%s: not in this VM's root (the minimal base has no AI CLIs)", a.name)
			return
		}
		r.Failf(cliHint, "%s is not on PATH in the full root: %v", a.name, err)
		return
	}
	version, err := agentRun(ctx, path, a.version...)
	if err != nil {
		r.Failf(cliHint, "%s %s: %v", a.name, strings.Join(a.version, " "), err)
		return
	}
	list, err := agentRun(ctx, path, a.servers...)
	if err != nil {
		r.Failf(cliHint, "%s %s: %v", a.name, strings.Join(a.servers, " "), err)
		return
	}
	line := serverLine(list, "capsem")
	switch {
	case line == "":
		r.Failf(cliHint, "%s does not list the gateway as MCP server capsem:\n%s", a.name, list)
	case a.connected != "" && !strings.Contains(strings.ToLower(line), a.connected):
		r.Failf("the relay could not reach the gateway: run capsem-doctor -k mcp", "%s lists capsem but not connected: %s", a.name, line)
	default:
		r.Okf("%s %s; MCP server %s", a.name, firstLine(version), line)
	}
}

// agentRun runs a CLI with nothing on stdin and returns its output (both
// streams), escaped for the terminal.
func agentRun(ctx context.Context, path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, agentWait)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	text := printable.Text(strings.TrimSpace(out.String()))
	if err != nil {
		return text, &agentError{err: err, out: text}
	}
	return text, nil
}

type agentError struct {
	err error
	out string
}

func (e *agentError) Error() string { return e.err.Error() + ": " + e.out }
func (e *agentError) Unwrap() error { return e.err }

// serverLine is the line of a server list that names server, or "".
func serverLine(list, server string) string {
	for _, l := range strings.Split(list, "\n") {
		if strings.Contains(l, server) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}
