package builtintools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/capsem/capsem/core/netpolicy"
)

// maxResponseHeaderBytes bounds response headers, which are not paginated.
const maxResponseHeaderBytes = 256 << 10

// target is a URL that passed the scheme and host checks.
type target struct {
	url  *url.URL
	host string // normalized, as policy compares it
	port int
}

// parseTarget checks a user-supplied URL: it must parse, use http or https,
// and name a valid host.
func parseTarget(rawURL string) (target, error) {
	trimmed := strings.TrimSpace(rawURL)
	if trimmed == "" {
		return target{}, errors.New("url is required")
	}
	parsed, err := url.Parse(trimmed)
	if err != nil {
		return target{}, fmt.Errorf("invalid url: %w", err)
	}
	return targetFromURL(parsed)
}

func targetFromURL(u *url.URL) (target, error) {
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
	case "":
		return target{}, fmt.Errorf("url %q has no scheme: use http:// or https://", u.String())
	default:
		return target{}, fmt.Errorf("unsupported url scheme %q in %q: only http and https are allowed", u.Scheme, u.String())
	}
	if u.Hostname() == "" {
		return target{}, fmt.Errorf("url %q has no host", u.String())
	}
	host, err := netpolicy.NormalizeHost(u.Hostname())
	if err != nil {
		return target{}, fmt.Errorf("url %q has an invalid host: %w", u.String(), err)
	}
	port, err := portOf(u)
	if err != nil {
		return target{}, err
	}
	return target{url: u, host: host, port: port}, nil
}

// portOf is the TCP port a URL connects to: the explicit one, else the
// scheme's default.
func portOf(u *url.URL) (int, error) {
	if explicit := u.Port(); explicit != "" {
		port, err := strconv.Atoi(explicit)
		if err != nil || port < 1 || port > 65535 {
			return 0, fmt.Errorf("url %q has an invalid port %q", u.String(), explicit)
		}
		return port, nil
	}
	switch strings.ToLower(u.Scheme) {
	case "http":
		return 80, nil
	case "https":
		return 443, nil
	}
	return 0, fmt.Errorf("url %q has no port and an unknown scheme", u.String())
}

// BlockedError is a request refused by the domain policy or, when private
// networks are not allowed, by the address it resolved to; on the first URL
// or on a redirect hop.
type BlockedError struct {
	Host         string
	Reason       string // e.g. `domain blocked by "*.com"`, or "private or loopback address; …"
	RedirectFrom string // the URL that redirected here, if any
}

func (e *BlockedError) Error() string {
	if e.RedirectFrom != "" {
		return fmt.Sprintf("HTTP request blocked: %s (%s; redirected from %s)", e.Host, e.Reason, e.RedirectFrom)
	}
	return fmt.Sprintf("HTTP request blocked: %s (%s)", e.Host, e.Reason)
}

// redirectRefusal marks an error that CheckRedirect already recorded, so
// the caller does not record the hop a second time.
type redirectRefusal struct{ err error }

func (r *redirectRefusal) Error() string { return r.err.Error() }
func (r *redirectRefusal) Unwrap() error { return r.err }

// httpFetcher performs policy-checked HTTP exchanges for the tools.
type httpFetcher struct {
	cfg    Config
	policy *netpolicy.Lists
	// policyErr is set when the configuration could not be compiled;
	// every request is then refused (fail closed) with it.
	policyErr error
	transport http.RoundTripper
	userAgent string
}

