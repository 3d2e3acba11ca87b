package cli_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
)

// freePort is a loopback port nothing listens on (a moment ago).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// guestWebServer starts busybox httpd on port 3000 of vm, serving text
// (it runs on in the background after the exec ends).
func guestWebServer(c capsemCLI, vm, text string) {
	c.t.Helper()
	c.must("exec", vm, "--", "sh", "-c", "mkdir -p /tmp/www && echo "+text+" > /tmp/www/index.html && httpd -p 3000 -h /tmp/www")
}

// getFromHost fetches / from the host's loopback port, retrying briefly
// while the guest's server starts.
func getFromHost(t *testing.T, port int) string {
	t.Helper()
	cl := http.Client{Timeout: 15 * time.Second}
	var last error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			last = err
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == 200 {
			return string(b)
		}
		last = fmt.Errorf("status %d, %v: %s", resp.StatusCode, err, b)
	}
	t.Fatalf("GET from the host's port %d: %v", port, last)
	return ""
}

// vmPorts is what capsem info --json says vm publishes: its create's
// ports and, while it runs, what its process publishes.
func vmPorts(c capsemCLI, vm string) (created, now []api.PortMapping) {
	c.t.Helper()
	var info api.VM
	if err := json.Unmarshal([]byte(c.must("info", vm, "--json")), &info); err != nil {
		c.t.Fatal(err)
	}
	if info.Process != nil {
		now = info.Process.Ports
	}
	return info.Ports, now
}

