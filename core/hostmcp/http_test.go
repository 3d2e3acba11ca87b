package hostmcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
)

func TestListenAddress(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		token bool
		want  string // "" when refused
		why   string // in the refusal
	}{
		{addr: "8080", want: "127.0.0.1:8080"},
		{addr: "0", want: "127.0.0.1:0"},
		{addr: ":0", want: "127.0.0.1:0"},
		{addr: "localhost:9", want: "localhost:9"},
		{addr: "127.0.0.2:9", want: "127.0.0.2:9"},
		{addr: "[::1]:0", want: "[::1]:0"},
		{addr: "0.0.0.0:8080", why: "0.0.0.0 is not a loopback address, and without --token-file"},
		{addr: "[::]:8080", why: ":: is not a loopback address"},
		{addr: "example.com:80", why: "example.com is not a loopback address"},
		{addr: "0.0.0.0:8080", token: true, want: "0.0.0.0:8080"},
		{addr: "", why: "empty address"},
		{addr: "127.0.0.1", why: "missing port"},
		{addr: "127.0.0.1:99999", why: "not a number from 0 to 65535"},
		{addr: "127.0.0.1:http", why: "not a number"},
	} {
		got, err := ListenAddress(tc.addr, tc.token)
		if tc.want != "" {
			if err != nil || got != tc.want {
				t.Errorf("%q (token %v): %q, %v; want %q", tc.addr, tc.token, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.why) {
			t.Errorf("%q (token %v): %q, %v; want a refusal saying %q", tc.addr, tc.token, got, err, tc.why)
		}
	}
}

// guardAt is the guard of a server listening on addr, in front of a
// handler that answers 204.
func guardAt(t *testing.T, addr string, opts HTTPOptions) http.Handler {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return newHTTPGuard(net.TCPAddrFromAddrPort(ap), opts).wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
}

// TestHTTPGuard: the Host must name the server (with its port), an
// Origin must be a loopback one, and the token, when set, is required;
// each refusal says which and why.
func TestHTTPGuard(t *testing.T) {
	const token = "0123456789abcdef-token"
	loop := HTTPOptions{}
	withToken := HTTPOptions{Token: token}
	named := HTTPOptions{AllowHosts: []string{"Capsem.Internal"}}
	for _, tc := range []struct {
		name   string
		addr   string
		opts   HTTPOptions
		host   string
		header http.Header
		status int
		says   string
	}{
		{name: "bound address", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", status: 204},
		{name: "localhost", addr: "127.0.0.1:4000", opts: loop, host: "localhost:4000", status: 204},
		{name: "LOCALHOST", addr: "127.0.0.1:4000", opts: loop, host: "LOCALHOST:4000", status: 204},
		{name: "ipv6 loopback", addr: "127.0.0.1:4000", opts: loop, host: "[::1]:4000", status: 204},
		{name: "other name", addr: "127.0.0.1:4000", opts: loop, host: "evil.example:4000", status: 403, says: `Host "evil.example:4000" is not this server's address`},
		{name: "rebinding name without port", addr: "127.0.0.1:4000", opts: loop, host: "evil.example", status: 403, says: "DNS rebinding"},
		{name: "wrong port", addr: "127.0.0.1:4000", opts: loop, host: "localhost:4001", status: 403, says: "localhost:4000"},
		{name: "no port is 80", addr: "127.0.0.1:4000", opts: loop, host: "localhost", status: 403},
		{name: "port 80 without port", addr: "127.0.0.1:80", opts: loop, host: "localhost", status: 204},
		{name: "empty host", addr: "127.0.0.1:4000", opts: loop, host: "", status: 403},
		{name: "other loopback address", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.2:4000", status: 403},
		{name: "trailing dot", addr: "127.0.0.1:4000", opts: loop, host: "localhost.:4000", status: 403},
		{name: "allowed name", addr: "127.0.0.1:4000", opts: named, host: "capsem.internal:4000", status: 204},
		{name: "allowed name, wrong port", addr: "127.0.0.1:4000", opts: named, host: "capsem.internal:4001", status: 403},
		{name: "bound non-loopback address", addr: "192.0.2.7:4000", opts: withToken, host: "192.0.2.7:4000", header: bearer(token), status: 204},
		{name: "loopback origin", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("http://localhost:6274"), status: 204},
		{name: "loopback origin https", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("https://127.0.0.1"), status: 204},
		{name: "ipv6 loopback origin", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("http://[::1]:3000"), status: 204},
		{name: "evil origin", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("http://evil.example"), status: 403, says: `Origin "http://evil.example" is not a loopback origin`},
		{name: "evil origin, localhost prefix", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("http://localhost.evil.example"), status: 403},
		{name: "evil origin with userinfo", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("http://localhost@evil.example"), status: 403},
		{name: "null origin", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("null"), status: 403},
		{name: "file origin", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: origin("file://localhost"), status: 403},
		{name: "two origins", addr: "127.0.0.1:4000", opts: loop, host: "127.0.0.1:4000", header: http.Header{"Origin": {"http://localhost", "http://evil.example"}}, status: 403},
		{name: "allowed name origin", addr: "127.0.0.1:4000", opts: named, host: "127.0.0.1:4000", header: origin("https://capsem.internal:8443"), status: 204},
		{name: "no token", addr: "127.0.0.1:4000", opts: withToken, host: "127.0.0.1:4000", status: 401, says: "needs a bearer token"},
		{name: "wrong token", addr: "127.0.0.1:4000", opts: withToken, host: "127.0.0.1:4000", header: bearer(token + "x"), status: 401, says: "wrong bearer token"},
		{name: "token's prefix", addr: "127.0.0.1:4000", opts: withToken, host: "127.0.0.1:4000", header: bearer(token[:10]), status: 401, says: "wrong bearer token"},
		{name: "basic auth", addr: "127.0.0.1:4000", opts: withToken, host: "127.0.0.1:4000", header: http.Header{"Authorization": {"Basic " + token}}, status: 401, says: "not a bearer token"},
		{name: "right token", addr: "127.0.0.1:4000", opts: withToken, host: "127.0.0.1:4000", header: bearer(token), status: 204},
		{name: "right token, lower-case scheme", addr: "127.0.0.1:4000", opts: withToken, host: "127.0.0.1:4000", header: http.Header{"Authorization": {"bearer " + token}}, status: 204},
		{name: "right token, bad host", addr: "127.0.0.1:4000", opts: withToken, host: "evil.example:4000", header: bearer(token), status: 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader("{}"))
			r.Host = tc.host
			for k, v := range tc.header {
				r.Header[k] = v
			}
			w := httptest.NewRecorder()
			guardAt(t, tc.addr, tc.opts).ServeHTTP(w, r)
			body := w.Body.String()
			if w.Code != tc.status || !strings.Contains(body, tc.says) {
				t.Fatalf("%d %q; want %d saying %q", w.Code, body, tc.status, tc.says)
			}
			challenge := w.Header().Get("WWW-Authenticate")
			switch {
			case w.Code == 401 && !strings.HasPrefix(challenge, `Bearer realm="capsem mcp"`):
				t.Errorf("401 without a bearer challenge: %q", challenge)
			case w.Code == 401 && (tc.header.Get("Authorization") != "") != strings.Contains(challenge, `error="invalid_token"`):
				t.Errorf("challenge %q for Authorization %q", challenge, tc.header.Get("Authorization"))
			case w.Code != 401 && challenge != "":
				t.Errorf("WWW-Authenticate %q on a %d", challenge, w.Code)
			}
		})
	}
}

func origin(o string) http.Header { return http.Header{"Origin": {o}} }
func bearer(t string) http.Header { return http.Header{"Authorization": {"Bearer " + t}} }

// FuzzHTTPGuard: whatever the Host and Origin, the guard never panics, and
// what it lets through names this server: a loopback name or the bound
// address with its port, and a loopback origin.
func FuzzHTTPGuard(f *testing.F) {
	for _, seed := range [][2]string{
		{"127.0.0.1:4000", ""}, {"localhost:4000", "http://localhost:3000"}, {"[::1]:4000", "null"},
		{"[::ffff:127.0.0.1]:4000", "http://[::ffff:127.0.0.1]"}, {"evil.example:4000", "http://evil.example"},
		{"[", "http://[::1"}, {"localhost:4000:4000", "http://localhost:4000/path"}, {"%6cocalhost:4000", "HTTP://LOCALHOST"},
	} {
		f.Add(seed[0], seed[1])
	}
	g := newHTTPGuard(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4000}, HTTPOptions{})
	f.Fuzz(func(t *testing.T, host, origin string) {
		if g.hostAllowed(host) {
			h, port, err := net.SplitHostPort(host)
			if err != nil || port != "4000" || !IsLoopbackHost(h) {
				t.Fatalf("Host %q let through", host)
			}
		}
		if g.originAllowed(origin) {
			u, err := url.Parse(origin)
			if err != nil || !IsLoopbackHost(u.Hostname()) {
				t.Fatalf("Origin %q let through", origin)
			}
		}
	})
}

