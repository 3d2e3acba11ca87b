package netstack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/capsem/capsem/core/netpolicy"
)

func TestStreamMatcher(t *testing.T) {
	patterns := [][]byte{[]byte("capsem-placeholder-a-key"), []byte("capsem-placeholder-longer-key")}
	cases := []struct {
		name   string
		chunks []string
		// at is the chunk the match is reported in (-1: none), want the
		// pattern.
		at, want int
	}{
		{"none", []string{"GET / HTTP/1.1\r\n", "capsem-placeholder-", "b-key"}, -1, -1},
		{"whole in one chunk", []string{"hello ", "x capsem-placeholder-a-key y"}, 1, 0},
		{"split in two", []string{"x capsem-placeh", "older-a-key"}, 1, 0},
		{"split over many chunks", []string{"c", "a", "psem-", "placeholder-lo", "n", "ger-k", "ey"}, 6, 1},
		{"split with its end first in a chunk", []string{"...capsem-placeholder-a-ke", "y and more bytes after it"}, 1, 0},
		{"a prefix, then something else", []string{"capsem-placeholder-a-ke", "Y capsem-placeholder-a-k"}, -1, -1},
		{"empty chunks between halves", []string{"capsem-place", "", "", "holder-a-key"}, 3, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var m streamMatcher
			for i, c := range tc.chunks {
				got := m.next([]byte(c), patterns)
				switch {
				case i == tc.at && got != tc.want:
					t.Fatalf("chunk %d: pattern %d, want %d", i, got, tc.want)
				case i != tc.at && got != -1:
					t.Fatalf("chunk %d: pattern %d, want none yet", i, got)
				}
				if got >= 0 {
					return
				}
			}
		})
	}
}

// FuzzPlaceholderScanner checks the streaming matcher against the naive
// one (the whole stream so far searched at every chunk): both must find a
// pattern at the same chunk, and the one reported must be in the stream.
func FuzzPlaceholderScanner(f *testing.F) {
	f.Add([]byte("xx capsem-placeholder-key yy"), []byte{3, 9, 1}, "capsem-placeholder-key", "other")
	f.Add([]byte("aaaaab"), []byte{1, 1, 1, 1, 1, 1}, "ab", "aaab")
	f.Add([]byte("abcabcabd"), []byte{4, 4}, "abcabd", "")
	f.Add([]byte(""), []byte{}, "a", "b")
	f.Fuzz(func(t *testing.T, stream, sizes []byte, a, b string) {
		patterns := [][]byte{[]byte(a), []byte(b)}
		var m streamMatcher
		rest, seen := stream, 0
		for i := 0; len(rest) > 0 || i == 0; i++ {
			size := len(rest)
			if i < len(sizes) {
				size = min(int(sizes[i]), len(rest))
			}
			chunk := rest[:size]
			rest = rest[size:]
			seen += size
			got := m.next(chunk, patterns)
			want := -1
			for j, p := range patterns {
				if len(p) > 0 && bytes.Contains(stream[:seen], p) {
					want = j
					break
				}
			}
			if (got >= 0) != (want >= 0) {
				t.Fatalf("after %d bytes in %d chunks: matcher %d, naive %d", seen, i+1, got, want)
			}
			if got >= 0 {
				if !bytes.Contains(stream[:seen], patterns[got]) {
					t.Fatalf("reported pattern %d (%q), which the stream %q does not hold", got, patterns[got], stream[:seen])
				}
				return
			}
		}
	})
}

// byteSink is a destination that keeps every byte it receives.
type byteSink struct {
	ln     net.Listener
	mu     sync.Mutex
	got    bytes.Buffer
	closed chan struct{} // a connection ended
}

func newByteSink(t *testing.T) *byteSink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &byteSink{ln: ln, closed: make(chan struct{}, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					s.mu.Lock()
					s.got.Write(buf[:n])
					s.mu.Unlock()
					if err != nil {
						s.closed <- struct{}{}
						return
					}
				}
			}()
		}
	}()
	return s
}

func (s *byteSink) received() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got.String()
}

