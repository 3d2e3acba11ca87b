package netstack

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capsem/capsem/core/netpolicy"
)

// The credential path: for a name with a [[net.credentials]] entry, the
// guest's TLS ends here (with a leaf of the install's CA, which the guest
// trusts), each HTTP request is checked and gets the real secret in place
// of the placeholder in the credential's header, and goes on over a TLS
// connection of the host's own to the pinned address, verified against
// the host's roots (and the credential's ca_file). HTTP/1.1 and HTTP/2
// both ways; responses stream through as they arrive. The secret never
// reaches the guest: a response that echoes it has it replaced by the
// placeholder.

// KindHTTPS is a request on a connection whose TLS the host terminated.
const KindHTTPS = "https"

// Rules of the credential path.
const (
	// RuleExfiltration: a placeholder went where its secret may not
	// (another host, plain HTTP, another header).
	RuleExfiltration = "credential-exfiltration"
	// RuleCredential: a request the credential's host got its secret in.
	RuleCredential = "net.credentials"
	// RuleNoInterception: a name with a credential, but no CA to
	// terminate its TLS with.
	RuleNoInterception = "credential-unavailable"
	// RuleUpstreamUntrusted: the upstream's certificate is trusted
	// neither by the host's roots nor by the credential's ca_file, so
	// no request (and no secret) was sent to it.
	RuleUpstreamUntrusted = "upstream-untrusted"
)

// CA issues the certificates the guest's TLS is terminated with
// (netca.CA is one).
type CA interface {
	Leaf(name string) (*tls.Certificate, error)
}

// Limits of the credential path.
const (
	// interceptIdle closes a guest connection idle between requests.
	interceptIdle = 2 * time.Minute
	// interceptHeaders bounds reading a request's headers.
	interceptHeaders = 30 * time.Second
	// maxInterceptHeader bounds a request's header bytes.
	maxInterceptHeader = 1 << 20
	// interceptStreams bounds the requests in flight on one HTTP/2
	// connection.
	interceptStreams = 32
)

// interceptFlow is one guest connection on the credential path.
type interceptFlow struct {
	name     string
	dst      netip.AddrPort // the pinned (real) address dialled
	verdict  netpolicy.Verdict
	owner    Owner
	requests atomic.Int64
}

type flowKey struct{}

// flowConn carries its flow to the HTTP server's handler and says when the
// server closed it.
type flowConn struct {
	net.Conn
	first []byte // the ClientHello, read before deciding: replayed
	flow  *interceptFlow
	once  sync.Once
	done  chan struct{}
}

