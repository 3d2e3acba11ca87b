package vmhost_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/testkit"
	"github.com/capsem/capsem/core/testkit/fakemodel"
	"github.com/capsem/capsem/core/vmhost"
	"golang.org/x/sys/unix"
)

// TestFullRootHasTheUserland: a VM of the full root runs Debian's
// userland, Node, Python, git and the AI CLIs at their pinned versions,
// with the identity capsem gives it.
func TestFullRootHasTheUserland(t *testing.T) {
	root := testkit.SharedRootImage(t)
	// The root image, which every VM of the full root shares, stays in
	// the host's page cache through a VM's start: restoring a saved state
	// does not drop it (QEMU's drop-cache).
	if err := readAll(root.Image); err != nil {
		t.Fatal(err)
	}
	v := startVM(t, "fullroot", func(c *vmhost.ProcessConfig) { c.RootImage = root.Image; c.NoNetwork = true })
	defer v.stop(t)
	if resident, total := residentPages(t, root.Image); resident < total*9/10 {
		t.Errorf("after the VM's start %d of the root image's %d pages are in the host's page cache", resident, total)
	}
	out, _ := v.guestSh(t, `set -e
echo "shell=$SHELL home=$HOME path=$PATH"
bash --version | head -1
node -e 'console.log("node", process.version)'
npm --version
python3 -c 'import sys, venv; print("python", sys.version.split()[0])'
git --version
curl --version | head -1
rg --version | head -1
claude --version
gemini --version
codex --version
hostname
cat /etc/machine-id
readlink /usr/bin/capsem-mcp-server
`)
	t.Logf("guest:\n%s", out)
	for _, want := range []string{"shell=/bin/bash home=/root", "GNU bash", "node v22.23.5", "python 3.11", "git version 2.39", "curl 7.88",
		"ripgrep", "2.1.332 (Claude Code)", "0.61.0", "codex-cli 0.171.0", "fullroot", "/run/capsem/initramfs/init"} {
		if !strings.Contains(out, want) {
			t.Errorf("the full root lacks %q", want)
		}
	}
}

// agentWorld is what the agent tests' VM reaches: the fake model under
// the real API names (through the network policy and a credential for
// each API, whose secret only the host and the fake know), the everything
// reference server and the builtin tools behind the gateway, and a web
// page on the host's loopback for the builtin http_get.
type agentWorld struct {
	model  *fakemodel.Server
	page   *httptest.Server
	config string // the VM's TOML
}

// agentPage is the web page the builtin tool fetches.
const agentPage = "a page the builtin tool fetched"

// The script every agent test plays: the everything server's echo, then
// the builtin http_get of the world's page.
const agentEcho = "hello from the fake model"

