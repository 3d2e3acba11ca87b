package netstack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/capsem/capsem/core/netpolicy"
)

// TestHTTPRequestByRequest drives raw HTTP/1.1 connections from the guest:
// every request of a keep-alive connection is checked, and the bytes that
// pass reach the server as sent.
func TestHTTPRequestByRequest(t *testing.T) {
	pol := basePolicy()
	creds, err := netpolicy.Compile([]netpolicy.Layer{{Credentials: []netpolicy.Credential{
		{Host: "api.example", Header: "x-api-key", SourceEnv: "K", GuestEnv: "EXAMPLE_KEY"}}}})
	if err != nil {
		t.Fatal(err)
	}
	pol.creds = creds
	r := newRig(t, pol, baseResolver(), testLimits())
	var seen []string // method path host body, per request
	upgraded := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Upgrade") == "capsem-test" {
			w.Header().Set("Connection", "Upgrade")
			w.Header().Set("Upgrade", "capsem-test")
			w.WriteHeader(http.StatusSwitchingProtocols)
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.Flush()
			line, _ := brw.ReadString('\n')
			upgraded <- line
			return
		}
		body, _ := io.ReadAll(req.Body)
		seen = append(seen, fmt.Sprintf("%s %s %s %s", req.Method, req.URL.Path, req.Host, body))
		fmt.Fprintf(w, "ok %s", req.URL.Path)
	}))
	defer srv.Close()
	r.dialer.routes[netip.AddrPortFrom(allowedIP, 80)] = srv.Listener.Addr().String()
	if got := answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA)); len(got) != 1 {
		t.Fatal(got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := func(t *testing.T) (net.Conn, *bufio.Reader) {
		c, err := r.dial(ctx, "203.0.113.10:80")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	read := func(t *testing.T, br *bufio.Reader) (*http.Response, error) {
		resp, err := http.ReadResponse(br, nil)
		if err == nil {
			io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}

	t.Run("keep-alive, chunked and expect-continue bodies", func(t *testing.T) {
		seen = nil
		c, br := conn(t)
		fmt.Fprint(c, "GET /one HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		if resp, err := read(t, br); err != nil || resp.StatusCode != 200 {
			t.Fatalf("first: %v %v", resp, err)
		}
		fmt.Fprint(c, "POST /two HTTP/1.1\r\nHost: ALLOWED.example:80\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
		if resp, err := read(t, br); err != nil || resp.StatusCode != 200 {
			t.Fatalf("chunked: %v %v", resp, err)
		}
		// The client waits for 100 Continue before its body: the head
		// must reach the server on its own.
		fmt.Fprint(c, "PUT /three HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusContinue {
			t.Fatalf("no 100 Continue: %v %v", resp, err)
		}
		fmt.Fprint(c, "abc")
		if resp, err := read(t, br); err != nil || resp.StatusCode != 200 {
			t.Fatalf("after continue: %v %v", resp, err)
		}
		want := "GET /one allowed.example |POST /two ALLOWED.example:80 hello world|PUT /three allowed.example abc"
		if got := strings.Join(seen, "|"); got != want {
			t.Fatalf("the server saw %q, want %q", got, want)
		}
	})
	t.Run("a later request for another host", func(t *testing.T) {
		seen = nil
		c, br := conn(t)
		fmt.Fprint(c, "GET /a HTTP/1.1\r\nHost: allowed.example\r\n\r\nGET /b HTTP/1.1\r\nHost: other.example\r\n\r\n")
		if resp, err := read(t, br); err != nil || resp.StatusCode != 200 {
			t.Fatalf("first: %v %v", resp, err)
		}
		if resp, err := read(t, br); err == nil {
			t.Fatalf("the second request got an answer: %v", resp.Status)
		}
		ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "other.example" && e.Rule == RuleNameMismatch })
		if ev.Allowed || !strings.Contains(ev.Reason, "request 2") {
			t.Fatalf("event %+v", ev)
		}
		if len(seen) != 1 {
			t.Fatalf("the server saw %q", seen)
		}
	})
	t.Run("a placeholder in a later request", func(t *testing.T) {
		seen = nil
		c, br := conn(t)
		fmt.Fprint(c, "GET /a HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		read(t, br)
		fmt.Fprint(c, "GET /leak HTTP/1.1\r\nHost: allowed.example\r\nX-Note: capsem-placeholder-example-key\r\n\r\n")
		if resp, err := read(t, br); err == nil {
			t.Fatalf("the placeholder's request got an answer: %v", resp.Status)
		}
		r.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleExfiltration && strings.Contains(e.Reason, "EXAMPLE_KEY") })
		if len(seen) != 1 {
			t.Fatalf("the server saw %q", seen)
		}
	})
	t.Run("a head past its bound", func(t *testing.T) {
		c, br := conn(t)
		fmt.Fprint(c, "GET /a HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		read(t, br)
		fmt.Fprint(c, "GET /b HTTP/1.1\r\nHost: allowed.example\r\nX-Big: "+strings.Repeat("a", maxRequestHead+requestReadAhead)+"\r\n\r\n")
		if resp, err := read(t, br); err == nil {
			t.Fatalf("an over-long head got an answer: %v", resp.Status)
		}
	})
	t.Run("an upgrade carries the other protocol", func(t *testing.T) {
		c, br := conn(t)
		fmt.Fprint(c, "GET /ws HTTP/1.1\r\nHost: allowed.example\r\nConnection: Upgrade\r\nUpgrade: capsem-test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("%v %v", resp, err)
		}
		fmt.Fprint(c, "GET not http at all\n")
		select {
		case line := <-upgraded:
			if line != "GET not http at all\n" {
				t.Fatalf("the server got %q", line)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the upgraded bytes did not arrive")
		}
	})
	t.Run("a reload applies to the next request", func(t *testing.T) {
		c, br := conn(t)
		fmt.Fprint(c, "GET /a HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		if resp, err := read(t, br); err != nil || resp.StatusCode != 200 {
			t.Fatalf("first: %v %v", resp, err)
		}
		delete(pol.allow, "allowed.example")
		defer func() { pol.allow["allowed.example"] = true }()
		fmt.Fprint(c, "GET /b HTTP/1.1\r\nHost: allowed.example\r\n\r\n")
		if resp, err := read(t, br); err == nil {
			t.Fatalf("a request after the reload got an answer: %v", resp.Status)
		}
		r.ev.waitConn(t, func(e ConnEvent) bool { return e.Name == "allowed.example" && !e.Allowed && e.Rule == "net.default" })
	})
}