// checkPublishedPorts drives vm's published port (host port published to
// the guest's 3000, given at create): a server in the guest answers on
// the host's loopback, a create whose host port is taken is refused by
// name and leaves no VM, port-forward adds a port to the running VM (and
// refuses a taken one), a guest port nobody listens on gives the host
// client a prompt end, and capsem info lists them all.
func checkPublishedPorts(t *testing.T, c capsemCLI, vm string, published int) {
	t.Run("published port", func(t *testing.T) {
		c := capsemCLI{t: t, env: c.env}
		guestWebServer(c, vm, "hello-from-guest")
		if got := getFromHost(t, published); got != "hello-from-guest\n" {
			t.Fatalf("the host's port %d answered %q", published, got)
		}
		want := api.PortMapping{Address: "127.0.0.1", Host: published, Guest: 3000}
		if created, now := vmPorts(c, vm); len(created) != 1 || created[0] != want || len(now) != 1 || now[0] != want {
			t.Fatalf("info lists %+v (create) and %+v (now), want %+v", created, now, want)
		}
		if out := c.must("info", vm); !strings.Contains(out, fmt.Sprintf("ports:       127.0.0.1:%d -> 3000", published)) {
			t.Fatalf("info does not list the port:\n%s", out)
		}
		// The host's connection is a row of the VM's ledger.
		q := fmt.Sprintf("SELECT COUNT(*) FROM net_events WHERE source = 'published' AND conn_type = 'inbound' AND domain = 'published 127.0.0.1:%d' AND port = 3000 AND ip = '127.0.0.1' AND bytes_received > 0", published)
		// The row is written once the connection has ended on both sides,
		// which may be just after the client has its answer.
		deadline := time.Now().Add(10 * time.Second)
		for {
			out := c.must("inspect", vm, q, "--json")
			var r api.InspectResult
			err := json.Unmarshal([]byte(out), &r)
			if err == nil && len(r.Rows) == 1 && r.Rows[0][0] == 1.0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("want one ledger row for the published connection: %s %v", out, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("a flood of host connections is bounded", func(t *testing.T) {
		// 300 silent connections: the guest's httpd waits for a request
		// on each that reaches it; past the bound of 256 the process
		// closes a new one at once. Once they end, the port serves again.
		const flood, bound = 300, 256
		conns := make([]net.Conn, 0, flood)
		defer func() {
			for _, conn := range conns {
				conn.Close()
			}
		}()
		for range flood {
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", published), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, conn)
		}
		ended := make(chan bool, flood)
		for _, conn := range conns {
			go func() {
				conn.SetReadDeadline(time.Now().Add(3 * time.Second))
				_, err := conn.Read(make([]byte, 1))
				ended <- err == io.EOF
			}()
		}
		closed := 0
		for range flood {
			if <-ended {
				closed++
			}
		}
		if closed != flood-bound {
			t.Fatalf("%d of %d silent connections were closed, want %d (the bound is %d)", closed, flood, flood-bound, bound)
		}
		for _, conn := range conns {
			conn.Close()
		}
		conns = nil
		if got := getFromHost(t, published); got != "hello-from-guest\n" {
			t.Fatalf("after the flood the port answered %q", got)
		}
	})
	t.Run("a taken host port fails the create", func(t *testing.T) {
		c := capsemCLI{t: t, env: c.env}
		_, errOut, code := c.run("create", "other", "--ram-mb", "512", "--cpus", "1", "--publish", fmt.Sprintf("%d:3000", published))
		if want := fmt.Sprintf("host port 127.0.0.1:%d is taken", published); code == 0 || !strings.Contains(errOut, want) {
			t.Fatalf("create on a taken port: exit %d %q, want an error saying %q", code, errOut, want)
		}
		var vms []api.VM
		if err := json.Unmarshal([]byte(c.must("ls", "--json")), &vms); err != nil || len(vms) != 1 {
			t.Fatalf("after the refused create: %+v %v", vms, err)
		}
		_, errOut, code = c.run("create", "--publish", "8080:0")
		if code == 0 || !strings.Contains(errOut, "guest port 0: want 1 to 65535") {
			t.Fatalf("create with a bad port: exit %d %q", code, errOut)
		}
	})
	t.Run("port-forward", func(t *testing.T) {
		c := capsemCLI{t: t, env: c.env}
		added := freePort(t)
		out := c.must("port-forward", vm, fmt.Sprintf("%d:3000", added))
		if !strings.Contains(out, fmt.Sprintf("127.0.0.1:%d -> %s port 3000", added, vm)) {
			t.Fatalf("port-forward printed %q", out)
		}
		if got := getFromHost(t, added); got != "hello-from-guest\n" {
			t.Fatalf("the forwarded port %d answered %q", added, got)
		}
		_, errOut, code := c.run("port-forward", vm, fmt.Sprintf("127.0.0.1:%d:3000", published))
		if want := fmt.Sprintf("host port 127.0.0.1:%d is taken", published); code == 0 || !strings.Contains(errOut, want) {
			t.Fatalf("port-forward on a taken port: exit %d %q", code, errOut)
		}
		// Nothing listens on the guest's 3999: the host's client is told
		// at once, by the end of its connection.
		silent := freePort(t)
		c.must("port-forward", vm, fmt.Sprintf("%d:3999", silent))
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", silent), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		start := time.Now()
		conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		n, err := conn.Read(make([]byte, 1))
		if n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 5*time.Second {
			t.Fatalf("a connection to a guest port nobody listens on: %d bytes, %v after %v", n, err, time.Since(start))
		}
		created, now := vmPorts(c, vm)
		if len(created) != 1 || len(now) != 3 || now[1].Host != added || now[2].Guest != 3999 {
			t.Fatalf("info lists %+v (create) and %+v (now)", created, now)
		}
	})
}

// checkPortsAfterResume: the create's port is published again on resume,
// port-forward's are not.
func checkPortsAfterResume(t *testing.T, c capsemCLI, vm string, published int) {
	t.Run("published port after resume", func(t *testing.T) {
		c := capsemCLI{t: t, env: c.env}
		if _, now := vmPorts(c, vm); len(now) != 1 || now[0].Host != published {
			t.Fatalf("after resume the VM publishes %+v, want its create's port %d alone", now, published)
		}
		guestWebServer(c, vm, "hello-again")
		if got := getFromHost(t, published); got != "hello-again\n" {
			t.Fatalf("the host's port %d answered %q after resume", published, got)
		}
	})
}
