package netstack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/capsem/capsem/vmm"
)

// TestDatagramFraming: over the link vz gives (one frame per datagram of
// a socket pair) the host stack answers DNS and carries TCP, segments
// past one frame included, as over qemu's stream; a datagram that is no
// frame of the guest's is dropped and counted, and the link goes on.
func TestDatagramFraming(t *testing.T) {
	r := newRigOver(t, vmm.FramingDatagram, basePolicy(), baseResolver(), testLimits())
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB: hundreds of frames
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		fmt.Fprintf(w, "%s %d %s", req.Host, len(body), big)
	}))
	defer srv.Close()
	r.dialer.routes[netip.AddrPortFrom(allowedIP, 80)] = srv.Listener.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dial(ctx, "203.0.113.10:80") },
		DisableKeepAlives: true, // a connection's row is written when it ends
	}}
	exchange := func(t *testing.T) {
		t.Helper()
		if got := answers(r.query(t, "192.168.127.1", "allowed.example", dns.TypeA)); !slices.Equal(got, []string{"203.0.113.10"}) {
			t.Fatalf("answers %v", got)
		}
		if m := r.query(t, "192.168.127.1", "blocked.example", dns.TypeA); m.Rcode != dns.RcodeNameError {
			t.Fatalf("blocked.example: %s", dns.RcodeToString[m.Rcode])
		}
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://allowed.example/up", strings.NewReader(big))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("allowed.example %d %s", len(big), big); err != nil || string(body) != want {
			t.Fatalf("%d bytes back (%v), want %d", len(body), err, len(want))
		}
	}
	exchange(t)
	ev := r.ev.waitConn(t, func(e ConnEvent) bool { return e.Path == "/up" })
	if !ev.Allowed || ev.BytesSent < int64(len(big)) || ev.BytesReceived < int64(len(big)) {
		t.Fatalf("event %+v", ev)
	}

	other := [6]byte{0x02, 0xde, 0xad, 0xbe, 0xef, 0x01}
	forged := make([]byte, 64)
	copy(forged[6:12], other[:])
	for _, d := range [][]byte{make([]byte, 5), forged} {
		if _, err := r.guestConn.Write(d); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for r.host.Stats().FramesDropped != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d datagrams dropped, want the 2 that are no frame of the guest's", r.host.Stats().FramesDropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
	exchange(t)
}
