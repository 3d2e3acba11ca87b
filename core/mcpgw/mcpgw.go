// Package mcpgw assembles the MCP gateway the way both `capsem gateway` and
// the per-VM process run it: the session ledger, the sandboxed aggregator
// (with the builtin server) and the endpoint that records and routes calls.
package mcpgw

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/aggclient"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/endpoint"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/privsep"
	"github.com/capsem/capsem/core/reloadctl"
	"github.com/capsem/capsem/core/version"
)

// Options configures a Gateway.
type Options struct {
	SessionDir string
	// Sources is the configuration hierarchy (corp, user, auto-detected);
	// it is read at start and again on every reload.
	Sources config.Sources
	// Ledger is the session ledger to record into; nil opens
	// <SessionDir>/session.db (and Close closes it).
	Ledger *ledger.Ledger
	// Protect lists further paths the sandboxed aggregator must never reach
	// (the listening socket, the process API socket).
	Protect []string
	Logger  *slog.Logger
	// Kind and Name register the gateway for `capsem policy reload`
	// (Kind "" does not register).
	Kind, Name string
}

// Gateway is an MCP endpoint with its ledger and sandboxed aggregator; the
// caller serves it on listeners (a Unix socket, a guest channel port).
type Gateway struct {
	Endpoint   *endpoint.Endpoint
	Aggregator *aggclient.Client
	Ledger     *ledger.Ledger
	ownsLedger bool
	grants     *grants
	scratch    string
	log        *slog.Logger

	sources    config.Sources
	reloadMu   sync.Mutex // one reload at a time
	current    atomic.Pointer[config.Merged]
	unregister func()
}

// Start opens the ledger (unless given) and starts the aggregator.
func Start(ctx context.Context, opts Options) (*Gateway, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(opts.SessionDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating session directory: %w", err)
	}
	sessionDir, err := filepath.Abs(opts.SessionDir)
	if err != nil {
		return nil, err
	}
	merged, err := config.LoadHierarchy(opts.Sources)
	if err != nil {
		return nil, err
	}
	for _, n := range merged.Notes {
		log.Warn("configuration", "note", n)
	}
	g := &Gateway{Ledger: opts.Ledger, log: log, sources: opts.Sources}
	g.current.Store(merged)
	cfg := merged.File
	if g.Ledger == nil {
		led, err := ledger.Open(ctx, paths.Session{Dir: sessionDir}.DB(), ledger.Options{})
		if err != nil {
			return nil, fmt.Errorf("opening session ledger: %w", err)
		}
		g.Ledger, g.ownsLedger = led, true
	}
	led := g.Ledger
	ok := false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	g.grants = &grants{}
	g.grants.set(cfg)
	endpoints, err := paths.EndpointsDir()
	if err != nil {
		return nil, err
	}
	protect := append([]string{endpoints}, opts.Protect...)
	spawn, scratch, err := AggregatorSpawner(sessionDir, protect, g.grants.get)
	if err != nil {
		return nil, err
	}
	g.scratch = scratch
	g.Aggregator = aggclient.Start(ctx, spawn, cfg.ServerDefs(), log)

	epCfg, err := endpointConfig(cfg)
	if err != nil {
		return nil, err
	}
	epCfg.Upstream = g.Aggregator
	epCfg.Recorder = endpoint.LedgerRecorder{Ledger: led}
	epCfg.Version = version.Version
	epCfg.Logger = log
	epCfg.Policy = merged.Policy
	g.Endpoint = endpoint.New(epCfg)
	if opts.Kind != "" {
		// Without the control socket (a path too long for a Unix socket, an
		// unwritable home) the gateway still serves; SIGHUP still reloads.
		if g.unregister, err = reloadctl.Register(ctx, endpoints, opts.Kind, opts.Name, g.ReloadConfig, log); err != nil {
			log.Warn("`capsem policy reload` cannot reach this gateway; SIGHUP still reloads it", "err", err)
		}
	}
	ok = true
	return g, nil
}

// endpointConfig is the configuration's deadlines and in-flight cap, with
// the environment's overrides applied.
func endpointConfig(cfg *config.File) (endpoint.Config, error) {
	t := cfg.MCP.Timeouts
	epCfg := endpoint.Config{
		DefaultTimeout: time.Duration(t.DefaultSecs) * time.Second,
		ToolTimeout:    time.Duration(t.ToolCallSecs) * time.Second,
		ToolTimeouts:   cfg.ToolTimeouts(),
	}
	err := ApplyEnv(&epCfg, os.Getenv)
	return epCfg, err
}

