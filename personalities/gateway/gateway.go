// Package gateway is `capsem gateway`: the MCP endpoint as a standalone host
// service on a Unix socket, with the same aggregator, builtin server and
// ledger the per-VM process uses.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/aggclient"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/endpoint"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/privsep"
	"github.com/capsem/capsem/core/version"
)

// Cmd is `capsem gateway`.
type Cmd struct {
	Listen     string `required:"" help:"Where to listen: unix:PATH (created with mode 0600)."`
	SessionDir string `required:"" type:"path" help:"Session directory; session.db and logs are written here."`
	Config     string `optional:"" type:"path" help:"TOML file with [[mcp.servers]] and [mcp] settings."`
}

// Run serves until SIGINT/SIGTERM; SIGHUP reloads the server list.
func (c *Cmd) Run(ctx context.Context) error {
	sockPath, ok := strings.CutPrefix(c.Listen, "unix:")
	if !ok || sockPath == "" {
		return fmt.Errorf("--listen %q: want unix:PATH", c.Listen)
	}
	cfg, err := c.loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	gw, err := Start(ctx, Options{SocketPath: sockPath, SessionDir: c.SessionDir, Config: cfg})
	if err != nil {
		return err
	}
	defer gw.Close()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			next, err := c.loadConfig()
			if err != nil {
				slog.Error("config reload failed; keeping the previous configuration", "err", err)
				continue
			}
			if err := gw.Reload(ctx, next); err != nil {
				slog.Error("config reload failed", "err", err)
				continue
			}
			slog.Info("configuration reloaded", "servers", len(next.MCP.Servers))
		case err := <-gw.Done():
			return err
		}
	}
}

func (c *Cmd) loadConfig() (*config.File, error) {
	if c.Config == "" {
		return &config.File{}, nil
	}
	return config.Load(c.Config)
}

// Options configures a Gateway.
type Options struct {
	SocketPath string
	SessionDir string
	Config     *config.File
	Logger     *slog.Logger
}

// Gateway is a running endpoint with its ledger and aggregator.
type Gateway struct {
	Endpoint   *endpoint.Endpoint
	Aggregator *aggclient.Client
	Ledger     *ledger.Ledger
	ln         net.Listener
	grants     *grants
	scratch    string
	cancel     context.CancelFunc
	done       chan error
	opts       Options
}

// Start opens the ledger, starts the aggregator and listens.
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
	led, err := ledger.Open(ctx, filepath.Join(sessionDir, "session.db"), ledger.Options{})
	if err != nil {
		return nil, fmt.Errorf("opening session ledger: %w", err)
	}
	g := &Gateway{Ledger: led, done: make(chan error, 1), opts: opts}
	ok := false
	defer func() {
		if !ok {
			g.Close()
		}
	}()
	g.grants = &grants{}
	g.grants.set(opts.Config)
	spawn, scratch, err := AggregatorSpawner(sessionDir, opts.SocketPath, g.grants.get)
	if err != nil {
		return nil, err
	}
	g.scratch = scratch
	g.Aggregator = aggclient.Start(ctx, spawn, opts.Config.ServerDefs(), log)

	timeouts := opts.Config.MCP.Timeouts
	epCfg := endpoint.Config{
		Upstream:       g.Aggregator,
		Recorder:       endpoint.LedgerRecorder{Ledger: led},
		Version:        version.Version,
		Logger:         log,
		DefaultTimeout: time.Duration(timeouts.DefaultSecs) * time.Second,
		ToolTimeout:    time.Duration(timeouts.ToolCallSecs) * time.Second,
		ToolTimeouts:   opts.Config.ToolTimeouts(),
	}
	if err := ApplyEnv(&epCfg, os.Getenv); err != nil {
		return nil, err
	}
	g.Endpoint = endpoint.New(epCfg)

	_ = os.Remove(opts.SocketPath)
	ln, err := net.Listen("unix", opts.SocketPath)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", opts.SocketPath, err)
	}
	if err := os.Chmod(opts.SocketPath, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("securing socket: %w", err)
	}
	g.ln = ln
	sctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	go func() { g.done <- g.Endpoint.Serve(sctx, ln) }()
	log.Info("MCP gateway listening", "socket", opts.SocketPath, "session_dir", sessionDir)
	ok = true
	return g, nil
}

// Done reports when serving stopped.
func (g *Gateway) Done() <-chan error { return g.done }

