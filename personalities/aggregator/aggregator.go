// Package aggregator is the mcp-aggregator personality: a child of the MCP
// endpoint that connects to external MCP servers (and the builtin server) with
// the official Go SDK, namespaces their catalogs and serves calls
// concurrently. It speaks aggwire frames on stdin/stdout and never opens the
// session database.
package aggregator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/builtintools"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/privsep"
	"github.com/capsem/capsem/core/procs"
	"github.com/capsem/capsem/core/version"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Cmd runs the aggregator.
type Cmd struct{}

// Run serves stdin/stdout until EOF or a shutdown request.
func (c *Cmd) Run(ctx context.Context) error {
	if err := procs.NotDumpable(); err != nil {
		return fmt.Errorf("aggregator: making the process not dumpable: %w", err)
	}
	procs.TuneGC()
	procs.Limit(procs.Helper())
	in, out, restore := procs.PollableStdio()
	defer restore()
	a := New(slog.Default())
	// The privsep sandbox names the shared package cache this way.
	a.cacheDir = os.Getenv("XDG_CACHE_HOME")
	return a.Serve(ctx, procs.RawReader(in), procs.RawWriter(out))
}

// BuiltinName is the reserved name of the builtin server.
const BuiltinName = "builtin"

// DefaultConnectTimeout bounds connecting one server (npx may download first).
const DefaultConnectTimeout = 60 * time.Second

// A server that fails to connect (a package still downloading past the
// connect timeout, a crash at start) is connected again later, waiting
// retryFirst, then twice as long each time up to retryMax, so that it
// joins once it can without the VM or the policy being restarted.
var (
	retryFirst = 5 * time.Second
	retryMax   = 2 * time.Minute
)

// ValidateServerName reports why a server name cannot be used, or nil. Only
// the endpoint's own builtin definition may use the reserved name.
func ValidateServerName(name string, builtin bool) error {
	if builtin && name == BuiltinName {
		return nil
	}
	return config.ValidateServerName(name)
}

// Aggregator holds the connected servers.
type Aggregator struct {
	log *slog.Logger
	w   *aggwire.Writer

	ctx      context.Context // lifetime of Serve; reconnects run under it
	mu       sync.RWMutex
	servers  map[string]*server
	order    []string
	inflight map[uint64]context.CancelFunc

	// serversDir holds one home directory per stdio server; Serve creates
	// it and removes it at the end.
	serversDir string
	// cacheDir is the package cache the servers share (npx, uvx), when set.
	cacheDir string
}

type server struct {
	def   aggwire.ServerDef
	ready chan struct{} // closed when connecting finished (ok or not)
	// set before ready is closed:
	session   *mcp.ClientSession
	direct    *lineConn     // a stdio server's connection, for direct tool calls
	ended     chan struct{} // closed when the session ends (server exit, protocol error)
	broken    chan struct{} // closed when a call saw the connection close
	breakOnce sync.Once
	err       error
	tools     []aggwire.Tool
	resources []aggwire.Resource
	prompts   []aggwire.Prompt
	cancel    context.CancelFunc
	retry     *time.Timer // the next attempt after a failed one
	// attempt counts the connects before this one; lastErr is how the
	// one before failed.
	attempt int
	lastErr error
}

// New returns an empty aggregator.
func New(log *slog.Logger) *Aggregator {
	return &Aggregator{log: log, servers: map[string]*server{}, inflight: map[uint64]context.CancelFunc{}}
}