func (c *flowConn) Read(p []byte) (int, error) {
	if len(c.first) > 0 {
		n := copy(p, c.first)
		c.first = c.first[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *flowConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}

// connListener hands the credential path's connections to its HTTP
// server.
type connListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (*connListener) Addr() net.Addr {
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(gatewayAddr, 443))
}

// interceptor is the stack's credential path, built on first use.
type interceptor struct {
	s      *Stack
	ln     *connListener
	server *http.Server
	proxy  *httputil.ReverseProxy

	mu         sync.Mutex
	transports map[string]*http.Transport // by ca_file ("" for the host's roots only)
}

func (s *Stack) interceptor() *interceptor {
	s.interceptOnce.Do(func() {
		in := &interceptor{s: s, ln: &connListener{conns: make(chan net.Conn), closed: make(chan struct{})}, transports: map[string]*http.Transport{}}
		in.proxy = &httputil.ReverseProxy{
			Rewrite:       func(*httputil.ProxyRequest) {}, // the handler prepared the request
			Transport:     in,
			FlushInterval: -1, // event streams reach the guest as they arrive
			ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
			ErrorHandler:  in.upstreamFailed,
		}
		in.server = &http.Server{
			Handler:           in,
			ReadHeaderTimeout: interceptHeaders,
			IdleTimeout:       interceptIdle,
			MaxHeaderBytes:    maxInterceptHeader,
			// Streams at once on one HTTP/2 connection: with the flow
			// bound, what one guest can have in flight here.
			HTTP2:    &http.HTTP2Config{MaxConcurrentStreams: interceptStreams},
			ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
			ConnContext: func(ctx context.Context, c net.Conn) context.Context {
				if tc, ok := c.(*tls.Conn); ok {
					if fc, ok := tc.NetConn().(*flowConn); ok {
						return context.WithValue(ctx, flowKey{}, fc.flow)
					}
				}
				return ctx
			},
		}
		s.interceptWG.Go(func() { in.server.Serve(in.ln) })
		s.intercepting = in
	})
	return s.intercepting
}

// close ends every connection on the credential path.
func (in *interceptor) close() {
	in.server.Close()
	in.mu.Lock()
	for _, t := range in.transports {
		t.CloseIdleConnections()
	}
	in.mu.Unlock()
}

// intercept terminates the guest's TLS for name and serves its requests
// until the connection ends.
func (s *Stack) intercept(guest net.Conn, first []byte, dst netip.AddrPort, name string, ev *ConnEvent) {
	fail := func(err string) {
		guest.Close()
		ev.Err, ev.Duration = err, time.Since(ev.Start)
		s.cfg.Recorder.Conn(*ev)
	}
	if s.cfg.CA == nil {
		ev.Verdict = netpolicy.Verdict{Rule: RuleNoInterception, Reason: fmt.Sprintf("%s has a credential, but this VM has no CA to add it with", name)}
		fail("")
		return
	}
	fc := &flowConn{Conn: guest, first: first, flow: &interceptFlow{name: name, dst: dst, verdict: ev.Verdict, owner: ev.Owner}, done: make(chan struct{})}
	tc := tls.Server(fc, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cfg.CA.Leaf(name)
		},
	})
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Limits.FirstFlightWait)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		// Most often the guest does not trust the CA: its programs
		// were not given the bundle.
		fail("guest TLS handshake with the credential CA: " + err.Error())
		return
	}
	in := s.interceptor()
	select {
	case in.ln.conns <- tc:
	case <-s.ctx.Done():
		tc.Close()
		return
	}
	select {
	case <-fc.done:
	case <-s.ctx.Done():
		tc.Close()
	}
	if fc.flow.requests.Load() == 0 {
		// Each request is a row of its own; a connection that made
		// none still is one.
		fail("the guest made no request on the connection")
	}
}