func TestParseToken(t *testing.T) {
	for _, tc := range []struct {
		in, want, why string
	}{
		{in: "0123456789abcdef\n", want: "0123456789abcdef"},
		{in: "0123456789abcdef\r\n", want: "0123456789abcdef"},
		{in: "0123456789abcdef", want: "0123456789abcdef"},
		{in: "", why: "empty"},
		{in: "\n", why: "empty"},
		{in: "short\n", why: "at least 16"},
		{in: "0123456789 abcdef\n", why: "without spaces"},
		{in: "0123456789abcdef\n\n", why: "one line"},
		{in: "0123456789abcdef\nsecond line\n", why: "one line"},
		{in: "0123456789abcdéf", why: "visible ASCII"},
		{in: strings.Repeat("a", MaxTokenBytes+1), why: "more than"},
	} {
		got, err := ParseToken([]byte(tc.in))
		if tc.why == "" && (err != nil || got != tc.want) {
			t.Errorf("%q: %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)) {
			t.Errorf("%q: %q, %v; want an error saying %q", tc.in, got, err, tc.why)
		}
	}
}

// FuzzParseToken: a token taken is what a header can carry, within its
// bounds.
func FuzzParseToken(f *testing.F) {
	for _, seed := range []string{"0123456789abcdef\n", "", "a b", "0123456789abcdef\r\n", "\x00\x7f\xff"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := ParseToken(data)
		if err != nil {
			return
		}
		if len(tok) < MinTokenBytes || len(tok) > MaxTokenBytes {
			t.Fatalf("token of %d bytes taken", len(tok))
		}
		for _, c := range []byte(tok) {
			if c <= ' ' || c > '~' {
				t.Fatalf("token %q taken", tok)
			}
		}
	})
}

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := ReadTokenFile(write("ok", "0123456789abcdef\n", 0o600)); err != nil || tok != "0123456789abcdef" {
		t.Errorf("a private token file: %q, %v", tok, err)
	}
	if tok, err := ReadTokenFile(write("read-only", "0123456789abcdef\n", 0o400)); err != nil || tok != "0123456789abcdef" {
		t.Errorf("a read-only private token file: %q, %v", tok, err)
	}
	for _, tc := range []struct {
		path, why string
	}{
		{write("shared", "0123456789abcdef\n", 0o644), "mode 0644 lets others than its owner at the token: chmod 600 it"},
		{write("group", "0123456789abcdef\n", 0o640), "mode 0640"},
		{write("short", "abc\n", 0o600), "at least 16"},
		{dir, "not a regular file"},
		{filepath.Join(dir, "missing"), "no such file"},
		{write("huge", strings.Repeat("a", 10000), 0o600), "more than 4096"},
	} {
		if _, err := ReadTokenFile(tc.path); err == nil || !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), "--token-file") {
			t.Errorf("%s: %v; want an error naming --token-file and saying %q", tc.path, err, tc.why)
		}
	}
}