// Serve reads requests from r and writes responses to w until EOF.
func (a *Aggregator) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.ctx = ctx
	a.w = aggwire.NewWriter(w)
	rd := aggwire.NewReader(r)
	dir, err := os.MkdirTemp("", "servers-")
	if err != nil {
		return fmt.Errorf("creating the servers' home directory: %w", err)
	}
	a.serversDir = dir
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		a.closeAll()
		if err := os.RemoveAll(dir); err != nil {
			a.log.Warn("removing the servers' home directory", "err", err)
		}
	}()
	for {
		var req aggwire.Request
		if err := rd.Read(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if aggwire.IsRecoverable(err) {
				a.log.Error("dropping undecodable request", "err", err)
				continue
			}
			return fmt.Errorf("reading requests: %w", err)
		}
		switch req.Method {
		case aggwire.MethodShutdown:
			a.reply(&aggwire.Response{ID: req.ID})
			return nil
		case aggwire.MethodCancel:
			a.mu.Lock()
			if cancel := a.inflight[req.Target]; cancel != nil {
				cancel()
			}
			a.mu.Unlock()
			continue
		case aggwire.MethodInit:
			if req.Version != aggwire.ProtocolVersion {
				a.reply(&aggwire.Response{ID: req.ID, Version: aggwire.ProtocolVersion, Error: fmt.Sprintf("protocol version %d not supported (want %d)", req.Version, aggwire.ProtocolVersion)})
				continue
			}
			a.configure(ctx, req.Servers)
			a.reply(&aggwire.Response{ID: req.ID, Version: aggwire.ProtocolVersion})
			continue
		case aggwire.MethodRefresh:
			a.configure(ctx, req.Servers)
			a.reply(&aggwire.Response{ID: req.ID})
			continue
		}
		callCtx, callCancel := context.WithCancel(ctx)
		a.mu.Lock()
		a.inflight[req.ID] = callCancel
		a.mu.Unlock()
		wg.Add(1)
		go func(req aggwire.Request) {
			defer wg.Done()
			resp := a.handle(callCtx, &req)
			resp.ID = req.ID
			a.mu.Lock()
			delete(a.inflight, req.ID)
			a.mu.Unlock()
			callCancel()
			a.reply(resp)
		}(req)
	}
}

func (a *Aggregator) reply(resp *aggwire.Response) {
	err := a.w.Write(resp)
	if errors.Is(err, aggwire.ErrFrameTooLarge) {
		err = a.w.Write(&aggwire.Response{ID: resp.ID, Code: aggwire.CodeUpstream, Error: fmt.Sprintf("result too large to forward: %v", err)})
	}
	if err != nil {
		a.log.Error("writing response", "err", err)
	}
}

// configure replaces the server set. New connections start in parallel; old
// sessions close once calls already routed to them are done with them.
func (a *Aggregator) configure(ctx context.Context, defs []aggwire.ServerDef) {
	next := map[string]*server{}
	var order []string
	for _, def := range defs {
		s := &server{def: def, ready: make(chan struct{})}
		err := ValidateServerName(def.Name, def.Builtin)
		if err == nil && next[def.Name] != nil {
			err = fmt.Errorf("duplicate server name %q", def.Name)
		}
		if err == nil && def.Command == "" && def.URL == "" && !def.Builtin {
			err = fmt.Errorf("server %q has neither command nor url", def.Name)
		}
		if err == nil && def.Command != "" && def.URL != "" {
			err = fmt.Errorf("server %q has both command and url", def.Name)
		}
		if err != nil {
			a.log.Error("rejecting server definition", "err", err)
			if next[def.Name] != nil {
				continue
			}
			s.err = err
			close(s.ready)
		} else if !def.Enabled {
			s.err = errors.New("disabled")
			close(s.ready)
		}
		next[def.Name] = s
		order = append(order, def.Name)
	}
	a.mu.Lock()
	old := a.servers
	a.servers, a.order = next, order
	a.mu.Unlock()
	for _, s := range next {
		select {
		case <-s.ready:
		default:
			go a.connect(ctx, s)
		}
	}
	go func() {
		for _, s := range old {
			<-s.ready
			a.closeServer(s)
		}
	}()
}

func (a *Aggregator) closeAll() {
	a.mu.Lock()
	servers := a.servers
	a.servers = map[string]*server{}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.cancel != nil {
				s.cancel()
			}
			<-s.ready
			a.closeServer(s)
		}()
	}
	wg.Wait()
}

func (a *Aggregator) closeServer(s *server) {
	if s.retry != nil {
		s.retry.Stop()
	}
	if s.session != nil {
		_ = s.session.Close()
	}
}