// ServeHTTP handles one request of the guest's on the credential path.
func (in *interceptor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := in.s
	flow, _ := r.Context().Value(flowKey{}).(*interceptFlow)
	if flow == nil {
		http.Error(w, "capsem: no flow", http.StatusInternalServerError)
		return
	}
	flow.requests.Add(1)
	ev := ConnEvent{Start: time.Now(), Name: flow.name, Addr: flow.dst, Kind: KindHTTPS, Method: r.Method, Path: r.URL.Path, Verdict: flow.verdict, Owner: flow.owner}
	body := &countingReader{r: r.Body}
	r.Body = body
	refuse := func(status int, v netpolicy.Verdict) {
		ev.Verdict, ev.Status = v, status
		msg := "capsem: " + v.Reason + "\n"
		http.Error(w, strings.TrimSuffix(msg, "\n"), status)
		ev.BytesReceived = int64(len(msg))
		ev.Duration = time.Since(ev.Start)
		s.cfg.Recorder.Conn(ev)
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if norm, err := netpolicy.NormalizeHost(host); err != nil || norm != flow.name {
		// One connection, one name: a request for another host on it
		// would bypass that host's decision.
		refuse(http.StatusMisdirectedRequest, netpolicy.Verdict{Rule: RuleNameMismatch,
			Reason: fmt.Sprintf("this connection is to %s; a request for %q must open its own", flow.name, r.Host)})
		return
	}
	pol := s.policy()
	if v := pol.Name(flow.name); !v.Allowed {
		// The policy changed since the connection was decided.
		refuse(http.StatusForbidden, v)
		return
	}
	cred, ok := pol.Credential(flow.name)
	// Only the credential's own placeholder, in its own header.
	own := func(c netpolicy.CredentialRule, header string) bool {
		return ok && c.Placeholder == cred.Placeholder && strings.EqualFold(header, cred.Header)
	}
	if c, where, found := placeholderInRequest(r, pol.Credentials(), own); found {
		refuse(http.StatusForbidden, netpolicy.Verdict{Rule: RuleExfiltration,
			Reason: fmt.Sprintf("the placeholder of %s (credential for %s) is in %s of a request to %s", c.GuestEnv, c.Host, where, r.Host)})
		return
	}
	var secret string
	if ok {
		var err error
		// Read on every request, so a rotated file applies.
		if secret, err = cred.ReadSecret(); err != nil {
			s.log.Warn("net: a credential cannot be read", "host", cred.Host, "source", cred.Source, "err", err)
			ev.Err = err.Error()
			refuse(http.StatusBadGateway, netpolicy.Verdict{Rule: RuleCredential, Reason: fmt.Sprintf("the credential for %s (%s) cannot be read: %v", cred.Host, cred.Source, err)})
			return
		}
		key := http.CanonicalHeaderKey(cred.Header)
		for i, v := range r.Header[key] {
			r.Header[key][i] = strings.ReplaceAll(v, cred.Placeholder, secret)
		}
		ev.Verdict = netpolicy.Verdict{Allowed: true, Rule: RuleCredential, Source: cred.Source}
	}
	out := r.Clone(context.WithValue(r.Context(), flowKey{}, flow))
	out.URL.Scheme, out.URL.Host = "https", flow.name
	if flow.dst.Port() != 443 {
		out.URL.Host = net.JoinHostPort(flow.name, fmt.Sprint(flow.dst.Port()))
	}
	out.Host = ""
	// The host's own transport asks for compression and undoes it, so
	// what reaches the guest (and what usage and redaction read) is the
	// plain body.
	out.Header.Del("Accept-Encoding")
	rw := &guestWriter{ResponseWriter: w, secret: secret, placeholder: cred.Placeholder}
	provider := modelProvider(flow.name)
	if provider != "" {
		rw.readUsage = true
	}
	var upErr error
	ctx := context.WithValue(out.Context(), upstreamErrKey{}, &upErr)
	in.proxy.ServeHTTP(rw, out.WithContext(ctx))
	rw.finish()
	ev.Status, ev.BytesSent, ev.BytesReceived, ev.Duration = rw.status, body.n, rw.n, time.Since(ev.Start)
	if upErr != nil {
		ev.Err = "upstream: " + redact(upErr.Error(), secret, cred.Placeholder)
		var untrusted *tls.CertificateVerificationError
		if errors.As(upErr, &untrusted) {
			trust := "is not trusted by the host's roots"
			if cred.CAFile != "" {
				trust = "is trusted neither by the host's roots nor by the credential's ca_file " + cred.CAFile
			}
			ev.Verdict = netpolicy.Verdict{Rule: RuleUpstreamUntrusted,
				Reason: fmt.Sprintf("the certificate %s presented at %s %s", flow.name, flow.dst, trust)}
		}
	}
	s.cfg.Recorder.Conn(ev)
	if provider != "" && rw.reader != nil {
		s.cfg.Recorder.Model(ModelEvent{
			TraceID: flow.owner.TraceID, Process: flow.owner.Process,
			Start: ev.Start, Provider: provider, Model: rw.reader.Model,
			InputTokens: rw.reader.Input, OutputTokens: rw.reader.Output, Status: rw.status,
			RequestBytes: body.n, ResponseBytes: rw.n, Duration: ev.Duration,
		})
	}
}

// ModelEvent is one request to a model API on the credential path.
type ModelEvent struct {
	Start                       time.Time
	TraceID, Process            string // the guest process that asked (see Owner)
	Provider, Model             string
	InputTokens, OutputTokens   int64
	Status                      int
	RequestBytes, ResponseBytes int64
	Duration                    time.Duration
}

type upstreamErrKey struct{}

func (in *interceptor) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	if p, ok := r.Context().Value(upstreamErrKey{}).(*error); ok {
		*p = err
	}
	w.WriteHeader(http.StatusBadGateway)
}

// RoundTrip sends a request to its pinned address with the transport of
// its credential's trust.
func (in *interceptor) RoundTrip(r *http.Request) (*http.Response, error) {
	flow, _ := r.Context().Value(flowKey{}).(*interceptFlow)
	if flow == nil {
		return nil, errors.New("capsem: a request without its flow")
	}
	caFile := ""
	if cred, ok := in.s.policy().Credential(flow.name); ok {
		caFile = cred.CAFile
	}
	t, err := in.transport(caFile)
	if err != nil {
		return nil, err
	}
	return t.RoundTrip(r)
}

