package netstack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/capsem/capsem/core/netca"
	"github.com/capsem/capsem/core/netpolicy"
)

var upstreamIP = netip.MustParseAddr("203.0.113.40")

const upstreamSecretEnv = "TEST_UPSTREAM_SECRET"

// upstreamWorld is one credential's world: the policy gives cred.Host a
// credential whose secret is in upstreamSecretEnv and whose ca_file
// trusts trustedCA; the guest resolves the host to upstreamIP, and the
// host's dial there reaches handler over TLS with a leaf of leafCA.
type upstreamWorld struct {
	*rig
	host string
	ca   *netca.CA // capsem's, which the guest trusts
}

func newUpstreamWorld(t *testing.T, cred netpolicy.Credential, secret string, handler http.Handler, leafCA, trustedCA *netca.CA) *upstreamWorld {
	t.Helper()
	dir := t.TempDir()
	cred.SourceEnv, cred.CAFile = upstreamSecretEnv, filepath.Join(dir, "upstream-roots.pem")
	if err := os.WriteFile(cred.CAFile, trustedCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(upstreamSecretEnv, secret)
	leaf, err := leafCA.Leaf(cred.Host)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(handler)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	// A rogue upstream's refused handshakes are the test's point, not news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca, err := netca.LoadOrCreate(filepath.Join(dir, "capsem-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := netpolicy.Compile([]netpolicy.Layer{{Source: "corp.toml", Credentials: []netpolicy.Credential{cred}}})
	if err != nil {
		t.Fatal(err)
	}
	pol := basePolicy()
	pol.allow[cred.Host] = true
	pol.creds = creds
	res := baseResolver()
	res[cred.Host] = []netip.Addr{upstreamIP}
	r := newRig(t, pol, res, testLimits(), func(c *Config) { c.CA = ca })
	r.dialer.routes[netip.AddrPortFrom(upstreamIP, 443)] = srv.Listener.Addr().String()
	if got := answers(r.query(t, "192.168.127.1", cred.Host, dns.TypeA)); len(got) != 1 || got[0] != upstreamIP.String() {
		t.Fatalf("%s: %v", cred.Host, got)
	}
	return &upstreamWorld{rig: r, host: cred.Host, ca: ca}
}

// client is a guest program's HTTP client, trusting capsem's CA.
func (w *upstreamWorld) client() *http.Client {
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(w.ca.CertPEM())
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return w.dial(ctx, net.JoinHostPort(upstreamIP.String(), port))
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
	}}
}

func newTestCA(t *testing.T, name string) *netca.CA {
	t.Helper()
	ca, err := netca.LoadOrCreate(filepath.Join(t.TempDir(), name+".pem"))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestUntrustedUpstream: on the credential path the host verifies the
// upstream before it sends anything. One whose certificate chains to
// neither the host's roots nor the credential's ca_file (a rogue CA: a
// redirected route, a man in the middle) gets no request, so never the
// secret; the guest gets an error status and the refusal is a row.
func TestUntrustedUpstream(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" key="+r.Header.Get("X-Api-Key"))
		mu.Unlock()
		fmt.Fprint(w, "served")
	})
	w := newUpstreamWorld(t, netpolicy.Credential{Host: "api.anthropic.com", Header: "x-api-key", GuestEnv: "ANTHROPIC_API_KEY"},
		testSecret, upstream, newTestCA(t, "rogue"), newTestCA(t, "trusted"))
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, "https://api.anthropic.com/v1/messages", strings.NewReader(`{"model":"m"}`))
		req.Header.Set("X-Api-Key", testPlaceholder)
		resp, err := w.client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || strings.Contains(string(body), "served") {
			t.Fatalf("%s: status %d, body %q; want 502 from the host", method, resp.StatusCode, body)
		}
	}
	mu.Lock()
	if len(seen) != 0 {
		t.Fatalf("the untrusted upstream got requests: %q", seen)
	}
	mu.Unlock()
	ev := w.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleUpstreamUntrusted })
	if ev.Allowed || ev.Kind != KindHTTPS || ev.Name != "api.anthropic.com" || ev.Status != http.StatusBadGateway ||
		!strings.Contains(ev.Reason, "ca_file") || !strings.Contains(ev.Err, "certificate") {
		t.Fatalf("event %+v", ev)
	}
	w.ev.waitCount(t, 2, func(e ConnEvent) bool { return e.Rule == RuleUpstreamUntrusted })
	w.ev.mu.Lock()
	defer w.ev.mu.Unlock()
	if all := fmt.Sprintf("%+v", w.ev.conns); strings.Contains(all, testSecret) {
		t.Fatal("the secret is in a recorded event")
	}
}