func (a *Aggregator) connect(ctx context.Context, s *server) {
	defer close(s.ready)
	defer func() {
		if s.session == nil && ctx.Err() == nil {
			delay := min(retryFirst<<min(s.attempt, 16), retryMax)
			s.retry = time.AfterFunc(delay, func() { a.connectAgain(s) })
		}
	}()
	timeout := time.Duration(s.def.ConnectTimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	// The session outlives the connect deadline, so the transport gets the
	// long-lived context and only the handshake and listing are bounded.
	sctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	transport, err := a.transport(sctx, s.def)
	if err != nil {
		s.err = err
		return
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "capsem-aggregator", Version: version.Version}, nil)
	cctx, ccancel := context.WithTimeout(sctx, timeout)
	defer ccancel()
	session, err := client.Connect(cctx, transport, nil)
	if err != nil {
		s.err = fmt.Errorf("connecting to %q: %w", s.def.Name, err)
		a.log.Warn("MCP server unavailable", "server", s.def.Name, "err", err)
		return
	}
	s.session = session
	if ct, ok := transport.(*commandTransport); ok && !s.def.Builtin {
		// The builtin's results carry its HTTP records in _meta, which the
		// typed path takes out (extractNetEvents).
		s.direct = ct.conn
	}
	if err := a.catalog(cctx, s); err != nil {
		s.err = fmt.Errorf("listing %q: %w", s.def.Name, err)
		a.log.Warn("MCP server catalog failed", "server", s.def.Name, "err", err)
		_ = session.Close()
		s.session = nil
		return
	}
	s.ended, s.broken = make(chan struct{}), make(chan struct{})
	go func() { _ = session.Wait(); close(s.ended) }()
	a.log.Info("MCP server connected", "server", s.def.Name, "tools", len(s.tools), "resources", len(s.resources), "prompts", len(s.prompts))
}

func (a *Aggregator) transport(ctx context.Context, def aggwire.ServerDef) (mcp.Transport, error) {
	if def.URL != "" {
		return &mcp.StreamableClientTransport{Endpoint: def.URL, HTTPClient: &http.Client{Transport: headerTransport{def.Headers, http.DefaultTransport}}}, nil
	}
	cmd, err := a.serverCommand(ctx, def)
	if err != nil {
		return nil, fmt.Errorf("server %s: %w", def.Name, err)
	}
	// A server's stderr reaches the log only through the aggregator, each
	// line bounded and named after its server: never the log file itself,
	// which a server could truncate or fill with entries of its own.
	cmd.Stderr = newStderrLog(a.log, def.Name)
	// The copy from that pipe must not hold up the server's reaping when
	// a grandchild keeps the pipe open.
	cmd.WaitDelay = 2 * time.Second
	return &commandTransport{cmd: cmd, terminate: 2 * time.Second}, nil
}

// serverCommand builds a stdio server's command. Every server, the builtin
// one included, runs in a sandbox of its own nested in the aggregator's
// (see the privsep package): its own Landlock domain, so that no server can
// read another's /proc entries (environment, memory, descriptors), signal
// it or reach its abstract sockets; its own process group; its own home
// directory, which no other server's rules grant; and only its own
// read_paths and write_paths. Its environment is built from nothing: the
// privsep allowlist plus what its definition names, checked like privsep's
// (definitions also arrive from auto-detected AI CLI settings).
func (a *Aggregator) serverCommand(ctx context.Context, def aggwire.ServerDef) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return nil, fmt.Errorf("locating the capsem executable: %w", err)
	}
	if a.serversDir == "" {
		return nil, errors.New("no directory for the servers' homes (the aggregator is not serving)")
	}
	spec := privsep.Spec{
		Executable: self,
		Env:        def.Env,
		Scratch:    filepath.Join(a.serversDir, def.Name),
		CacheDir:   a.cacheDir,
	}
	if def.Builtin {
		spec.Args = []string{"mcp-builtin"}
		spec.PassEnv = []string{envvars.LogLevel.Name()}
	} else {
		path := privsep.SafePath
		if p, ok := def.Env["PATH"]; ok {
			path = p
		}
		program, err := lookPath(def.Command, path)
		if err != nil {
			return nil, err
		}
		spec.Run = append([]string{program}, def.Args...)
		spec.Exec = privsep.ExistingPaths(a.log, def.ReadPaths, "server", def.Name)
		spec.ReadWrite = privsep.ExistingPaths(a.log, def.WritePaths, "server", def.Name)
	}
	cmd, err := privsep.Command(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("sandboxing: %w", err)
	}
	return cmd, nil
}