func newAgentWorld(t *testing.T) *agentWorld {
	w := &agentWorld{}
	w.page = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprint(rw, agentPage) }))
	t.Cleanup(w.page.Close)
	w.model = fakemodel.Start(t,
		fakemodel.Step{ToolSuffix: "everything__echo", Input: map[string]any{"message": agentEcho}},
		fakemodel.Step{ToolSuffix: "builtin__http_get", Input: map[string]any{"url": w.page.URL + "/page"}})
	cmd, args := testkit.EverythingServer(t)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	apis := fmt.Sprintf("%q, %q", fakemodel.AnthropicHost, fakemodel.GoogleHost)
	w.config = filepath.Join(t.TempDir(), "agents.toml")
	toml := fmt.Sprintf(`[[mcp.servers]]
name = "everything"
command = %q
args = [%s]
connect_timeout_secs = 120

[mcp.builtin]
allow_private_networks = true

[net]
default = "block"
allow = [%s]
ports = [%s]
allow_private = [%s]
hosts = { %q = "127.0.0.1", %q = "127.0.0.1" }

[[net.credentials]]
host = %q
header = "x-api-key"
source_file = %q
guest_env = "ANTHROPIC_API_KEY"
ca_file = %q

[[net.credentials]]
host = %q
header = "x-goog-api-key"
source_file = %q
guest_env = "GEMINI_API_KEY"
ca_file = %q
`, cmd, strings.Join(quoted, ", "), apis, w.model.Port, apis, fakemodel.AnthropicHost, fakemodel.GoogleHost,
		fakemodel.AnthropicHost, w.model.SecretFile, w.model.CAFile, fakemodel.GoogleHost, w.model.SecretFile, w.model.CAFile)
	if err := os.WriteFile(w.config, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// agentVM is a VM of the full root in w, its gateway listing the
// everything server's tools: a CLI lists the tools once, at its start,
// and the server's first start (npx fetching it into a cold cache) may
// take longer than the VM's boot.
func (w *agentWorld) agentVM(t *testing.T, name string) *vmProc {
	root := testkit.SharedRootImage(t)
	v := startVM(t, name, func(c *vmhost.ProcessConfig) {
		c.RootImage, c.Config, c.NetLoopbackOnly, c.RAMMB = root.Image, w.config, true, 2048
	})
	const list = `'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"wait","version":"1"}}}' ` +
		`'{"jsonrpc":"2.0","method":"notifications/initialized"}' '{"jsonrpc":"2.0","id":2,"method":"tools/list"}'`
	deadline := time.Now().Add(4 * time.Minute)
	for {
		out, _, _ := v.guestRun(t, "printf '%s\\n' "+list+" | capsem-mcp-server | grep -c everything__echo || true")
		if strings.TrimSpace(out) != "0" && strings.TrimSpace(out) != "" {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("the gateway never listed the everything server's tools")
		}
		time.Sleep(2 * time.Second)
	}
}

// streamEvents parses a CLI's stream-json output (one JSON object a line;
// other lines are kept apart).
func streamEvents(out string) (events []map[string]any, other []string) {
	for _, line := range strings.Split(out, "\n") {
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil {
			events = append(events, ev)
		} else if strings.TrimSpace(line) != "" {
			other = append(other, line)
		}
	}
	return events, other
}

// TestClaudeCodeThroughTheGateway: real Claude Code, headless in a VM of
// the full root with the MCP settings the image ships, asks the (fake)
// model, which has it call a tool of the everything server and a builtin
// tool through capsem-mcp-server and the gateway. Its model traffic goes
// through the network policy and the credential swap, its tool calls
// through the gateway's policy into the ledger. A tool the policy then
// blocks reaches Claude Code as a tool error, and nothing of its call is
// in the ledger.
func TestClaudeCodeThroughTheGateway(t *testing.T) {
	w := newAgentWorld(t)
	v := w.agentVM(t, "claude")
	defer v.stop(t)
	// The key Claude Code holds is the placeholder, not the secret.
	key, _ := v.guestSh(t, `printf %s "$ANTHROPIC_API_KEY"`)
	if !strings.HasPrefix(key, guestwire.PlaceholderPrefix) || strings.Contains(key, w.model.Secret) {
		t.Fatalf("the guest's ANTHROPIC_API_KEY is %q", key)
	}
	claude := func(t *testing.T) (string, *api.ExecEvent) {
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		o := v.exec(ctx, &api.ExecRequest{Command: "claude -p 'Call the echo tool, then fetch the page.' --model capsem-fake-model " +
			"--output-format stream-json --verbose --no-session-persistence --allowedTools mcp__capsem",
			Env: map[string]string{"ANTHROPIC_BASE_URL": "https://" + fakemodel.AnthropicHost + ":" + w.model.Port}})
		if o.err != nil {
			t.Fatalf("claude: %v\n%s\n%s", o.err, o.stdout.String(), o.stderr.String())
		}
		return o.stdout.String() + o.stderr.String(), o.ev
	}
	start := time.Now()
	out, ev := claude(t)
	t.Logf("claude -p took %v, exit %d", time.Since(start).Round(time.Millisecond), ev.ExitCode)
	events, other := streamEvents(out)
	if ev.ExitCode != 0 || len(events) == 0 {
		t.Fatalf("claude exit %d:\n%s", ev.ExitCode, out)
	}
	var init, result map[string]any
	var toolUses []string
	var toolResults []string
	for _, e := range events {
		switch e["type"] {
		case "system":
			if e["subtype"] == "init" {
				init = e
			}
		case "result":
			result = e
		case "assistant", "user":
			msg, _ := e["message"].(map[string]any)
			content, _ := msg["content"].([]any)
			for _, c := range content {
				block, _ := c.(map[string]any)
				switch block["type"] {
				case "tool_use":
					toolUses = append(toolUses, fmt.Sprint(block["name"]))
				case "tool_result":
					b, _ := json.Marshal(block["content"])
					toolResults = append(toolResults, string(b))
				}
			}
		}
	}
	servers, _ := init["mcp_servers"].([]any)
	if len(servers) != 1 || servers[0].(map[string]any)["name"] != "capsem" || servers[0].(map[string]any)["status"] != "connected" {
		t.Errorf("Claude Code's MCP servers at start: %v, want capsem connected", init["mcp_servers"])
	}
	if want := []string{"mcp__capsem__everything__echo", "mcp__capsem__builtin__http_get"}; !slices.Equal(toolUses, want) {
		t.Errorf("tool uses %q, want %q\n%s", toolUses, want, out)
	}
	if len(toolResults) != 2 || !strings.Contains(toolResults[0], "Echo: "+agentEcho) || !strings.Contains(toolResults[1], agentPage) {
		t.Errorf("tool results %q", toolResults)
	}
	if result["subtype"] != "success" || !strings.HasPrefix(fmt.Sprint(result["result"]), "FAKE-DONE:") || !strings.Contains(fmt.Sprint(result["result"]), agentPage) {
		t.Errorf("result %v", result)
	}
	if len(other) > 0 {
		t.Logf("other output: %q", other)
	}
	// The model saw the secret, swapped in on the host; the guest never did.
	reqs := w.model.Requests()
	var messages int
	for _, r := range reqs {
		if r.Path == "/v1/messages" {
			messages++
			if r.Key != w.model.Secret {
				t.Errorf("the model got key %q, not the secret", r.Key)
			}
		}
	}
	if messages != 3 {
		t.Errorf("%d model requests, want 3: %+v", messages, reqs)
	}

	db := openLedger(t, v)
	// One row per tool call, made by Claude Code, allowed.
	calls := dumpQuery(db, `SELECT tool_name, decision, process_name FROM mcp_calls WHERE method = 'tools/call' ORDER BY id`)
	if want := "tool_name|decision|process_name\neverything__echo|allowed|claude\nbuiltin__http_get|allowed|claude\n"; calls != want {
		t.Errorf("tools/call rows:\n%s\nwant:\n%s", calls, want)
	}
	// The model traffic: allowed connections to the API, and its usage.
	var conns int
	db.QueryRow(`SELECT COUNT(*) FROM net_events WHERE domain = ? AND decision = 'allowed'`, fakemodel.AnthropicHost).Scan(&conns)
	if conns == 0 {
		t.Errorf("no allowed connection to %s in net_events:\n%s", fakemodel.AnthropicHost, dump(db, "net_events"))
	}
	var models, input, output int
	db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) FROM model_calls WHERE provider = 'anthropic'`).Scan(&models, &input, &output)
	if models != 3 || input != 3*fakemodel.InputTokens || output != 3*fakemodel.OutputTokens {
		t.Errorf("model_calls: %d rows, %d in, %d out; want 3, %d, %d\n%s", models, input, output, 3*fakemodel.InputTokens, 3*fakemodel.OutputTokens, dump(db, "model_calls"))
	}
	db.Close()

	// The guest doctor's HTTPS check, its certificate checked by curl
	// against the guest's trust store, which holds the capsem CA the
	// credential path presents.
	modelURL := "https://" + fakemodel.AnthropicHost + ":" + w.model.Port + "/"
	if out, _ := v.guestSh(t, "capsem-doctor -k net --url "+modelURL); !strings.Contains(out, "RESULT: PASS") || !strings.Contains(out, "certificate checked") {
		t.Errorf("capsem-doctor -k net --url %s:\n%s", modelURL, out)
	}
	// The distribution's bundle made anew (a package's install can run
	// update-ca-certificates) keeps the capsem CA, for programs that read
	// only that bundle (libcurl's, git's): curl told to do the same.
	if out, errOut, code := v.guestRun(t, "update-ca-certificates >/dev/null 2>&1; env -u SSL_CERT_FILE -u CURL_CA_BUNDLE curl -sS -m 20 -o /dev/null "+modelURL); code != 0 {
		t.Errorf("after update-ca-certificates, curl no longer trusts the credential path (%d): %s%s", code, out, errOut)
	}

	// The policy now blocks the echo: Claude Code gets a tool error, and
	// the ledger has the refusal but nothing of the call's data.
	// A rule on the call's argument: the tool stays listed (a tool
	// blocked outright is not offered at all), its call is refused.
	blocked := readFile(t, w.config) + "\n[[mcp.rules]]\nname = \"no-fake-greetings\"\naction = \"block\"\ntool = \"everything__echo\"\nargument = \"message\"\nmatches = \"fake model\"\n"
	if err := os.WriteFile(w.config, []byte(blocked), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(v.info.PID, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the reload is asynchronous
	t.Log("policy reloaded; claude again")
	out, ev = claude(t)
	t.Logf("claude with the echo blocked: exit %d", ev.ExitCode)
	events, _ = streamEvents(out)
	var errorResult string
	for _, e := range events {
		if e["type"] != "user" {
			continue
		}
		msg, _ := e["message"].(map[string]any)
		content, _ := msg["content"].([]any)
		for _, c := range content {
			if block, _ := c.(map[string]any); block["type"] == "tool_result" && block["is_error"] == true && errorResult == "" {
				b, _ := json.Marshal(block["content"])
				errorResult = string(b)
			}
		}
	}
	if errorResult == "" || strings.Contains(errorResult, agentEcho) {
		t.Errorf("the blocked echo reached Claude Code as %q\n%s", errorResult, out)
	}
	db = openLedger(t, v)
	defer db.Close()
	var leaked int
	db.QueryRow(`SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'everything__echo' AND decision = 'denied' AND (request_preview LIKE ? OR response_preview LIKE ?)`,
		"%"+agentEcho+"%", "%"+agentEcho+"%").Scan(&leaked)
	var denied int
	db.QueryRow(`SELECT COUNT(*) FROM mcp_calls WHERE tool_name = 'everything__echo' AND decision = 'denied'`).Scan(&denied)
	if denied != 1 || leaked != 0 {
		t.Errorf("blocked echo: %d denied rows, %d with the call's data\n%s", denied, leaked, dump(db, "mcp_calls"))
	}

	// SIGHUP reloads [net] too: the model's name blocked, the next
	// connection to it is refused, and the refusal is a row.
	netBlocked := strings.Replace(readFile(t, w.config), "[net]\n", fmt.Sprintf("[net]\nblock = [%q]\n", fakemodel.AnthropicHost), 1)
	if err := os.WriteFile(w.config, []byte(netBlocked), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(v.info.PID, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the reload is asynchronous
	if out, errOut, code := v.guestRun(t, "curl -sS -m 20 -o /dev/null "+modelURL); code == 0 {
		t.Errorf("the model's name blocked by a SIGHUP reload, curl still reached it: %s%s", out, errOut)
	}
	var refused int
	db.QueryRow(`SELECT COUNT(*) FROM dns_events WHERE name = ? AND decision = 'denied'`, fakemodel.AnthropicHost).Scan(&refused)
	if refused == 0 {
		t.Errorf("no denied DNS row for %s after the reload:\n%s", fakemodel.AnthropicHost, dump(db, "dns_events"))
	}
}

// readAll reads path through, into the page cache.
func readAll(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}

// residentPages counts the pages of path in the host's page cache
// (mincore over a mapping of it).
func residentPages(t *testing.T, path string) (resident, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident, len(vec)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// openLedger opens v's session.db read-only.
func openLedger(t *testing.T, v *vmProc) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(v.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// TestGeminiCLIThroughTheGateway: real Gemini CLI, headless in a VM of the
// full root with the settings the image ships (API key auth, the gateway
// trusted, folder trust off), plays the same script: the everything
// server's echo and the builtin http_get through the gateway, the model
// traffic through the policy and the credential swap. Codex, the third
// CLI, starts and lists the gateway among its MCP servers.
func TestGeminiCLIThroughTheGateway(t *testing.T) {
	w := newAgentWorld(t)
	v := w.agentVM(t, "gemini")
	defer v.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	o := v.exec(ctx, &api.ExecRequest{Command: "gemini -p 'Call the echo tool, then fetch the page.' -m gemini-fake-model --output-format stream-json",
		Env: map[string]string{"GOOGLE_GEMINI_BASE_URL": "https://" + fakemodel.GoogleHost + ":" + w.model.Port}})
	if o.err != nil {
		t.Fatalf("gemini: %v\n%s\n%s", o.err, o.stdout.String(), o.stderr.String())
	}
	out := o.stdout.String()
	t.Logf("gemini -p took %v, exit %d", time.Since(start).Round(time.Millisecond), o.ev.ExitCode)
	if o.ev.ExitCode != 0 || !strings.Contains(out, "FAKE-DONE:") || !strings.Contains(out, agentPage) {
		t.Fatalf("gemini exit %d:\n%s\nstderr:\n%s", o.ev.ExitCode, out, o.stderr.String())
	}
	var results []fakemodel.ToolResult
	for _, r := range w.model.Requests() {
		if strings.HasSuffix(r.Path, ":streamGenerateContent") || strings.HasSuffix(r.Path, ":generateContent") {
			if r.Key != w.model.Secret {
				t.Errorf("the model got key %q on %s, not the secret", r.Key, r.Path)
			}
			if len(r.Results) > len(results) {
				results = r.Results
			}
		}
	}
	if len(results) != 2 || !strings.Contains(results[0].Text, "Echo: "+agentEcho) || !strings.Contains(results[1].Text, agentPage) {
		t.Errorf("tool results the model got back: %+v", results)
	}
	db := openLedger(t, v)
	defer db.Close()
	calls := dumpQuery(db, `SELECT tool_name, decision, process_name FROM mcp_calls WHERE method = 'tools/call' ORDER BY id`)
	if want := "tool_name|decision|process_name\neverything__echo|allowed|gemini\nbuiltin__http_get|allowed|gemini\n"; calls != want {
		t.Errorf("tools/call rows:\n%s\nwant:\n%s", calls, want)
	}
	var models, input, output int
	db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0) FROM model_calls WHERE provider = 'google'`).Scan(&models, &input, &output)
	if models < 3 || input != models*fakemodel.InputTokens || output != models*fakemodel.OutputTokens {
		t.Errorf("model_calls: %d rows, %d input and %d output tokens\n%s", models, input, output, dump(db, "model_calls"))
	}

	codex, _ := v.guestSh(t, "codex mcp list")
	if !strings.Contains(codex, "capsem") || !strings.Contains(codex, "/usr/bin/capsem-mcp-server") {
		t.Errorf("codex mcp list:\n%s", codex)
	}
}

