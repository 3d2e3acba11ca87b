package agent

import (
	"bufio"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestwire"
)

// TestSocketOwner: a child process started with a trace id connects to a
// listener; the owner of its socket is found from the listener's side of
// the view (the child's port, the listener's address) with its trace id.
func TestSocketOwner(t *testing.T) {
	if addr := os.Getenv("CAPSEM_TEST_SOCKET_CHILD"); addr != "" {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			os.Exit(3)
		}
		c.Write([]byte("connected\n"))
		time.Sleep(30 * time.Second)
		return
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	child := exec.Command(os.Args[0], "-test.run=^TestSocketOwner$")
	child.Env = append(os.Environ(), "CAPSEM_TEST_SOCKET_CHILD="+ln.Addr().String(), envvars.TraceID.Pair("trace-abc"))
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if line, _ := bufio.NewReader(c).ReadString('\n'); line != "connected\n" {
		t.Fatalf("child said %q", line)
	}
	peer := netip.MustParseAddrPort(c.RemoteAddr().String())
	local := netip.MustParseAddrPort(ln.Addr().String())
	q := &guestwire.SocketQuery{LocalPort: peer.Port(), RemoteIP: local.Addr().String(), RemotePort: local.Port()}
	o, err := socketOwner(q, "/proc")
	if err != nil {
		t.Fatal(err)
	}
	if o.PID != child.Process.Pid || o.TraceID != "trace-abc" || !strings.HasPrefix(o.Process, "agent.test") {
		t.Fatalf("owner %+v, want pid %d with trace-abc", o, child.Process.Pid)
	}
	// A socket that does not exist has no owner.
	q.LocalPort++
	if o, err := socketOwner(q, "/proc"); err != nil || o.PID != 0 {
		t.Fatalf("owner of no socket: %+v %v", o, err)
	}
	if _, err := socketOwner(&guestwire.SocketQuery{RemoteIP: "::1"}, "/proc"); err == nil {
		t.Fatal("an IPv6 query was answered")
	}
}

func TestParseProcAddr(t *testing.T) {
	cases := []struct {
		in   string
		want string
		ok   bool
	}{
		{"0100007F:0050", "127.0.0.1:80", true},
		{"0202A8C0:C350", "192.168.2.2:50000", true},
		{"00000000:0000", "0.0.0.0:0", true},
		{"0100007F", "", false},
		{"XX00007F:0050", "", false},
		{"0100007F:10000", "", false},
		{"00000000000000000000000001000000:0050", "", false},
	}
	for _, tc := range cases {
		a, p, err := parseProcAddr(tc.in)
		if (err == nil) != tc.ok || (tc.ok && netip.AddrPortFrom(a, p).String() != tc.want) {
			t.Errorf("parseProcAddr(%q) = %v:%d, %v", tc.in, a, p, err)
		}
	}
}

func FuzzParseProcAddr(f *testing.F) {
	f.Add("0100007F:0050")
	f.Add(":")
	f.Fuzz(func(t *testing.T, s string) {
		a, _, err := parseProcAddr(s)
		if err == nil && !a.Is4() {
			t.Fatalf("%q parsed to %v", s, a)
		}
	})
}