// newHTTPFetcher builds the fetcher; hooks nil means the system resolver
// and dialer (tests pass their own, see netHooks).
func newHTTPFetcher(cfg Config, version string, hooks *netHooks) *httpFetcher {
	cfg = cfg.withDefaults()
	// NewServer cannot return an error; an invalid configuration refuses
	// every request instead of silently running with a policy that blocks
	// less than intended.
	policy, policyErr := netpolicy.CompileLists(cfg.Allow, cfg.Block)
	if cfg.MaxBodyBytes < 0 || cfg.Timeout < 0 {
		policyErr = cfg.Validate()
	}
	dialer := &guardedDialer{allowPrivate: cfg.AllowPrivateNetworks, hooks: systemNetHooks(cfg.AllowPrivateNetworks)}
	if hooks != nil {
		dialer.hooks = *hooks
	}
	transport := &http.Transport{
		// No proxy: the builtin is the egress point and its policy is about
		// the real destination.
		Proxy: nil,
		// The only way the transport connects: the guard checks the
		// resolved address of every connection, redirect hops included.
		DialContext:            dialer.DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           16,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    15 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	if version == "" {
		version = "dev"
	}
	return &httpFetcher{cfg: cfg, policy: policy, policyErr: policyErr, transport: transport, userAgent: "capsem-builtin/" + version}
}

// checkHost decides one host by the domain lists.
func (f *httpFetcher) checkHost(host string) netpolicy.Verdict {
	if f.policyErr != nil {
		return netpolicy.Verdict{Reason: "domain policy is invalid: " + f.policyErr.Error()}
	}
	return f.policy.Check(host)
}

// fetchRequest is one tool's HTTP exchange.
type fetchRequest struct {
	method  string
	url     string
	headers map[string]string
	body    string
	hasBody bool
	// readBody false stops after the headers (http_headers, HEAD).
	readBody bool
	// checkHeaders may refuse a response before its body is read, and
	// checkBody after; a refusal is recorded as an error event.
	checkHeaders func(*http.Response) error
	checkBody    func(*http.Response, []byte) error
}

// fetchResponse is what a tool gets back from a successful exchange.
type fetchResponse struct {
	requestURL  *url.URL
	finalURL    *url.URL
	finalMethod string
	statusCode  int
	status      string // e.g. "404 Not Found"
	header      http.Header
	body        []byte
	// bodyLimitReached: the body was longer than MaxBodyBytes and was cut.
	bodyLimitReached bool
}

// headers a caller may not set: they describe the connection, which the
// transport owns, and a forged Host could reach a vhost policy never saw.
var forbiddenRequestHeaders = map[string]bool{
	"Host":              true,
	"Content-Length":    true,
	"Transfer-Encoding": true,
	"Connection":        true,
}

// fetch runs one policy-checked exchange. Every attempt, including refused
// and failed ones and each redirect hop, is recorded in log.
func (f *httpFetcher) fetch(ctx context.Context, log *eventLog, request fetchRequest) (*fetchResponse, error) {
	var bytesSent int64
	if request.hasBody {
		bytesSent = int64(len(request.body))
	}
	parsed, _ := url.Parse(strings.TrimSpace(request.url))
	current := startHop(log, request.method, parsed, bytesSent)

	tgt, err := parseTarget(request.url)
	if err != nil {
		current.finish(DecisionError, 0, 0, err.Error())
		return nil, err
	}
	if err := validateRequestHeaders(request.headers); err != nil {
		current.finish(DecisionError, 0, 0, err.Error())
		return nil, err
	}
	verdict := f.checkHost(tgt.host)
	current.matchedRule = verdict.Rule
	if !verdict.Allowed {
		blocked := &BlockedError{Host: tgt.host, Reason: verdict.Reason}
		current.finish(DecisionDenied, 0, 0, verdict.Reason)
		return nil, blocked
	}

	timeoutCtx, cancel := context.WithTimeout(ctx, f.cfg.Timeout)
	defer cancel()

	var bodyReader io.Reader
	if request.hasBody {
		bodyReader = strings.NewReader(request.body)
	}
	httpRequest, err := http.NewRequestWithContext(timeoutCtx, request.method, tgt.url.String(), bodyReader)
	if err != nil {
		err = fmt.Errorf("building %s request: %w", request.method, err)
		current.finish(DecisionError, 0, 0, err.Error())
		return nil, err
	}
	// Each hop's connection names the address it reached (a redirect's
	// request keeps this context, and current is its hop by then).
	httpRequest = httpRequest.WithContext(httptrace.WithClientTrace(httpRequest.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if ap, err := netip.ParseAddrPort(info.Conn.RemoteAddr().String()); err == nil {
				current.ip = ap.Addr().Unmap().String()
			}
		},
	}))
	httpRequest.Header.Set("User-Agent", f.userAgent)
	for name, value := range request.headers {
		httpRequest.Header.Set(name, value)
	}

	// redirectFrom is the URL that redirected to the hop in progress.
	redirectFrom := ""
	client := &http.Client{
		Transport: f.transport,
		CheckRedirect: func(next *http.Request, via []*http.Request) error {
			if f.cfg.MaxRedirects < 0 {
				return http.ErrUseLastResponse
			}
			// The previous hop ended with a redirect response.
			redirectStatus := 0
			if next.Response != nil {
				redirectStatus = next.Response.StatusCode
			}
			current.finish(DecisionAllowed, redirectStatus, 0, "")
			from := via[len(via)-1].URL.Redacted()
			current = startHop(log, next.Method, next.URL, max(next.ContentLength, 0))
			redirectFrom = from

			if len(via) > f.cfg.MaxRedirects {
				err := fmt.Errorf("too many redirects: stopped after %d (limit %d), next was %s", len(via)-1, f.cfg.MaxRedirects, next.URL.Redacted())
				current.finish(DecisionError, 0, 0, err.Error())
				return &redirectRefusal{err}
			}
			nextTarget, err := targetFromURL(next.URL)
			if err != nil {
				err = fmt.Errorf("redirect from %s refused: %w", from, err)
				current.finish(DecisionError, 0, 0, err.Error())
				return &redirectRefusal{err}
			}
			verdict := f.checkHost(nextTarget.host)
			current.matchedRule = verdict.Rule
			if !verdict.Allowed {
				current.finish(DecisionDenied, 0, 0, verdict.Reason)
				return &redirectRefusal{&BlockedError{Host: nextTarget.host, Reason: verdict.Reason, RedirectFrom: from}}
			}
			return nil
		},
	}

	response, err := client.Do(httpRequest)
	if err != nil {
		var refusal *redirectRefusal
		if errors.As(err, &refusal) {
			return nil, refusal.err
		}
		if refused, ok := asPrivateAddressError(err); ok {
			blocked := &BlockedError{Host: refused.host, Reason: refused.reason(), RedirectFrom: redirectFrom}
			current.matchedRule = MatchedRulePrivateNetwork
			current.ip = refused.addr.String()
			current.finish(DecisionDenied, 0, 0, blocked.Reason)
			return nil, blocked
		}
		err = f.describeFailure(ctx, timeoutCtx, request.method, tgt.url, err)
		current.finish(DecisionError, 0, 0, err.Error())
		return nil, err
	}
	defer response.Body.Close()

	result := &fetchResponse{
		requestURL:  tgt.url,
		finalURL:    response.Request.URL,
		finalMethod: response.Request.Method,
		statusCode:  response.StatusCode,
		status:      response.Status,
		header:      response.Header,
	}
	if request.checkHeaders != nil {
		if err := request.checkHeaders(response); err != nil {
			current.finish(DecisionError, response.StatusCode, 0, err.Error())
			return nil, err
		}
	}
	if !request.readBody {
		current.finish(DecisionAllowed, response.StatusCode, 0, "")
		return result, nil
	}
	body, limitReached, err := readCapped(response.Body, f.cfg.MaxBodyBytes)
	if err != nil {
		err = f.describeFailure(ctx, timeoutCtx, request.method, result.finalURL, fmt.Errorf("reading response body: %w", err))
		current.finish(DecisionError, response.StatusCode, int64(len(body)), err.Error())
		return nil, err
	}
	if request.checkBody != nil {
		if err := request.checkBody(response, body); err != nil {
			current.finish(DecisionError, response.StatusCode, int64(len(body)), err.Error())
			return nil, err
		}
	}
	current.finish(DecisionAllowed, response.StatusCode, int64(len(body)), "")
	result.body = body
	result.bodyLimitReached = limitReached
	return result, nil
}