// TestPackageManagersThroughTheDefaultPolicy: with no configuration but
// capsem's defaults, a VM of the full root installs from the registries
// this machine reaches, through its network and the [net] policy: a
// Debian package with apt-get and an npm package globally. Each
// connection is a row in the ledger. (PyPI is allowed by the same
// defaults but is not reachable from this machine.)
func TestPackageManagersThroughTheDefaultPolicy(t *testing.T) {
	root := testkit.SharedRootImage(t)
	empty := filepath.Join(t.TempDir(), "empty.toml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	v := startVM(t, "registries", func(c *vmhost.ProcessConfig) { c.RootImage, c.Config, c.RAMMB = root.Image, empty, 2048 })
	defer v.stop(t)
	var out strings.Builder
	for _, step := range []string{
		"apt-get update -q >/dev/null",
		"DEBIAN_FRONTEND=noninteractive apt-get install -y -q jq >/dev/null",
		`echo '{"installed":"jq"}' | jq -r .installed`,
		"npm install -g --no-audit --no-fund is-number@7.0.0 >/dev/null",
		`node -e 'console.log("is-number", require("/usr/local/lib/node_modules/is-number")(7))'`,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		start := time.Now()
		o := v.exec(ctx, &api.ExecRequest{Command: step})
		cancel()
		if o.err != nil || o.ev.ExitCode != 0 {
			t.Fatalf("%s: %v\n%s\n%s", step, o.err, o.stdout.String(), o.stderr.String())
		}
		t.Logf("%s: %v", step, time.Since(start).Round(time.Millisecond))
		out.WriteString(o.stdout.String())
	}
	if want := "jq\nis-number true\n"; out.String() != want {
		t.Errorf("guest said %q, want %q", out.String(), want)
	}
	// Something outside the defaults stays refused.
	if _, _, code := v.guestRun(t, "curl -fsS -m 20 -o /dev/null https://example.com/"); code == 0 {
		t.Error("a name outside the defaults was reached")
	}
	db := openLedger(t, v)
	defer db.Close()
	for _, host := range []string{"deb.debian.org", "registry.npmjs.org"} {
		var n int
		db.QueryRow(`SELECT COUNT(*) FROM net_events WHERE domain = ? AND decision = 'allowed'`, host).Scan(&n)
		if n == 0 {
			t.Errorf("no allowed connection to %s in the ledger:\n%s", host, dump(db, "net_events"))
		}
	}
}