// Config returns the configuration in force.
func (g *Gateway) Config() *config.Merged { return g.current.Load() }

// ReloadConfig re-reads the configuration hierarchy and swaps in its policy
// server list and deadlines. The policy swap is atomic: open connections see it on
// their next request. If the new configuration is invalid, everything stays
// as it was and the error says why.
func (g *Gateway) ReloadConfig(ctx context.Context) (string, error) {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	m, err := config.LoadHierarchy(g.sources)
	if err != nil {
		return Describe(g.current.Load()), fmt.Errorf("keeping the previous configuration: %w", err)
	}
	epCfg, err := endpointConfig(m.File)
	if err != nil {
		return Describe(g.current.Load()), fmt.Errorf("keeping the previous configuration: %w", err)
	}
	for _, n := range m.Notes {
		g.log.Warn("configuration", "note", n)
	}
	g.Endpoint.SetPolicy(m.Policy)
	g.Endpoint.SetTimeouts(endpoint.Timeouts{Default: epCfg.DefaultTimeout, Tool: epCfg.ToolTimeout, PerTool: epCfg.ToolTimeouts})
	g.current.Store(m)
	if err := g.reloadServers(ctx, m.File); err != nil {
		return Describe(m), fmt.Errorf("the new policy is in force, but the server list failed to reload: %w", err)
	}
	return Describe(m), nil
}

// Describe summarises a configuration in one line.
func Describe(m *config.Merged) string {
	p := m.Policy
	return fmt.Sprintf("default %s, %d blocked server(s), %d allowed server(s), %d per-tool decision(s), %d rule(s), %d server(s)",
		p.Default.Decision, len(p.BlockedServers), len(p.AllowedServers), len(p.Tools), len(p.Rules), len(m.File.MCP.Servers))
}

// Serve answers framed MCP connections from ln until ctx is done.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	return g.Endpoint.Serve(ctx, ln)
}

