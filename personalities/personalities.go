// Package personalities lists every personality of the capsem executable in
// one place and dispatches to it, by argv[0] (symlink name) or by subcommand.
package personalities

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"

	"github.com/alecthomas/kong"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/exitcode"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/printable"
	"github.com/capsem/capsem/core/privsep"
	"github.com/capsem/capsem/core/version"
	"github.com/capsem/capsem/personalities/agent"
)

// VersionCmd prints the version.
type VersionCmd struct{}

// Run prints the version.
func (VersionCmd) Run(context.Context) error {
	fmt.Println("capsem", version.Version)
	return nil
}

// aliases maps symlink names to the subcommand they run.
var aliases = map[string]string{
	"capsem-mcp-server": "mcp-relay",
	"capsem-doctor":     "guest-doctor",
	"init":              "agent", // /init in the guest initramfs
}

// RewriteArgs turns an alias invocation (argv[0] is a symlink name) into the
// equivalent subcommand invocation, so both share one grammar.
func RewriteArgs(args []string) []string {
	if len(args) == 0 {
		return []string{"capsem"}
	}
	if sub, ok := aliases[filepath.Base(args[0])]; ok {
		if sub == "agent" {
			// The kernel hands unrecognised command-line words to init as
			// arguments; PID 1 must not die parsing them.
			return []string{args[0], sub}
		}
		return append([]string{args[0], sub}, args[1:]...)
	}
	return args
}

// Main runs capsem and returns the exit code.
func Main(args []string) int {
	// A sandboxed child restricts itself and re-executes before anything else.
	if err := privsep.Enter(); err != nil {
		fmt.Fprintln(os.Stderr, "capsem: sandbox setup failed:", err)
		return 126
	}
	args = RewriteArgs(args)
	if isBareInit(args, os.Getpid()) {
		return runInit()
	}
	var cli CLI
	parser, err := kong.New(&cli,
		kong.Name("capsem"),
		kong.Description("Capsem: sandboxes for AI agents with an audited MCP gateway."),
		kong.UsageOnError(),
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "capsem:", err)
		return 2
	}
	kctx, err := parser.Parse(args[1:])
	if err != nil {
		parser.FatalIfErrorf(err)
		return 2
	}
	logger := logs.ForStream(os.Stderr, cli.LogLevel, cli.LogFormat)
	slog.SetDefault(logger)
	ctx := logs.WithLogger(context.Background(), logger)
	if path := envvars.CPUProfile.Get(); path != "" {
		// Developer aid: profile this process until it exits (see make bench).
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				defer pprof.StopCPUProfile()
			}
		}
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(); err != nil {
		// A command's own exit status, not a failure to report.
		if code, ok := exitcode.Of(err); ok {
			return code
		}
		// An error may quote what a guest said: escaped, it cannot drive
		// the terminal.
		fmt.Fprintln(os.Stderr, "capsem:", printable.Text(err.Error()))
		return 1
	}
	return 0
}

// isBareInit reports whether this is the guest's init with nothing to
// parse: PID 1 running the agent (RewriteArgs has dropped the kernel's
// leftover words) with no flags.
func isBareInit(args []string, pid int) bool {
	return pid == 1 && len(args) == 2 && args[1] == "agent"
}

// runInit starts the guest agent as PID 1 without the CLI parser. Init takes
// no flags (the kernel's leftover words are ignored either way), and under
// TCG every code path costs a translation the first time it runs: kong's
// reflective parse was a large part of the time from the kernel starting
// /init to the agent's first step.
func runInit() int {
	logger := logs.New(os.Stderr, envvars.LogLevel.Get()) // unset: info
	slog.SetDefault(logger)
	if err := (&agent.Cmd{}).Run(logs.WithLogger(context.Background(), logger)); err != nil {
		fmt.Fprintln(os.Stderr, "capsem:", err)
		return 1
	}
	return 0
}
