package hostmcp

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxToolFileBytes is the largest file capsem_read_file and
// capsem_write_file take, as their descriptions say.
const MaxToolFileBytes = 64 << 20

// MaxMessageBytes bounds one message either transport reads: a
// capsem_write_file of MaxToolFileBytes in base64 (4/3 of it), with room
// for the rest of the call. The SDK's own bounds (16 MiB a stdio line,
// 4 MiB an HTTP body) would refuse it.
const MaxMessageBytes = (MaxToolFileBytes+2)/3*4 + 1<<20

// HTTPPath is where ServeHTTP answers MCP; every other path is 404.
const HTTPPath = "/mcp"

// HTTPSessionIdle ends a session no request has used for this long (a
// client that went away without ending it); a client that comes back gets
// 404 and starts a new one, as the protocol says it must.
const HTTPSessionIdle = 4 * time.Hour

// DefaultShutdownGrace is how long requests in flight may go on after the
// server is told to stop; then their connections close and their calls
// are cancelled.
const DefaultShutdownGrace = 5 * time.Second

// HTTPOptions configure ServeHTTP.
type HTTPOptions struct {
	// Token, when set, is the bearer token every request must carry.
	Token string
	// AllowHosts are further names (or addresses) the Host header may give
	// with the server's port, and an Origin may name, besides the
	// listener's address and the loopback names.
	AllowHosts []string
	// MaxBodyBytes bounds a request body; 0 means MaxMessageBytes.
	MaxBodyBytes int64
	// ShutdownGrace is how long ServeHTTP lets requests in flight finish
	// once told to stop; 0 means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Log, when not nil, gets the transport's own records (refusals,
	// sessions).
	Log *slog.Logger
}

// IsLoopbackHost reports whether host (a name or an address, without
// port) is loopback: localhost or an address in 127.0.0.0/8 or ::1.
func IsLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return err == nil && ip.Unmap().IsLoopback()
}

// ListenAddress resolves the ADDR of capsem mcp --http: a port alone
// (8080, :8080) means 127.0.0.1, so that the default is loopback; anything
// else is host:port as given. A non-loopback host needs a token:
// whoever reaches it would run commands in the sandboxes.
func ListenAddress(addr string, haveToken bool) (string, error) {
	if addr == "" {
		return "", errors.New("--http: empty address: want HOST:PORT or PORT (loopback)")
	}
	if _, err := strconv.ParseUint(addr, 10, 16); err == nil {
		addr = ":" + addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--http %q: %w (want HOST:PORT, or PORT for 127.0.0.1)", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("--http %q: port %q is not a number from 0 to 65535", addr, port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	if !IsLoopbackHost(host) && !haveToken {
		return "", fmt.Errorf("--http %s: %s is not a loopback address, and without --token-file anyone who can reach it could run commands in your sandboxes: give --token-file, or listen on 127.0.0.1", addr, host)
	}
	return net.JoinHostPort(host, port), nil
}

// HTTPHandler serves srv over streamable HTTP at HTTPPath, as the listener
// at addr: the Host header must name addr, a loopback name or one of
// opts.AllowHosts with addr's port, and an Origin, when a browser sends
// one, a loopback origin or one of opts.AllowHosts (against DNS
// rebinding: a page elsewhere must not reach a server on loopback through
// a name of its own that resolves there); then opts.Token, when set, is
// required. A refusal says why, in text: 403 for the Host and Origin, 401
// with WWW-Authenticate for the token, 413 for a body over the bound.
func HTTPHandler(srv *mcp.Server, addr net.Addr, opts HTTPOptions) http.Handler {
	g := newHTTPGuard(addr, opts)
	limit := opts.MaxBodyBytes
	if limit <= 0 {
		limit = MaxMessageBytes
	}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Logger:              opts.Log,
		SessionTimeout:      HTTPSessionIdle,
		MaxRequestBodyBytes: limit,
		// The SDK's own check (on a loopback listener, a loopback Host
		// with any port) is part of the guard's, which also checks the
		// port; it would refuse the names AllowHosts adds.
		DisableLocalhostProtection: len(opts.AllowHosts) > 0,
	})
	mux := http.NewServeMux()
	mux.Handle(HTTPPath, g.wrap(sdk))
	return mux
}

// httpGuard holds what the Host, Origin and token checks accept.
type httpGuard struct {
	port        string
	hosts       map[string]bool // names the Host header may give (with port)
	originHosts map[string]bool // names an Origin may give, besides loopback ones
	hostsText   string          // the accepted Host values, for refusals
	token       [sha256.Size]byte
	needToken   bool
	log         *slog.Logger
}

func newHTTPGuard(addr net.Addr, opts HTTPOptions) *httpGuard {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &httpGuard{hosts: map[string]bool{}, originHosts: map[string]bool{}, log: log}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		host, port = addr.String(), "80"
	}
	g.port = port
	names := []string{"localhost", "127.0.0.1", "::1"}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		// Listening on every interface: any of this host's addresses may
		// be the one a client dialled.
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if p, err := netip.ParsePrefix(a.String()); err == nil {
					names = append(names, p.Addr().String())
				}
			}
		}
	} else {
		names = append(names, host)
	}
	for _, h := range opts.AllowHosts {
		names = append(names, h)
		g.originHosts[normalHost(h)] = true
	}
	var shown []string
	for _, n := range names {
		n = normalHost(n)
		if !g.hosts[n] {
			g.hosts[n] = true
			shown = append(shown, net.JoinHostPort(n, port))
		}
	}
	g.hostsText = strings.Join(shown, ", ")
	if opts.Token != "" {
		g.needToken, g.token = true, sha256.Sum256([]byte(opts.Token))
	}
	return g
}