// writeRecorder is a fakeService that keeps the content a write got.
type writeRecorder struct {
	*fakeService
	mu      sync.Mutex
	written api.WriteFileRequest
}

func (w *writeRecorder) WriteFile(_ context.Context, _ string, req api.WriteFileRequest) error {
	w.mu.Lock()
	w.written = req
	w.mu.Unlock()
	return nil
}

// httpServer serves New(svc) on a loopback port until the test ends; it
// returns the URL and a stop that cancels ServeHTTP and waits for it.
func httpServer(t *testing.T, svc Service, opts HTTPOptions) (string, func() error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeHTTP(ctx, New(svc, "9.9"), l, opts) }()
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() { cancel(); serveErr = <-done })
		return serveErr
	}
	t.Cleanup(func() { stop() })
	return "http://" + l.Addr().String() + HTTPPath, stop
}

// httpClient connects the SDK's client over streamable HTTP, on a
// transport of its own (closed when the test ends).
func httpClient(t *testing.T, endpoint string, opts *mcp.ClientOptions) (*mcp.ClientSession, *http.Transport) {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: tr}, MaxEventSize: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, tr
}

// TestHTTPTakesTheLargestWrite: a capsem_write_file of MaxToolFileBytes,
// base64 (over 85 MiB of JSON), reaches the tool whole over HTTP; a body
// past MaxMessageBytes is refused with 413, and the session goes on. The
// bodies are sent raw, in the session the SDK's client opened: encoding
// them with the SDK's client too would double the test's time.
func TestHTTPTakesTheLargestWrite(t *testing.T) {
	svc := &writeRecorder{fakeService: &fakeService{}}
	endpoint, _ := httpServer(t, svc, HTTPOptions{})
	cs, _ := httpClient(t, endpoint, nil)
	post := func(body io.Reader) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, endpoint, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", cs.ID())
		req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	content := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xa5}, MaxToolFileBytes))
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"capsem_write_file","arguments":{"id":"dev","path":"/big","encoding":"base64","content":"` + content + `"}}}`
	if status, answer := post(strings.NewReader(call)); status != http.StatusOK || !strings.Contains(answer, `"id":7`) || strings.Contains(answer, `"isError":true`) {
		t.Fatalf("the largest write: %d %.300s", status, answer)
	}
	svc.mu.Lock()
	got := svc.written
	svc.mu.Unlock()
	if got.Content != content || got.Encoding != "base64" || got.Path != "/big" {
		t.Fatalf("the service got %d bytes of content (want %d), %q, %q", len(got.Content), len(content), got.Encoding, got.Path)
	}

	// One byte past the bound, read from a stream (no length known ahead).
	over := io.MultiReader(strings.NewReader(`{"jsonrpc":"2.0","id":8,"method":"ping","params":{"pad":"`),
		io.LimitReader(repeatX{}, MaxMessageBytes))
	if status, answer := post(over); status != http.StatusRequestEntityTooLarge || !strings.Contains(answer, fmt.Sprint(MaxMessageBytes)) {
		t.Errorf("the oversized body: %d %.300q, want 413 naming the bound", status, answer)
	}
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("the session after the refused body: %v", err)
	}
}

