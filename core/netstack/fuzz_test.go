package netstack

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func fuzzStack(t testing.TB) *Stack {
	lim := DefaultLimits
	lim.FirstFlightWait = 200 * time.Millisecond
	s, err := New(Config{
		Policy:   func() Policy { return basePolicy() },
		Resolver: baseResolver(), Dialer: &routeDialer{}, Recorder: &events{ch: make(chan struct{}, 1)},
		Limits: lim,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// FuzzDNSAnswer feeds the DNS server arbitrary queries: it must answer or
// stay silent, never panic, and every reply must parse with the query's ID.
func FuzzDNSAnswer(f *testing.F) {
	for _, name := range []string{"allowed.example.", "blocked.example.", "sneaky.example.", "x."} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeHTTPS, dns.TypeANY} {
			m := new(dns.Msg)
			m.SetQuestion(name, qt)
			m.SetEdns0(4096, true)
			b, _ := m.Pack()
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 12))
	s := fuzzStack(f)
	f.Fuzz(func(t *testing.T, query []byte) {
		out := s.answer(query, netip.MustParseAddr("192.168.127.1"), true)
		if out == nil {
			if len(query) >= 12 {
				t.Fatalf("no reply to a %d-byte query", len(query))
			}
			return
		}
		reply := new(dns.Msg)
		if err := reply.Unpack(out); err != nil {
			t.Fatalf("our reply does not parse: %v", err)
		}
		if reply.Id != uint16(query[0])<<8|uint16(query[1]) || !reply.Response {
			t.Fatalf("reply id %d response %v", reply.Id, reply.Response)
		}
		if len(out) > 1232 && len(out) > 512 {
			t.Fatalf("a %d-byte UDP reply", len(out))
		}
	})
}

// FuzzFirstFlight feeds the decision arbitrary first bytes: it names a
// destination or refuses, within its size bound, and never panics.
func FuzzFirstFlight(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"))
	f.Add([]byte("\x16\x03\x01\x00\x05hello"))
	f.Add([]byte{0x16})
	f.Add([]byte("SSH-2.0-OpenSSH\r\n"))
	s := fuzzStack(f)
	f.Fuzz(func(t *testing.T, first []byte) {
		a, b := net.Pipe()
		defer a.Close()
		go func() {
			b.Write(first)
			b.Close()
		}()
		replay, ff, err := s.readFirstFlight(a)
		if err != nil {
			return
		}
		if ff.name == "" || (ff.kind != KindTLS && ff.kind != KindHTTP) {
			t.Fatalf("decided %+v", ff)
		}
		if len(replay) > s.cfg.Limits.FirstFlight || string(replay) != string(first[:len(replay)]) {
			t.Fatalf("replay %q is not a prefix of what was sent", replay)
		}
	})
}

// FuzzHTTPRequests: whatever the guest sends on a plain-HTTP connection,
// what goes out is a prefix of it (bytes are never invented or reordered)
// and the parser ends.
func FuzzHTTPRequests(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\nGET /2 HTTP/1.1\r\nHost: allowed.example\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: allowed.example\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.example\r\nConnection: upgrade\r\n\r\nraw bytes"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\nGET /2 HTTP/1.1\r\nHost: evil.example\r\n\r\n"))
	s := &Stack{cfg: Config{Policy: func() Policy { return basePolicy() }, Recorder: &events{ch: make(chan struct{}, 1)}}}
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		ev := &ConnEvent{}
		n := s.httpRequests(&out, bytes.NewReader(in), "allowed.example", ev)
		if int64(out.Len()) != n || !bytes.HasPrefix(in, out.Bytes()) {
			t.Fatalf("sent %d bytes, %q, not a prefix of the input %q", n, out.Bytes(), in)
		}
	})
}