// normalHost is a host name or address as the checks compare it: lower
// case, an address without brackets in its canonical form.
func normalHost(h string) string {
	h = strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip.Unmap().String()
	}
	return h
}

func (g *httpGuard) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.hostAllowed(r.Host) {
			g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Host %q is not this server's address (%s; more with --allow-host): refused against DNS rebinding", r.Host, g.hostsText))
			return
		}
		if origins := r.Header.Values("Origin"); len(origins) > 1 || len(origins) == 1 && !g.originAllowed(origins[0]) {
			g.refuse(w, r, http.StatusForbidden, fmt.Sprintf("Origin %q is not a loopback origin (http://localhost, 127.0.0.1 or [::1], any port; more with --allow-host): a web page elsewhere may not drive capsem mcp", strings.Join(origins, ", ")))
			return
		}
		if g.needToken {
			if why := g.tokenRefusal(r.Header.Get("Authorization")); why != "" {
				challenge := `Bearer realm="capsem mcp"`
				if r.Header.Get("Authorization") != "" {
					challenge += `, error="invalid_token"`
				}
				w.Header().Set("WWW-Authenticate", challenge)
				g.refuse(w, r, http.StatusUnauthorized, why)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (g *httpGuard) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	g.log.Warn("capsem mcp refused an HTTP request", "status", status, "method", r.Method, "remote", r.RemoteAddr, "why", why)
	http.Error(w, "capsem mcp: "+why, status)
}

// hostAllowed reports whether a Host header names this server: one of its
// names with its port (80 when the header gives none).
func (g *httpGuard) hostAllowed(hostHeader string) bool {
	host, port, err := net.SplitHostPort(hostHeader)
	if err != nil {
		host, port = hostHeader, "80"
	}
	return host != "" && port == g.port && g.hosts[normalHost(host)]
}

// originAllowed reports whether an Origin header is a loopback origin or
// one of the allowed hosts': http or https, any port, nothing more ("null",
// the origin of sandboxed frames and files, is refused).
func (g *httpGuard) originAllowed(origin string) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	h := u.Hostname()
	return IsLoopbackHost(h) || g.originHosts[normalHost(h)]
}

// tokenRefusal says why an Authorization header does not carry the token,
// or "" when it does. The comparison takes the same time whatever the
// token given: both sides are hashed to the same length first.
func (g *httpGuard) tokenRefusal(header string) string {
	if header == "" {
		return "this server needs a bearer token (Authorization: Bearer <the token in capsem mcp's --token-file>)"
	}
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "the Authorization header is not a bearer token (want: Authorization: Bearer <token>)"
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(got[:], g.token[:]) != 1 {
		return "wrong bearer token"
	}
	return ""
}

// ServeHTTP serves srv over streamable HTTP on l (see HTTPHandler) until
// ctx is done, then shuts down: it stops accepting, ends the clients'
// listening streams at once, gives requests in flight opts.ShutdownGrace
// to finish, then cancels the calls still running (a middleware it adds to
// srv gives every call a context it can cancel: closing a session waits
// for its calls) and closes their connections and every session. It
// returns once nothing it started runs.
func ServeHTTP(ctx context.Context, srv *mcp.Server, l net.Listener, opts HTTPOptions) error {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// A GET is a client's listening stream: it lasts as long as the
	// session, so the grace would only ever run out on it.
	streams, endStreams := context.WithCancel(context.WithoutCancel(ctx))
	defer endStreams()
	calls, cancelCalls := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelCalls()
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(calls, cancel)()
			return next(ctx, method, req)
		}
	})
	handler := HTTPHandler(srv, l.Addr(), opts)
	// Close does not wait for the handlers; ServeHTTP does. A handler
	// starts only while stopping is false (under stopMu), so that none is
	// added once the wait began.
	var (
		handlers sync.WaitGroup
		stopMu   sync.Mutex
		stopping bool
	)
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			stopMu.Lock()
			if stopping {
				stopMu.Unlock()
				http.Error(w, "capsem mcp: shutting down", http.StatusServiceUnavailable)
				return
			}
			handlers.Add(1)
			stopMu.Unlock()
			defer handlers.Done()
			if r.Method == http.MethodGet {
				rctx, cancel := context.WithCancel(r.Context())
				defer cancel()
				stop := context.AfterFunc(streams, cancel)
				defer stop()
				r = r.WithContext(rctx)
			}
			handler.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(l) }()

	var err error
	select {
	case err = <-served:
		// The listener failed: nothing is served any more.
	case <-ctx.Done():
		endStreams()
		grace := opts.ShutdownGrace
		if grace <= 0 {
			grace = DefaultShutdownGrace
		}
		graceCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
		if hs.Shutdown(graceCtx) != nil {
			log.Warn("capsem mcp: requests still running after the shutdown grace are cut", "grace", grace)
		}
		cancel()
		hs.Close()
		if e := <-served; !errors.Is(e, http.ErrServerClosed) {
			err = e
		}
	}
	// Nothing runs past here: calls whose request went away before the
	// shutdown included.
	cancelCalls()
	hs.Close()
	stopMu.Lock()
	stopping = true
	stopMu.Unlock()
	ended := make(chan struct{})
	go func() {
		for s := range srv.Sessions() {
			s.Close()
		}
		handlers.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(DefaultShutdownGrace):
		// A call that does not heed its context keeps its session open.
		log.Error("capsem mcp: calls still running after the shutdown")
	}
	if err != nil {
		return fmt.Errorf("serving MCP over HTTP on %s: %w", l.Addr(), err)
	}
	return nil
}