// TestModelCallsThroughCredentials: each provider's streaming answer, on
// the credential path, is a model call with the provider, the model and
// both token counts.
func TestModelCallsThroughCredentials(t *testing.T) {
	trusted := newTestCA(t, "trusted")
	cases := []struct {
		name                      string
		cred                      netpolicy.Credential
		path, keyFormat, secret   string
		events                    []string
		provider, model           string
		inputTokens, outputTokens int64
	}{
		{
			name: "openai chat completions", cred: netpolicy.Credential{Host: "api.openai.com", Header: "authorization", GuestEnv: "OPENAI_API_KEY"},
			path: "/v1/chat/completions", keyFormat: "Bearer %s", secret: "sk-proj-REAL-openai-0123456789",
			events: []string{
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}],"usage":null}`,
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}],"usage":null}`,
				`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini-2024-07-18","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":2,"total_tokens":21}}`,
				`[DONE]`,
			},
			provider: ProviderOpenAI, model: "gpt-4o-mini-2024-07-18", inputTokens: 19, outputTokens: 2,
		},
		{
			name: "google streamGenerateContent", cred: netpolicy.Credential{Host: "generativelanguage.googleapis.com", Header: "x-goog-api-key", GuestEnv: "GEMINI_API_KEY"},
			path: "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse", keyFormat: "%s", secret: "AIza-REAL-google-0123456789",
			events: []string{
				`{"candidates":[{"content":{"parts":[{"text":"Hel"}],"role":"model"}}],"usageMetadata":{"promptTokenCount":12,"totalTokenCount":12},"modelVersion":"gemini-2.0-flash"}`,
				`{"candidates":[{"content":{"parts":[{"text":"lo"}],"role":"model"},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":12,"candidatesTokenCount":34,"totalTokenCount":46},"modelVersion":"gemini-2.0-flash"}`,
			},
			provider: ProviderGoogle, model: "gemini-2.0-flash", inputTokens: 12, outputTokens: 34,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var keys []string
			upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				keys = append(keys, r.Header.Get(tc.cred.Header))
				mu.Unlock()
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				for _, e := range tc.events {
					fmt.Fprintf(w, "data: %s\n\n", e)
					w.(http.Flusher).Flush()
				}
			})
			w := newUpstreamWorld(t, tc.cred, tc.secret, upstream, trusted, trusted)
			placeholder := w.pol.creds.Credentials()[0].Placeholder
			req, _ := http.NewRequest("POST", "https://"+tc.cred.Host+tc.path, strings.NewReader(`{"stream":true}`))
			req.Header.Set(tc.cred.Header, fmt.Sprintf(tc.keyFormat, placeholder))
			resp, err := w.client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), tc.events[len(tc.events)-1]) {
				t.Fatalf("status %d, body %q, %v", resp.StatusCode, body, err)
			}
			mu.Lock()
			if want := fmt.Sprintf(tc.keyFormat, tc.secret); len(keys) != 1 || keys[0] != want {
				t.Fatalf("the upstream got keys %q, want %q", keys, want)
			}
			mu.Unlock()
			ev := w.ev.waitConn(t, func(e ConnEvent) bool { return e.Kind == KindHTTPS && e.Status == 200 })
			if !ev.Allowed || ev.Rule != RuleCredential || ev.Name != tc.cred.Host {
				t.Fatalf("connection event %+v", ev)
			}
			m := w.ev.waitModel(t)
			if m.Provider != tc.provider || m.Model != tc.model || m.InputTokens != tc.inputTokens || m.OutputTokens != tc.outputTokens ||
				m.Status != 200 || m.ResponseBytes != int64(len(body)) {
				t.Fatalf("model event %+v; want %s %s, %d in, %d out", m, tc.provider, tc.model, tc.inputTokens, tc.outputTokens)
			}
		})
	}
}

// waitCount waits until exactly n connection events match f.
func (e *events) waitCount(t *testing.T, n int, f func(ConnEvent) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for got := e.count(f); got != n; got = e.count(f) {
		if got > n || time.Now().After(deadline) {
			t.Fatalf("%d matching connection events, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitModel waits for the one model event and returns it.
func (e *events) waitModel(t *testing.T) ModelEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		models := append([]ModelEvent(nil), e.models...)
		e.mu.Unlock()
		switch {
		case len(models) == 1:
			return models[0]
		case len(models) > 1 || time.Now().After(deadline):
			t.Fatalf("%d model events, want 1: %+v", len(models), models)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