// waitFor waits until the sink received want.
func (s *byteSink) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.received(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the destination never received %q; it has %q", want, s.received())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPlaintextExfiltration: a guest sends a credential's placeholder in
// a plaintext stream the host splices (no request head to find it in),
// whole or split across writes so that no single read holds it. The
// connection is cut before the bytes that complete it go out, and the
// attempt is a row as every exfiltration refusal is.
func TestPlaintextExfiltration(t *testing.T) {
	pol := basePolicy()
	creds, err := netpolicy.Compile([]netpolicy.Layer{{Source: "corp.toml", Credentials: []netpolicy.Credential{
		{Host: "api.example", Header: "x-api-key", SourceEnv: "K", GuestEnv: "EXAMPLE_KEY"}}}})
	if err != nil {
		t.Fatal(err)
	}
	pol.creds = creds
	placeholder := creds.Credentials()[0].Placeholder
	direct := netip.MustParseAddrPort("203.0.113.50:6379")
	pol.ports[direct.Port()] = true
	pol.byIP[direct] = true
	r := newRig(t, pol, baseResolver(), testLimits())
	answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	half := len(placeholder) / 2
	cases := []struct {
		name, to, kind string
		// opening is sent and seen at the destination first; then the
		// placeholder's first half, seen too; then its second half.
		opening string
		// split sends the placeholder's two halves apart; otherwise it
		// goes in one write after the opening.
		split bool
	}{
		{"allowed by address, split", direct.String(), KindTCP, "AUTH ", true},
		{"allowed by address, whole", direct.String(), KindTCP, "SET k ", false},
		{"plain HTTP body, split", "203.0.113.10:80", KindHTTP,
			"POST /upload HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 1000\r\n\r\nkey=", true},
		{"plain HTTP after an upgrade", "203.0.113.10:80", KindHTTP,
			"GET /ws HTTP/1.1\r\nHost: allowed.example\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nframe ", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sink := newByteSink(t)
			dst := netip.MustParseAddrPort(tc.to)
			r.dialer.routes[dst] = sink.ln.Addr().String()
			c, err := r.dial(ctx, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, tc.opening); err != nil {
				t.Fatal(err)
			}
			sink.waitFor(t, tc.opening)
			rest := placeholder
			if tc.split {
				io.WriteString(c, placeholder[:half])
				// Forwarded already, so the rest comes in a read of its own.
				sink.waitFor(t, tc.opening+placeholder[:half])
				rest = placeholder[half:]
			}
			io.WriteString(c, rest+" trailing bytes")
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadAll(c); isDeadlineErr(err) {
				t.Fatal("the guest's connection was not cut")
			}
			select {
			case <-sink.closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the destination's connection was not cut")
			}
			if got := sink.received(); strings.Contains(got, placeholder) || strings.Contains(got, "trailing") {
				t.Fatalf("the destination received %q", got)
			}
			ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Rule == RuleExfiltration && e.Addr == dst })
			if ev.Allowed || ev.Kind != tc.kind || !strings.Contains(ev.Reason, "EXAMPLE_KEY") || !strings.Contains(ev.Reason, "api.example") {
				t.Fatalf("exfiltration event %+v", ev)
			}
			own := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Allowed && e.Addr == dst && strings.HasPrefix(e.Err, "cut: ") })
			if own.BytesSent >= int64(len(tc.opening)+len(placeholder)) {
				t.Fatalf("the connection's row says %d bytes went out", own.BytesSent)
			}
			r.ev.mu.Lock()
			r.ev.conns = nil // the next case's rows are its own
			r.ev.mu.Unlock()
		})
	}
	t.Run("a clean stream passes unchanged", func(t *testing.T) {
		sink := newByteSink(t)
		r.dialer.routes[direct] = sink.ln.Addr().String()
		c, err := r.dial(ctx, direct.String())
		if err != nil {
			t.Fatal(err)
		}
		// Random bytes, and the placeholder's every proper prefix at a
		// write's end: nothing to cut for.
		var want bytes.Buffer
		w := bufio.NewWriter(io.MultiWriter(c, &want))
		noise := make([]byte, 256<<10)
		rand.Read(noise)
		w.Write(bytes.ReplaceAll(noise, []byte(netpolicy.PlaceholderPrefix), nil))
		for i := 1; i < len(placeholder); i += 7 {
			w.WriteString(placeholder[:i])
			w.Flush()
			w.WriteString("|")
		}
		w.Flush()
		c.CloseWrite()
		io.ReadAll(c)
		c.Close()
		select {
		case <-sink.closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the destination's connection did not end")
		}
		if got := sink.received(); got != want.String() {
			t.Fatalf("the destination received %d bytes, want the %d sent", len(got), want.Len())
		}
		ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Addr == direct })
		if !ev.Allowed || ev.Err != "" || ev.BytesSent != int64(want.Len()) {
			t.Fatalf("event %+v, %d bytes sent", ev, want.Len())
		}
		r.ev.mu.Lock()
		defer r.ev.mu.Unlock()
		for _, e := range r.ev.conns {
			if e.Rule == RuleExfiltration {
				t.Fatalf("a clean stream was refused: %+v", e)
			}
		}
	})
}

// TestExfiltrationGuardFollowsReloads: a credential added while a
// connection is open is looked for in the rest of its stream.
func TestExfiltrationGuardFollowsReloads(t *testing.T) {
	pol := basePolicy()
	s := &Stack{cfg: Config{Policy: func() Policy { return pol }, Recorder: &events{ch: make(chan struct{}, 1)}}}
	var out bytes.Buffer
	cut := 0
	ev := &ConnEvent{Kind: KindTCP, Addr: netip.MustParseAddrPort("203.0.113.50:6379")}
	g := s.newExfiltrationGuard(&out, ev, func() { cut++ })
	if _, err := fmt.Fprint(g, "capsem-placeholder-later-key"); err != nil || cut != 0 {
		t.Fatalf("no credential yet: %v, cut %d", err, cut)
	}
	creds, err := netpolicy.Compile([]netpolicy.Layer{{Credentials: []netpolicy.Credential{
		{Host: "later.example", Header: "x-api-key", SourceEnv: "K", GuestEnv: "LATER_KEY"}}}})
	if err != nil {
		t.Fatal(err)
	}
	pol.creds = creds
	if _, err := fmt.Fprint(g, "again capsem-placeholder-later-key"); err == nil || cut != 1 {
		t.Fatalf("after the reload: %v, cut %d", err, cut)
	}
	if _, err := fmt.Fprint(g, "anything"); err == nil {
		t.Fatal("a cut connection wrote again")
	}
	if out.String() != "capsem-placeholder-later-key" || !strings.HasPrefix(ev.Err, "cut: ") {
		t.Fatalf("wrote %q, event %+v", out.String(), ev)
	}
}