// Reload swaps in a new server list. When the servers need different
// sandbox grants the aggregator is restarted, since a Landlock domain cannot
// be widened in place; otherwise it reconnects in place.
func (g *Gateway) Reload(ctx context.Context, cfg *config.File) error {
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
	read, write := existingPaths(cfg.SandboxPaths())
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

// existingPaths drops grants for paths that do not exist (a server whose
// command is missing then fails alone, with its own clear error, instead of
// keeping the whole aggregator from starting).
func existingPaths(read, write []string) ([]string, []string) {
	keep := func(in []string) []string {
		var out []string
		for _, p := range in {
			if _, err := os.Stat(p); err != nil {
				slog.Warn("sandbox grant skipped", "path", p, "err", err)
				continue
			}
			out = append(out, p)
		}
		return out
	}
	return keep(read), keep(write)
}

// Close stops serving, the aggregator and the ledger.
func (g *Gateway) Close() error {
	if g.cancel != nil {
		g.cancel()
		<-g.done
	}
	if g.ln != nil {
		g.ln.Close()
		os.Remove(g.opts.SocketPath)
	}
	if g.Aggregator != nil {
		g.Aggregator.Close()
	}
	var err error
	if g.Ledger != nil {
		err = g.Ledger.Close()
	}
	if g.scratch != "" {
		os.RemoveAll(g.scratch)
	}
	return err
}

// ApplyEnv lets the environment override the endpoint's limits:
// CAPSEM_MCP_DEFAULT_TIMEOUT_SECS, CAPSEM_MCP_TOOL_CALL_TIMEOUT_SECS,
// CAPSEM_MCP_INFLIGHT and CAPSEM_MCP_TOOL_TIMEOUTS ("server__tool=secs,...").
func ApplyEnv(cfg *endpoint.Config, getenv func(string) string) error {
	positive := func(name string) (int, bool, error) {
		v := getenv(name)
		if v == "" {
			return 0, false, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return 0, false, fmt.Errorf("%s=%q: want a positive integer", name, v)
		}
		return n, true, nil
	}
	if n, ok, err := positive("CAPSEM_MCP_DEFAULT_TIMEOUT_SECS"); err != nil {
		return err
	} else if ok {
		cfg.DefaultTimeout = time.Duration(n) * time.Second
	}
	if n, ok, err := positive("CAPSEM_MCP_TOOL_CALL_TIMEOUT_SECS"); err != nil {
		return err
	} else if ok {
		cfg.ToolTimeout = time.Duration(n) * time.Second
	}
	if n, ok, err := positive("CAPSEM_MCP_INFLIGHT"); err != nil {
		return err
	} else if ok {
		cfg.InFlight = n
	}
	if v := getenv("CAPSEM_MCP_TOOL_TIMEOUTS"); v != "" {
		if cfg.ToolTimeouts == nil {
			cfg.ToolTimeouts = map[string]time.Duration{}
		}
		for _, item := range strings.Split(v, ",") {
			name, secs, ok := strings.Cut(strings.TrimSpace(item), "=")
			n, err := strconv.Atoi(secs)
			if !ok || !strings.Contains(name, "__") || err != nil || n <= 0 {
				return fmt.Errorf("CAPSEM_MCP_TOOL_TIMEOUTS: %q: want server__tool=positive-seconds", item)
			}
			cfg.ToolTimeouts[name] = time.Duration(n) * time.Second
		}
	}
	return nil
}

// AggregatorSpawner returns a function that builds the sandboxed aggregator
// command, and the scratch directory it uses (the caller removes it).
func AggregatorSpawner(sessionDir, socketPath string, grantsFn func() (read, write []string)) (aggclient.Spawner, string, error) {
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
	protect := []string{sessionDir, filepath.Join(sessionDir, "session.db"), socketPath}
	if home, err := paths.Home(); err == nil {
		protect = append(protect, filepath.Join(home, "run", "service.sock"))
	}
	logPath := filepath.Join(sessionDir, "mcp-aggregator.log")
	spawn := func(ctx context.Context) (*exec.Cmd, error) {
		read, write := grantsFn()
		cmd, err := privsep.Command(ctx, privsep.Spec{
			Executable: self,
			Args:       []string{"mcp-aggregator"},
			PassEnv:    []string{"CAPSEM_LOG_LEVEL"},
			Scratch:    scratch,
			CacheDir:   cache,
			Exec:       read,
			ReadWrite:  write,
			Protect:    protect,
		})
		if err != nil {
			return nil, fmt.Errorf("sandboxing the aggregator: %w", err)
		}
		// The log file is opened here, in the parent: the child writes to the
		// inherited descriptor and cannot open anything in the session dir.
		logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening aggregator log: %w", err)
		}
		cmd.Stderr = logFile
		cmd.Cancel = func() error { return cmd.Process.Kill() }
		go func() { <-ctx.Done(); logFile.Close() }()
		return cmd, nil
	}
	return spawn, scratch, nil
}
