package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/capsem/capsem/core/netca"
)

// credentialWorld is a model API behind a credential (api.anthropic.com,
// TLS terminated by the per-VM process, key swapped, a TLS connection of
// the host's own upstream) and the same server under another name the
// stack only splices (splice.test): both with a leaf of the bench's own
// CA, which the guest is made to trust beside the capsem CA.
type credentialWorld struct {
	dir         string
	ca          *netca.CA
	api, splice *httptest.Server
	roots, key  string
}

func newCredentialWorld(dir string) (*credentialWorld, error) {
	cw := &credentialWorld{dir: dir}
	ca, err := netca.LoadOrCreate(filepath.Join(dir, "bench-ca.pem"))
	if err != nil {
		return nil, err
	}
	cw.ca = ca
	cw.roots = filepath.Join(dir, "bench-roots.pem")
	if err := os.WriteFile(cw.roots, ca.CertPEM(), 0o644); err != nil {
		return nil, err
	}
	cw.key = filepath.Join(dir, "bench.key")
	if err := os.WriteFile(cw.key, []byte("sk-bench-secret\n"), 0o600); err != nil {
		return nil, err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"bench\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	})
	start := func(name string) (*httptest.Server, error) {
		leaf, err := ca.Leaf(name)
		if err != nil {
			return nil, err
		}
		s := httptest.NewUnstartedServer(h)
		s.EnableHTTP2 = true
		s.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
		s.StartTLS()
		return s, nil
	}
	if cw.api, err = start("api.anthropic.com"); err != nil {
		return nil, err
	}
	if cw.splice, err = start("splice.test"); err != nil {
		cw.api.Close()
		return nil, err
	}
	return cw, nil
}

func (cw *credentialWorld) close() {
	cw.api.Close()
	cw.splice.Close()
}

func (cw *credentialWorld) policy() string {
	return fmt.Sprintf(`
[[net.credentials]]
host = "api.anthropic.com"
header = "x-api-key"
source_file = %q
guest_env = "ANTHROPIC_API_KEY"
ca_file = %q
`, cw.key, cw.roots)
}

// installGuestClient builds the tests' guest client (testdata/credclient)
// in dir and writes it to the VM as /tmp/credclient.
func installGuestClient(vm *vmHandle, dir string) error {
	bin := filepath.Join(dir, "credclient")
	build := exec.Command("go", "build", "-o", bin, "./testdata/credclient")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the guest client: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	return vm.client.WriteFile(context.Background(), "/tmp/credclient", data, 0o755)
}

// figures prints the latency a credential adds to a request: the same
// small streamed answer through the credential path and spliced, on a new
// connection each time and on a kept one.
func (cw *credentialWorld) figures(vm *vmHandle) error {
	if err := installGuestClient(vm, cw.dir); err != nil {
		return err
	}
	ctx := context.Background()
	if err := vm.client.WriteFile(ctx, "/tmp/bench-ca.pem", cw.ca.CertPEM(), 0o644); err != nil {
		return err
	}
	if _, _, err := guestTimed(vm, `cat /tmp/bench-ca.pem >> "$SSL_CERT_FILE"`); err != nil {
		return err
	}
	const n = 50
	run := func(url string, reuse bool) (string, error) {
		_, out, err := guestTimed(vm, fmt.Sprintf("/tmp/credclient -n %d -reuse=%v -url %s", n, reuse, url))
		return strings.TrimSpace(out), err
	}
	api := "https://api.anthropic.com:" + portOf(cw.api.Listener.Addr()) + "/v1/messages"
	spliced := "https://splice.test:" + portOf(cw.splice.Listener.Addr()) + "/v1/messages"
	for _, reuse := range []bool{false, true} {
		withCred, err := run(api, reuse)
		if err != nil {
			return err
		}
		without, err := run(spliced, reuse)
		if err != nil {
			return err
		}
		conn := "a new connection per request"
		if reuse {
			conn = "one connection kept (HTTP/2)"
		}
		fmt.Printf("  a small streamed request from the guest (Go client, %s, %d runs): with a credential (TLS terminated, key added) %s; spliced %s\n", conn, n, withCred, without)
	}
	return nil
}