// lookPath finds name as exec.LookPath would, but in the given PATH (the
// server's), and only in its absolute directories.
func lookPath(name, path string) (string, error) {
	if name == "" {
		return "", errors.New("empty command")
	}
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			return "", fmt.Errorf("command %q is relative; give an absolute path or a name found in PATH", name)
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("command %q not found in PATH %s", name, path)
}

type headerTransport struct {
	headers map[string]string
	base    http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(h.headers) > 0 {
		r = r.Clone(r.Context())
		for k, v := range h.headers {
			r.Header.Set(k, v)
		}
	}
	return h.base.RoundTrip(r)
}

func (a *Aggregator) catalog(ctx context.Context, s *server) error {
	name := s.def.Name
	caps := s.session.InitializeResult().Capabilities
	if caps != nil && caps.Tools != nil {
		for t, err := range s.session.Tools(ctx, nil) {
			if err != nil {
				return fmt.Errorf("tools/list: %w", err)
			}
			if t.Name == "" {
				continue
			}
			tool := aggwire.Tool{Name: name + "__" + t.Name, OriginalName: t.Name, Server: name, Title: t.Title, Description: t.Description}
			tool.InputSchema, _ = json.Marshal(t.InputSchema)
			if t.OutputSchema != nil {
				tool.OutputSchema, _ = json.Marshal(t.OutputSchema)
			}
			tool.Annotations = annotations(t.Annotations)
			s.tools = append(s.tools, tool)
		}
	}
	if caps != nil && caps.Resources != nil {
		for r, err := range s.session.Resources(ctx, nil) {
			if err != nil {
				a.log.Debug("resources/list failed", "server", name, "err", err)
				break
			}
			if r.URI == "" {
				continue
			}
			s.resources = append(s.resources, aggwire.Resource{URI: "capsem://" + name + "/" + r.URI, OriginalURI: r.URI, Server: name,
				Name: r.Name, Title: r.Title, Description: r.Description, MIMEType: r.MIMEType})
		}
	}
	if caps != nil && caps.Prompts != nil {
		for p, err := range s.session.Prompts(ctx, nil) {
			if err != nil {
				a.log.Debug("prompts/list failed", "server", name, "err", err)
				break
			}
			if p.Name == "" {
				continue
			}
			prompt := aggwire.Prompt{Name: name + "__" + p.Name, OriginalName: p.Name, Server: name, Title: p.Title, Description: p.Description}
			if len(p.Arguments) > 0 {
				prompt.Arguments, _ = json.Marshal(p.Arguments)
			}
			s.prompts = append(s.prompts, prompt)
		}
	}
	return nil
}

// annotations applies the MCP defaults for hints a server leaves out:
// destructive and open-world unless it says otherwise.
func annotations(t *mcp.ToolAnnotations) *aggwire.Annotations {
	a := &aggwire.Annotations{DestructiveHint: true, OpenWorldHint: true}
	if t == nil {
		return a
	}
	a.Title = t.Title
	a.ReadOnlyHint = t.ReadOnlyHint
	a.IdempotentHint = t.IdempotentHint
	if t.DestructiveHint != nil {
		a.DestructiveHint = *t.DestructiveHint
	}
	if t.OpenWorldHint != nil {
		a.OpenWorldHint = *t.OpenWorldHint
	}
	return a
}

// snapshot returns the current servers in definition order.
func (a *Aggregator) snapshot() []*server {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]*server, 0, len(a.order))
	for _, n := range a.order {
		out = append(out, a.servers[n])
	}
	return out
}