// repeatX reads as an endless run of x.
type repeatX struct{}

func (repeatX) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestHTTPShutdown: told to stop, ServeHTTP ends the clients' listening
// streams at once, lets a call in flight finish within the grace and
// cancels it past the grace; when it returns, no goroutine of its own is
// left.
func TestHTTPShutdown(t *testing.T) {
	before := runtime.NumGoroutine()
	svc := &fakeService{block: make(chan struct{})}
	const grace = 300 * time.Millisecond
	endpoint, stop := httpServer(t, svc, HTTPOptions{ShutdownGrace: grace})
	cs, tr := httpClient(t, endpoint, nil)
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	called := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "capsem_exec", Arguments: map[string]any{"id": "dev", "command": "sleep"}})
		called <- err
	}()
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		svc.mu.Lock()
		started := svc.execReq.Command != ""
		svc.mu.Unlock()
		if started {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("the call never reached the service")
		}
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	took := time.Since(start)
	if took < grace || took > grace+3*time.Second {
		t.Errorf("shutdown took %v with a call in flight, want the grace (%v) and little more", took, grace)
	}
	svc.mu.Lock()
	cancelled := svc.execCtx
	svc.mu.Unlock()
	if cancelled == nil {
		t.Error("the call still running past the grace was not cancelled")
	}
	select {
	case err := <-called:
		if err == nil {
			t.Error("the cut call succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Error("the client's call never ended")
	}
	cs.Close()
	tr.CloseIdleConnections()
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() > before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
	}
}

// TestHTTPShutdownWithoutCalls: with only a client's listening stream
// open, stopping takes no grace.
func TestHTTPShutdownWithoutCalls(t *testing.T) {
	endpoint, stop := httpServer(t, &fakeService{}, HTTPOptions{ShutdownGrace: time.Minute})
	cs, _ := httpClient(t, endpoint, nil)
	if _, err := cs.ListTools(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("ServeHTTP: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("shutdown took %v with only a listening stream open", took)
	}
}

// TestStdioTakesTheLargestWrite: the stdio transport's bound is the same:
// the line of a capsem_write_file of MaxToolFileBytes, base64, is read
// whole.
func TestStdioTakesTheLargestWrite(t *testing.T) {
	content := strings.Repeat("A", (MaxToolFileBytes+2)/3*4)
	line := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"capsem_write_file","arguments":{"id":"dev","path":"/big","encoding":"base64","content":"` + content + `"}}}`
	got, over, err := readLine(bufio.NewReaderSize(strings.NewReader(line+"\n"), 64<<10), MaxLineBytes)
	if over || err != nil || len(got) != len(line) {
		t.Fatalf("the largest write's line (%d bytes): %d bytes read, over %v, %v", len(line), len(got), over, err)
	}
}

// TestHTTPAllowHost: a name given in AllowHosts reaches the server on a
// loopback listener through the SDK's handler too (whose own check would
// refuse any name that is not loopback); others are still refused.
func TestHTTPAllowHost(t *testing.T) {
	endpoint, _ := httpServer(t, &fakeService{}, HTTPOptions{AllowHosts: []string{"capsem.internal"}})
	u, _ := url.Parse(endpoint)
	_, port, _ := net.SplitHostPort(u.Host)
	for host, want := range map[string]int{"capsem.internal:" + port: 200, "other.internal:" + port: 403, "localhost:" + port: 200} {
		req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Host %s: %d %q, want %d", host, resp.StatusCode, body, want)
		}
	}
}
