package netstack

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/capsem/capsem/core/netca"
	"github.com/capsem/capsem/core/netpolicy"
)

const (
	testSecret      = "sk-real-SECRET-0123456789"
	testPlaceholder = "capsem-placeholder-anthropic-api-key"
)

var modelIP = netip.MustParseAddr("203.0.113.30")

// fakeAnthropic is a model API upstream of the test's: it streams
// Anthropic's event format and echoes the key it got (as a careless
// upstream's error might), in a header and split across two writes.
type fakeAnthropic struct {
	mu      sync.Mutex
	keys    []string
	protos  []int
	release chan struct{} // closed by the test once it saw the first event
}

func (f *fakeAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Api-Key")
	f.mu.Lock()
	f.keys = append(f.keys, key)
	f.protos = append(f.protos, r.ProtoMajor)
	f.mu.Unlock()
	io.Copy(io.Discard, r.Body)
	if r.URL.Path == "/early" {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		fmt.Fprint(w, "after early hints")
		return
	}
	if r.URL.Path != "/v1/messages" {
		fmt.Fprint(w, "not a model call")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Echo", key)
	fl := w.(http.Flusher)
	fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-test-1\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n")
	fl.Flush()
	if f.release != nil {
		select {
		case <-f.release:
		case <-time.After(10 * time.Second):
			return
		}
	}
	fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"echo %s", key[:8])
	fl.Flush()
	fmt.Fprintf(w, "%s\"}}\n\n", key[8:])
	fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n")
	fmt.Fprint(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
}

type credRig struct {
	*rig
	up      *fakeAnthropic
	ca      *netca.CA
	srvAddr string
}

func newCredRig(t *testing.T) *credRig {
	t.Helper()
	dir := t.TempDir()
	upCA, err := netca.LoadOrCreate(filepath.Join(dir, "upstream-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "upstream-roots.pem")
	if err := os.WriteFile(caFile, upCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	leaf, err := upCA.Leaf("api.anthropic.com")
	if err != nil {
		t.Fatal(err)
	}
	up := &fakeAnthropic{}
	srv := httptest.NewUnstartedServer(up)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	ca, err := netca.LoadOrCreate(filepath.Join(dir, "capsem-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := netpolicy.Compile([]netpolicy.Layer{{Source: "corp.toml", Credentials: []netpolicy.Credential{
		{Host: "api.anthropic.com", Header: "x-api-key", SourceEnv: "TEST_KEY", GuestEnv: "ANTHROPIC_API_KEY", CAFile: caFile},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	pol := basePolicy()
	pol.allow["api.anthropic.com"] = true
	pol.creds = creds
	res := baseResolver()
	res["api.anthropic.com"] = []netip.Addr{modelIP}
	t.Setenv("TEST_KEY", testSecret)
	r := newRig(t, pol, res, testLimits(), func(c *Config) { c.CA = ca })
	r.dialer.routes[netip.AddrPortFrom(modelIP, 443)] = srv.Listener.Addr().String()
	r.servers(t)
	for _, n := range []string{"api.anthropic.com", "allowed.example", "other.example"} {
		if got := answers(r.query(t, "192.168.127.1", n, dns.TypeA)); len(got) != 1 {
			t.Fatalf("%s: %v", n, got)
		}
	}
	return &credRig{rig: r, up: up, ca: ca, srvAddr: srv.Listener.Addr().String()}
}

// client is a guest program's HTTP client trusting roots.
func (c *credRig) client(roots *x509.CertPool, h2 bool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			ip := map[string]string{"api.anthropic.com": modelIP.String(), "other.example": otherIP.String(), "allowed.example": allowedIP.String()}[host]
			return c.dial(ctx, net.JoinHostPort(ip, port))
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func (c *credRig) trusted() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(c.ca.CertPEM())
	return p
}

func TestCredentialInjection(t *testing.T) {
	c := newCredRig(t)
	for _, h2 := range []bool{true, false} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			c.up.release = make(chan struct{})
			req, _ := http.NewRequest("POST", "https://api.anthropic.com/v1/messages", strings.NewReader(`{"model":"claude-test-1","stream":true}`))
			req.Header.Set("X-Api-Key", testPlaceholder)
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := c.client(c.trusted(), h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || (resp.ProtoMajor == 2) != h2 {
				t.Fatalf("status %d proto %s", resp.StatusCode, resp.Proto)
			}
			// The first event arrives while the upstream still holds the
			// rest: the stream is not buffered.
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || line != "event: message_start\n" {
				t.Fatalf("first line %q, %v", line, err)
			}
			close(c.up.release)
			rest, err := io.ReadAll(br)
			if err != nil {
				t.Fatal(err)
			}
			body := line + string(rest)
			if strings.Contains(body, testSecret) || !strings.Contains(body, "echo "+testPlaceholder) {
				t.Fatalf("the echoed key reached the guest as %q", body)
			}
			if got := resp.Header.Get("X-Echo"); got != testPlaceholder {
				t.Fatalf("echo header %q, want the placeholder", got)
			}
			c.up.mu.Lock()
			last := c.up.keys[len(c.up.keys)-1]
			proto := c.up.protos[len(c.up.protos)-1]
			c.up.mu.Unlock()
			if last != testSecret || proto != 2 {
				t.Fatalf("the upstream got key %q over HTTP/%d, want the real value over HTTP/2", last, proto)
			}
			ev := c.ev.waitConn(t, func(e ConnEvent) bool { return e.Kind == KindHTTPS && e.Path == "/v1/messages" && e.Status == 200 })
			if !ev.Allowed || ev.Rule != RuleCredential || ev.Source != "corp.toml" || ev.Method != "POST" || ev.BytesSent == 0 || ev.BytesReceived != int64(len(body)) {
				t.Fatalf("event %+v (body %d bytes)", ev, len(body))
			}
			c.ev.mu.Lock()
			m := c.ev.models[len(c.ev.models)-1]
			c.ev.mu.Unlock()
			if m.Provider != ProviderAnthropic || m.Model != "claude-test-1" || m.InputTokens != 25 || m.OutputTokens != 15 || m.Status != 200 || m.ResponseBytes != int64(len(body)) {
				t.Fatalf("model event %+v", m)
			}
		})
	}
	c.up.release = nil
	t.Run("an informational answer before the final one", func(t *testing.T) {
		var early atomic.Int64
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error { early.Store(int64(code)); return nil }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "https://api.anthropic.com/early", nil)
		req.Header.Set("X-Api-Key", testPlaceholder)
		resp, err := c.client(c.trusted(), false).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if early.Load() != http.StatusEarlyHints || resp.StatusCode != 200 || string(body) != "after early hints" {
			t.Fatalf("1xx %d, then %d %q", early.Load(), resp.StatusCode, body)
		}
		// The row has the final status.
		if ev := c.ev.waitConn(t, func(e ConnEvent) bool { return e.Path == "/early" }); ev.Status != 200 {
			t.Fatalf("recorded status %d, want the final 200", ev.Status)
		}
	})
	t.Run("placeholder in another header", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "https://api.anthropic.com/v1/models", nil)
		req.Header.Set("X-Api-Key", testPlaceholder)
		req.Header.Set("X-Debug", "key="+testPlaceholder)
		resp, err := c.client(c.trusted(), true).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d", resp.StatusCode)
		}
		ev := c.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleExfiltration && e.Path == "/v1/models" })
		if ev.Allowed || !strings.Contains(ev.Reason, "X-Debug") || !strings.Contains(ev.Reason, "ANTHROPIC_API_KEY") {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("placeholder in the URL", func(t *testing.T) {
		resp, err := c.client(c.trusted(), false).Get("https://api.anthropic.com/leak?k=" + testPlaceholder)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d", resp.StatusCode)
		}
		c.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleExfiltration && e.Path == "/leak" })
	})
	t.Run("another host on the connection", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "https://api.anthropic.com/x", nil)
		req.Host = "other.example"
		resp, err := c.client(c.trusted(), false).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMisdirectedRequest {
			t.Fatalf("status %d", resp.StatusCode)
		}
		c.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleNameMismatch && e.Kind == KindHTTPS })
	})
	t.Run("placeholder over plain HTTP", func(t *testing.T) {
		before := len(c.dialer.dialed())
		req, _ := http.NewRequest("GET", "http://other.example/", nil)
		req.Header.Set("Authorization", "Bearer "+testPlaceholder)
		if resp, err := c.client(nil, false).Do(req); err == nil {
			resp.Body.Close()
			t.Fatal("a placeholder went out over plain HTTP")
		}
		ev := c.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleExfiltration && e.Name == "other.example" })
		if ev.Allowed || !strings.Contains(ev.Reason, "plain HTTP") {
			t.Fatalf("event %+v", ev)
		}
		if len(c.dialer.dialed()) != before {
			t.Fatalf("the host dialled for it: %v", c.dialer.dialed())
		}
	})
	t.Run("a guest that does not trust the CA", func(t *testing.T) {
		if _, err := c.client(x509.NewCertPool(), false).Get("https://api.anthropic.com/v1/models"); err == nil {
			t.Fatal("TLS to the credential path verified without the CA")
		}
		ev := c.ev.waitConn(t, func(e ConnEvent) bool { return strings.Contains(e.Err, "guest TLS handshake") })
		if ev.Name != "api.anthropic.com" {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("other hosts are not intercepted", func(t *testing.T) {
		// allowed.example's test server has its own certificate, which
		// only the spliced path presents.
		if _, err := c.client(c.trusted(), false).Get("https://allowed.example/path"); err == nil {
			t.Fatal("a host without a credential was served with the capsem CA")
		}
	})
	c.ev.mu.Lock()
	all := fmt.Sprintf("%+v %+v %+v", c.ev.conns, c.ev.dns, c.ev.models)
	c.ev.mu.Unlock()
	if strings.Contains(all, testSecret) {
		t.Fatal("the real secret is in a recorded event")
	}
}

func TestPartialSuffix(t *testing.T) {
	cases := []struct {
		b, secret string
		want      int
	}{
		{"abc", "secret", 0},
		{"abcs", "secret", 1},
		{"abcsecre", "secret", 5},
		{"secret", "secret", 0}, // a whole secret is replaced, not held
		{"", "secret", 0},
		{"sese", "secret", 2},
	}
	for _, tc := range cases {
		if got := partialSuffix([]byte(tc.b), tc.secret); got != tc.want {
			t.Errorf("partialSuffix(%q, %q) = %d, want %d", tc.b, tc.secret, got, tc.want)
		}
	}
}