func (a *Aggregator) lookup(name string) *server {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.servers[name]
}

// waitAll waits until every server finished its first connect (each is
// bounded by its own connect timeout, so one dead server cannot stall the
// others' calls; only catalog listings wait for the slowest connect). A
// server connecting again after a failure is not waited for: a listing
// has it once it is connected.
func waitAll(ctx context.Context, servers []*server) error {
	for _, s := range servers {
		if s.attempt > 0 {
			continue
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (a *Aggregator) handle(ctx context.Context, req *aggwire.Request) *aggwire.Response {
	switch req.Method {
	case aggwire.MethodListServers:
		servers := a.snapshot()
		var out []aggwire.ServerStatus
		for _, s := range servers {
			st := aggwire.ServerStatus{Name: s.def.Name, Enabled: s.def.Enabled, Transport: "stdio"}
			if s.def.URL != "" {
				st.Transport = "http"
			}
			select {
			case <-s.ready:
				st.Connected = s.session != nil
				if s.err != nil {
					st.Error = s.err.Error()
				}
				if s.retry != nil {
					st.Error += fmt.Sprintf(" (attempt %d; it will be tried again)", s.attempt+1)
				}
				st.ToolCount, st.ResourceCount, st.PromptCount = len(s.tools), len(s.resources), len(s.prompts)
			default:
				st.Error = "connecting"
				if s.attempt > 0 {
					st.Error = fmt.Sprintf("connecting again (attempt %d; the last one failed: %v)", s.attempt+1, s.lastErr)
				}
			}
			out = append(out, st)
		}
		return &aggwire.Response{Servers: out}
	case aggwire.MethodListTools, aggwire.MethodListResources, aggwire.MethodListPrompts:
		servers := a.snapshot()
		if err := waitAll(ctx, servers); err != nil {
			return &aggwire.Response{Code: aggwire.CodeUpstream, Error: err.Error()}
		}
		resp := &aggwire.Response{}
		for _, s := range servers {
			select {
			case <-s.ready:
			default:
				continue // connecting again (waitAll)
			}
			resp.Tools = append(resp.Tools, s.tools...)
			resp.Resources = append(resp.Resources, s.resources...)
			resp.Prompts = append(resp.Prompts, s.prompts...)
		}
		switch req.Method {
		case aggwire.MethodListTools:
			resp.Resources, resp.Prompts = nil, nil
		case aggwire.MethodListResources:
			resp.Tools, resp.Prompts = nil, nil
		default:
			resp.Tools, resp.Resources = nil, nil
		}
		return resp
	case aggwire.MethodCallTool, aggwire.MethodGetPrompt:
		serverName, original, ok := strings.Cut(req.Name, "__")
		if !ok || serverName == "" || original == "" {
			return invalid("name %q is not namespaced as <server>__<name>", req.Name)
		}
		if req.Method == aggwire.MethodCallTool {
			// The arguments go to the server byte for byte: a decode and
			// re-encode would round large integers through float64 and
			// could differ from what policy looked at.
			args := json.RawMessage(`{}`)
			if len(req.Arguments) > 0 {
				if !json.Valid(req.Arguments) || req.Arguments[0] != '{' {
					return invalid("arguments are not a JSON object")
				}
				args = json.RawMessage(req.Arguments)
			}
			if s := a.lookup(serverName); s != nil {
				select {
				case <-s.ready:
					if s.session != nil && !hasTool(s, req.Name) {
						return invalid("unknown tool %q", req.Name)
					}
				case <-ctx.Done():
				}
			}
			var res *mcp.CallToolResult
			var raw json.RawMessage
			direct := false
			s, notReady, err := a.call(ctx, serverName, func(s *server) (err error) {
				if direct = s.direct != nil; direct {
					raw, err = s.direct.callDirect(ctx, "tools/call", toolCallParams(original, args))
					return err
				}
				res, err = s.session.CallTool(ctx, &mcp.CallToolParams{Name: original, Arguments: args})
				return err
			})
			if notReady != nil {
				return notReady
			}
			if err != nil {
				return upstream("tool call", err)
			}
			if direct {
				if r := bytes.TrimSpace(raw); len(r) == 0 || r[0] != '{' {
					return upstream("tool call", fmt.Errorf("server's result is not a JSON object"))
				}
				return &aggwire.Response{Result: raw}
			}
			var events []aggwire.NetEvent
			if s.def.Builtin { // only the builtin's records are trusted into the ledger
				events = extractNetEvents(res)
			}
			b, err := json.Marshal(res)
			if err != nil {
				return upstream("encoding tool result", err)
			}
			return &aggwire.Response{Result: b, NetEvents: events}
		}
		var args map[string]any
		if len(req.Arguments) > 0 {
			if err := json.Unmarshal(req.Arguments, &args); err != nil {
				return invalid("arguments are not a JSON object: %v", err)
			}
		}
		strArgs := map[string]string{}
		for k, v := range args {
			if sv, ok := v.(string); ok {
				strArgs[k] = sv
			} else {
				return invalid("prompt argument %q must be a string", k)
			}
		}
		var res *mcp.GetPromptResult
		_, notReady, err := a.call(ctx, serverName, func(s *server) (err error) {
			res, err = s.session.GetPrompt(ctx, &mcp.GetPromptParams{Name: original, Arguments: strArgs})
			return err
		})
		if notReady != nil {
			return notReady
		}
		if err != nil {
			return upstream("prompt get", err)
		}
		b, _ := json.Marshal(res)
		return &aggwire.Response{Result: b}
	case aggwire.MethodReadResource:
		rest, ok := strings.CutPrefix(req.URI, "capsem://")
		serverName, original, ok2 := strings.Cut(rest, "/")
		if !ok || !ok2 || serverName == "" || original == "" {
			return invalid("resource URI %q is not namespaced as capsem://<server>/<uri>", req.URI)
		}
		var res *mcp.ReadResourceResult
		_, notReady, err := a.call(ctx, serverName, func(s *server) (err error) {
			res, err = s.session.ReadResource(ctx, &mcp.ReadResourceParams{URI: original})
			return err
		})
		if notReady != nil {
			return notReady
		}
		if err != nil {
			return upstream("resource read", err)
		}
		b, _ := json.Marshal(res)
		return &aggwire.Response{Result: b}
	}
	return invalid("unknown aggregator method %q", req.Method)
}

func hasTool(s *server, name string) bool {
	for _, t := range s.tools {
		if t.Name == name {
			return true
		}
	}
	return false
}

func (a *Aggregator) ready(ctx context.Context, name string) (*server, *aggwire.Response) {
	s := a.lookup(name)
	if s == nil {
		return nil, invalid("unknown MCP server %q", name)
	}
	for attempt := 0; ; attempt++ {
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, upstream("waiting for server "+name, ctx.Err())
		}
		if s.session == nil || attempt > 0 {
			break
		}
		if s.dead() {
			// The session died (the server exited or broke the protocol):
			// connect again once, for this and later calls.
			s = a.reconnect(s)
			continue
		}
		break
	}
	if s.session == nil {
		return nil, &aggwire.Response{Code: aggwire.CodeUpstream, Error: fmt.Sprintf("MCP server %q is not connected: %v", name, s.err)}
	}
	return s, nil
}

func (s *server) dead() bool {
	select {
	case <-s.ended:
		return true
	case <-s.broken:
		return true
	default:
		return false
	}
}

// sessionFailed notes a call that failed because the connection closed, and
// reports whether the request was refused before it was sent (so retrying
// it on a new connection cannot run it twice).
func (s *server) sessionFailed(err error) (neverSent bool) {
	if !errors.Is(err, mcp.ErrConnectionClosed) {
		return false
	}
	s.breakOnce.Do(func() { close(s.broken) })
	return strings.Contains(err.Error(), "client is closing")
}

// call runs fn against the named server, reconnecting once when the server's
// connection had already closed before the request could be sent.
func (a *Aggregator) call(ctx context.Context, name string, fn func(*server) error) (*server, *aggwire.Response, error) {
	s, notReady := a.ready(ctx, name)
	if notReady != nil {
		return nil, notReady, nil
	}
	err := fn(s)
	if err != nil && s.sessionFailed(err) {
		if s, notReady = a.ready(ctx, name); notReady != nil {
			return nil, notReady, nil
		}
		err = fn(s)
		if err != nil {
			s.sessionFailed(err)
		}
	}
	return s, nil, err
}

// reconnect replaces a server whose session ended with a fresh connection,
// unless another caller already did.
func (a *Aggregator) reconnect(dead *server) *server {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.servers[dead.def.Name]
	if cur != dead {
		return cur
	}
	a.log.Warn("MCP server session ended; reconnecting", "server", dead.def.Name)
	fresh := &server{def: dead.def, ready: make(chan struct{})}
	a.servers[dead.def.Name] = fresh
	go a.connect(a.ctx, fresh)
	go a.closeServer(dead)
	return fresh
}

// connectAgain replaces a server whose connect failed with a new attempt,
// unless the server set changed meanwhile or the aggregator stopped.
func (a *Aggregator) connectAgain(failed *server) {
	a.mu.Lock()
	if a.ctx.Err() != nil || a.servers[failed.def.Name] != failed {
		a.mu.Unlock()
		return
	}
	fresh := &server{def: failed.def, ready: make(chan struct{}), attempt: failed.attempt + 1, lastErr: failed.err}
	a.servers[failed.def.Name] = fresh
	a.mu.Unlock()
	a.log.Info("MCP server: connecting again", "server", failed.def.Name, "attempt", fresh.attempt+1, "last_err", failed.err)
	go a.connect(a.ctx, fresh)
}

// toolCallParams is tools/call's params with the arguments as they came.
func toolCallParams(name string, args json.RawMessage) json.RawMessage {
	b := make([]byte, 0, len(name)+len(args)+32)
	b = append(b, `{"name":`...)
	b = appendJSONString(b, name)
	b = append(b, `,"arguments":`...)
	b = append(b, args...)
	return append(b, '}')
}

func invalid(format string, args ...any) *aggwire.Response {
	return &aggwire.Response{Code: aggwire.CodeInvalidParams, Error: fmt.Sprintf(format, args...)}
}

// upstream keeps the server's own JSON-RPC error code and message.
func upstream(what string, err error) *aggwire.Response {
	var wire *jsonrpc.Error
	if errors.As(err, &wire) {
		return &aggwire.Response{Code: aggwire.CodeUpstream, Error: fmt.Sprintf("%s: server error %d: %s", what, wire.Code, wire.Message)}
	}
	return &aggwire.Response{Code: aggwire.CodeUpstream, Error: fmt.Sprintf("%s: %v", what, err)}
}

// extractNetEvents takes the builtin server's HTTP attempt records out of the
// result's _meta (they go to the ledger, not to the caller).
func extractNetEvents(res *mcp.CallToolResult) []aggwire.NetEvent {
	raw, ok := res.Meta[builtintools.MetaKeyNetEvents]
	if !ok {
		return nil
	}
	delete(res.Meta, builtintools.MetaKeyNetEvents)
	if len(res.Meta) == 0 {
		res.Meta = nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil
	}
	var events []builtintools.NetEvent
	if json.Unmarshal(b, &events) != nil {
		return nil
	}
	out := make([]aggwire.NetEvent, 0, len(events))
	for _, e := range events {
		out = append(out, aggwire.NetEvent{
			TimestampUnixNano: e.Timestamp.UnixNano(), Domain: e.Domain, Port: e.Port, Method: e.Method, Path: e.Path, Query: e.Query,
			StatusCode: e.StatusCode, BytesSent: e.BytesSent, BytesReceived: e.BytesReceived, DurationMS: e.DurationMS,
			Decision: e.Decision, MatchedRule: e.MatchedRule, Error: e.Error, IP: e.IP,
		})
	}
	return out
}