// reloadServers swaps in a new server list. When the servers need different
// sandbox grants the aggregator is restarted, since a Landlock domain cannot
// be widened in place; otherwise it reconnects in place (which also restarts
// the builtin with its new domain lists).
func (g *Gateway) reloadServers(ctx context.Context, cfg *config.File) error {
	if g.grants.set(cfg) {
		g.Aggregator.Restart(cfg.ServerDefs())
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return g.Aggregator.Refresh(ctx, cfg.ServerDefs())
}

// grants holds the sandbox paths the next aggregator is started with.
type grants struct {
	mu          sync.Mutex
	read, write []string
}

// set records the grants of cfg and reports whether they changed.
func (gr *grants) set(cfg *config.File) bool {
	read, write := cfg.SandboxPaths()
	read, write = privsep.ExistingPaths(slog.Default(), read), privsep.ExistingPaths(slog.Default(), write)
	gr.mu.Lock()
	defer gr.mu.Unlock()
	changed := !slices.Equal(read, gr.read) || !slices.Equal(write, gr.write)
	gr.read, gr.write = read, write
	return changed
}

func (gr *grants) get() (read, write []string) {
	gr.mu.Lock()
	defer gr.mu.Unlock()
	return gr.read, gr.write
}

// Close stops the aggregator and, if it opened it, the ledger.
func (g *Gateway) Close() error {
	if g.unregister != nil {
		g.unregister()
	}
	if g.Aggregator != nil {
		g.Aggregator.Close()
	}
	var err error
	if g.Ledger != nil && g.ownsLedger {
		err = g.Ledger.Close()
		st := g.Ledger.Stats()
		g.log.Info("ledger closed", "path", g.Ledger.Path(), "rows", st.Rows, "commits", st.Commits, "failed_rows", st.FailedRows, "checkpoints", st.Checkpoints)
	}
	if g.scratch != "" {
		os.RemoveAll(g.scratch)
	}
	return err
}

// ApplyEnv lets the environment override the endpoint's limits:
// envvars.MCPDefaultTimeout, MCPToolCallTimeout, MCPInflight and
// MCPToolTimeouts ("server__tool=secs,...", each replacing its entry).
func ApplyEnv(cfg *endpoint.Config, getenv func(string) string) error {
	if d, ok, err := envvars.MCPDefaultTimeout.ValueFrom(getenv); err != nil {
		return err
	} else if ok {
		cfg.DefaultTimeout = d
	}
	if d, ok, err := envvars.MCPToolCallTimeout.ValueFrom(getenv); err != nil {
		return err
	} else if ok {
		cfg.ToolTimeout = d
	}
	if n, ok, err := envvars.MCPInflight.ValueFrom(getenv); err != nil {
		return err
	} else if ok {
		cfg.InFlight = n
	}
	if timeouts, ok, err := envvars.MCPToolTimeouts.ValueFrom(getenv); err != nil {
		return err
	} else if ok {
		if cfg.ToolTimeouts == nil {
			cfg.ToolTimeouts = map[string]time.Duration{}
		}
		maps.Copy(cfg.ToolTimeouts, timeouts)
	}
	return nil
}

// AggregatorSpawner returns a function that builds the sandboxed aggregator
// command, and the scratch directory it uses (the caller removes it).
func AggregatorSpawner(sessionDir string, protectPaths []string, grantsFn func() (read, write []string)) (aggclient.Spawner, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("locating the capsem executable: %w", err)
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return nil, "", fmt.Errorf("locating the capsem executable: %w", err)
	}
	root, err := paths.ScratchRoot()
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, "", fmt.Errorf("creating scratch root: %w", err)
	}
	scratch, err := os.MkdirTemp(root, "aggregator-")
	if err != nil {
		return nil, "", fmt.Errorf("creating scratch directory: %w", err)
	}
	cache, err := paths.CacheDir()
	if err != nil {
		return nil, "", err
	}
	session := paths.Session{Dir: sessionDir}
	protect := append([]string{sessionDir, session.DB()}, protectPaths...)
	if sock, err := paths.ServiceSocket(); err == nil {
		protect = append(protect, sock)
	}
	logPath := session.AggregatorLog()
	spawn := func(ctx context.Context) (*exec.Cmd, error) {
		read, write := grantsFn()
		cmd, err := privsep.Command(ctx, privsep.Spec{
			Executable: self,
			Args:       []string{"mcp-aggregator"},
			PassEnv:    []string{envvars.LogLevel.Name()},
			Scratch:    scratch,
			CacheDir:   cache,
			Exec:       read,
			ReadWrite:  write,
			Protect:    protect,
		})
		if err != nil {
			return nil, fmt.Errorf("sandboxing the aggregator: %w", err)
		}
		// The log is written here, in the parent, from the child's stderr
		// (a pipe): the child cannot open anything in the session dir, and
		// what it logs (which a guest's MCP calls and the servers it
		// starts can drive) rotates within its bound.
		logFile, err := logs.OpenRotating(logPath, logs.ProcessLogMaxBytes)
		if err != nil {
			return nil, fmt.Errorf("opening aggregator log: %w", err)
		}
		cmd.Stderr = logFile
		cmd.Cancel = func() error { return cmd.Process.Kill() }
		// An MCP server the aggregator started may hold the pipe after
		// the aggregator died: Wait does not wait for it long.
		cmd.WaitDelay = 2 * time.Second
		go func() { <-ctx.Done(); logFile.Close() }()
		return cmd, nil
	}
	return spawn, scratch, nil
}

// SourcesFor resolves the configuration hierarchy of this host: corp.toml,
// then configPath (or $CAPSEM_HOME/user.toml), then, when autodetect is set,
// the AI CLI settings in the user's home directory.
func SourcesFor(configPath string, autodetect bool) (config.Sources, error) {
	home, err := paths.Home()
	if err != nil {
		return config.Sources{}, err
	}
	userHome, err := os.UserHomeDir()
	if err != nil && autodetect {
		return config.Sources{}, fmt.Errorf("locating the home directory for auto-detection: %w", err)
	}
	return config.DefaultSources(os.LookupEnv, home, userHome, configPath, autodetect)
}

// ReloadOnSignal reloads the configuration on every SIGHUP until ctx is done.
func (g *Gateway) ReloadOnSignal(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				detail, err := g.ReloadConfig(ctx)
				if err != nil {
					g.log.Error("configuration reload on SIGHUP failed", "err", err, "in_force", detail)
					continue
				}
				g.log.Info("configuration reloaded on SIGHUP", "in_force", detail)
			}
		}
	}()
}