// transport is the upstream transport trusting the host's roots and
// caFile's certificates.
func (in *interceptor) transport(caFile string) (*http.Transport, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if t, ok := in.transports[caFile]; ok {
		return t, nil
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if caFile != "" {
		path, err := netpolicy.ExpandPath(caFile)
		if err != nil {
			return nil, err
		}
		pem, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate", path)
		}
	}
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			// Dialled to the address the flow was decided for, never
			// to what the name resolves to now.
			flow, _ := ctx.Value(flowKey{}).(*interceptFlow)
			if flow == nil {
				return nil, errors.New("capsem: a dial without its flow")
			}
			ctx, cancel := context.WithTimeout(ctx, in.s.cfg.Limits.DialTimeout)
			defer cancel()
			return in.s.cfg.Dialer.DialContext(ctx, "tcp4", flow.dst.String())
		},
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 15 * time.Second,
	}
	in.transports[caFile] = t
	return t, nil
}

// placeholderInRequest finds a credential's placeholder in a request's
// target or a header that allowed does not accept, and says where.
func placeholderInRequest(r *http.Request, all []netpolicy.CredentialRule, allowed func(c netpolicy.CredentialRule, header string) bool) (netpolicy.CredentialRule, string, bool) {
	for _, c := range all {
		if strings.Contains(r.URL.RequestURI(), c.Placeholder) {
			return c, "the URL", true
		}
		for k, vs := range r.Header {
			if allowed != nil && allowed(c, k) {
				continue
			}
			for _, v := range vs {
				if strings.Contains(v, c.Placeholder) || strings.Contains(k, c.Placeholder) {
					return c, "header " + k, true
				}
			}
		}
	}
	return netpolicy.CredentialRule{}, "", false
}

// placeholderIn names the credential whose placeholder is in b, or "".
func placeholderIn(b []byte, all []netpolicy.CredentialRule) (netpolicy.CredentialRule, bool) {
	if !bytes.Contains(b, []byte(netpolicy.PlaceholderPrefix)) {
		return netpolicy.CredentialRule{}, false
	}
	for _, c := range all {
		if bytes.Contains(b, []byte(c.Placeholder)) {
			return c, true
		}
	}
	return netpolicy.CredentialRule{}, false
}

func redact(s, secret, placeholder string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, placeholder)
}

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// guestWriter is the response on its way to the guest: the secret, if
// the upstream echoes it, is replaced by the placeholder (in headers and
// body), bytes are counted and a model API's usage is read.
type guestWriter struct {
	http.ResponseWriter
	secret, placeholder string
	readUsage           bool // a model API's answer
	reader              *usageReader
	status              int
	n                   int64
	// held is the end of what was written that could be the start of the
	// secret: it waits for the next write to tell.
	held []byte
}

func (g *guestWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An informational answer (100 Continue, 103 Early Hints) goes
		// on; the final one is still to come.
		g.ResponseWriter.WriteHeader(code)
		return
	}
	if g.status != 0 {
		return
	}
	g.status = code
	if g.secret != "" {
		for k, vs := range g.Header() {
			for i, v := range vs {
				g.Header()[k][i] = redact(v, g.secret, g.placeholder)
			}
		}
	}
	if g.readUsage && code < 300 {
		g.reader = newUsageReader(g.Header().Get("Content-Type"))
	}
	g.ResponseWriter.WriteHeader(code)
}

func (g *guestWriter) Write(p []byte) (int, error) {
	if g.status == 0 {
		g.WriteHeader(http.StatusOK)
	}
	out := p
	if g.secret != "" {
		buf := append(g.held, p...)
		buf = bytes.ReplaceAll(buf, []byte(g.secret), []byte(g.placeholder))
		keep := partialSuffix(buf, g.secret)
		out, g.held = buf[:len(buf)-keep], append([]byte(nil), buf[len(buf)-keep:]...)
	}
	if err := g.emit(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (g *guestWriter) emit(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if g.reader != nil {
		g.reader.Write(b)
	}
	n, err := g.ResponseWriter.Write(b)
	g.n += int64(n)
	return err
}

// finish writes what was held back and ends the usage reading.
func (g *guestWriter) finish() {
	if len(g.held) > 0 {
		g.emit(g.held)
		g.held = nil
	}
	if g.reader != nil {
		g.reader.End()
	}
}

func (g *guestWriter) Flush() {
	if f, ok := g.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (g *guestWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// partialSuffix is the length of the longest end of b that is a proper
// start of secret.
func partialSuffix(b []byte, secret string) int {
	for n := min(len(b), len(secret)-1); n > 0; n-- {
		if string(b[len(b)-n:]) == secret[:n] {
			return n
		}
	}
	return 0
}