// describeFailure turns a transport error into a message that says what
// happened (timeout, cancellation, DNS, connection) and where.
func (f *httpFetcher) describeFailure(ctx, timeoutCtx context.Context, method string, target *url.URL, err error) error {
	where := method + " " + target.Redacted()
	if ctx.Err() != nil {
		return fmt.Errorf("HTTP %s canceled: %w", where, ctx.Err())
	}
	if errors.Is(timeoutCtx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("HTTP %s timed out after %s: %w", where, f.cfg.Timeout, context.DeadlineExceeded)
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return fmt.Errorf("HTTP %s failed: cannot resolve host %q: %w", where, dnsErr.Name, err)
	}
	return fmt.Errorf("HTTP %s failed: %w", where, err)
}

// readCapped reads at most limit bytes; one byte more tells whether the
// body was longer.
func readCapped(r io.Reader, limit int64) ([]byte, bool, error) {
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if int64(len(body)) > limit {
		return body[:limit], true, err
	}
	return body, false, err
}

func validateRequestHeaders(headers map[string]string) error {
	for name, value := range headers {
		if name == "" || !isHeaderToken(name) {
			return fmt.Errorf("invalid header name %q", name)
		}
		if forbiddenRequestHeaders[http.CanonicalHeaderKey(name)] {
			return fmt.Errorf("header %q cannot be set: the HTTP client sets it", name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return fmt.Errorf("header %q has a value with a line break or NUL", name)
		}
	}
	return nil
}

// isHeaderToken reports whether s is an RFC 9110 token.
func isHeaderToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
