package gateway_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/testkit"
)

func reverse(s string) string {
	r := []rune(s)
	slices.Reverse(r)
	return string(r)
}

func secret(prefix string) string {
	b := make([]byte, 12)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// policyConfig puts the real server-everything and our echo server (which
// logs every message it receives) behind the README's policy matrix.
func policyConfig(t *testing.T, echoLog string, extra string) string {
	return fmt.Sprintf(`
[mcp]
default = "allow"
[mcp.tools]
"everything__get-env" = "block"
"everything__get-sum" = "warn"

[[mcp.rules]]
name = "no-static-docs"
action = "block"
resource_uri = "capsem://everything/demo://resource/static/document/*"

[[mcp.rules]]
name = "no-token-argument"
action = "block"
tool = "echo__*"
argument = "token"

[[mcp.rules]]
name = "no-forbidden-text"
action = "block"
tool = "echo__echo"
argument = "text"
matches = "FORBIDDEN-[0-9a-f]+"

[[mcp.rules]]
name = "deep-needle"
action = "block"
tool = "echo__echo"
argument = "deep.needle"
equals = { kind = "needle", n = 7 }

[[mcp.rules]]
name = "allow-echo"
action = "allow"
tool = "echo__echo"

[[mcp.rules]]
name = "no-rain"
action = "block"
tool = "everything__get-structured-content"
returns = "structuredContent.conditions"
returns_matches = "rain"

[[mcp.rules]]
name = "no-password-out"
action = "block"
tool = "echo__echo"
returns = "content.0.text"
returns_matches = "password-[0-9a-f]+"

[[mcp.rules]]
name = "no-password-in-errors"
action = "block"
tool = "echo__fail"
returns = "content.0.text"
returns_matches = "password-[0-9a-f]+"
%s
%s
[[mcp.servers]]
name = "echo"
command = %q
env = { MCPECHO_LOG = %q }
write_paths = [%q]
`, extra, everythingServer(t), testkit.EchoServer(t), echoLog, filepath.Dir(echoLog))
}

// TestPolicyMatrix runs the policy matrix through real frames, the
// relay and real servers, and proves that nothing blocked leaks: not to the
// server, not to the caller, not into session.db.
func TestPolicyMatrix(t *testing.T) {
	logDir := t.TempDir()
	echoLog := filepath.Join(logDir, "echo-messages.log")
	g := startGateway(t, policyConfig(t, echoLog, ""))
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()

	// Lists hide what is blocked whatever the arguments.
	tools := map[string]bool{}
	for tool, err := range s.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools[tool.Name] = true
	}
	if tools["everything__get-env"] || !tools["everything__echo"] || !tools["everything__get-sum"] || !tools["echo__echo"] {
		t.Fatalf("tools/list does not hide exactly the blocked tool: %v", tools)
	}
	staticSeen, othersSeen := false, false
	for r, err := range s.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(r.URI, "capsem://everything/demo://resource/static/document/") {
			staticSeen = true
		} else {
			othersSeen = true
		}
	}
	if staticSeen {
		t.Error("resources/list shows resources a URI rule blocks")
	}
	_ = othersSeen // server-everything may list only static documents

	blocked := func(name string, args map[string]any, rule string, secrets ...string) {
		t.Helper()
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err == nil {
			t.Fatalf("%s was not blocked: %+v", name, res)
		}
		if !strings.Contains(err.Error(), rule) || !strings.Contains(err.Error(), "blocked by policy") {
			t.Fatalf("%s: error %q does not name rule %q", name, err, rule)
		}
		for _, sec := range secrets {
			if strings.Contains(err.Error(), sec) {
				t.Fatalf("%s: the error repeats the blocked data", name)
			}
		}
	}

	// Per-tool block.
	blocked("everything__get-env", map[string]any{}, "tools.everything__get-env")
	// Warn: allowed, recorded as warned.
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "everything__get-sum", Arguments: map[string]any{"a": 2, "b": 3}}); err != nil || !strings.Contains(text(t, res), "5") {
		t.Fatalf("warned call: %v %+v", err, res)
	}
	// Argument-name rule.
	tokenSecret := secret("tok-")
	blocked("echo__echo", map[string]any{"text": "hi", "token": tokenSecret}, "no-token-argument", tokenSecret)
	// Argument-value rule (regex), and deny over allow: allow-echo matches too.
	forbidden := secret("FORBIDDEN-")
	blocked("echo__echo", map[string]any{"text": "say " + forbidden}, "no-forbidden-text", forbidden)
	// The allow rule lets an ordinary echo through.
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "plain-hello"}}); err != nil || text(t, res) != "plain-hello" {
		t.Fatalf("allowed echo: %v %+v", err, res)
	}
	// Argument-value rule (JSON equality) still matches behind 900 KB of
	// padding, through the relay's frames.
	needle := secret("needle-")
	blocked("echo__echo", map[string]any{"text": needle, "pad": strings.Repeat("p", 900<<10), "deep": map[string]any{"needle": map[string]any{"n": 7, "kind": "needle"}}}, "deep-needle", needle)
	// Resource URI rule, and the spellings of the same URI the server
	// reads as that resource: each is blocked by the rule, or refused.
	const doc = "capsem://everything/demo://resource/static/document/architecture.md"
	for _, uri := range []string{doc,
		"capsem://everything/DEMO://resource/static/document/architecture.md",
		"capsem://everything/demo://RESOURCE/static/document/architecture.md",
		"capsem://everything/demo://resource/x/../static/document/architecture.md",
		"capsem://everything/demo://resource/./static/document/architecture.md",
		"capsem://everything/demo://resource/%73tatic/document/architecture.md",
		"capsem://everything/demo://resource/x/%2e%2e/static/document/architecture.md",
	} {
		if _, err := s.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "no-static-docs") {
			t.Errorf("resource rule, read as %s: %v", uri, err)
		}
	}
	for _, uri := range []string{
		"capsem://everything/demo://resource/static/document/architecture.md\n",
		"capsem://everything/demo://resource/static/document/\tarchitecture.md",
		"capsem://everything/ demo://resource/static/document/architecture.md",
		"capsem://everything/demo://resource/static/document/architecture.md ",
	} {
		if _, err := s.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil || !strings.Contains(err.Error(), "white space or a control character") {
			t.Errorf("resource URI %q: %v, want a refusal", uri, err)
		}
	}
	// Argument rules that block match keys whatever their case, as a Go
	// server decoding with encoding/json reads them.
	var caseSecrets []string
	for _, key := range []string{"TEXT", "Text", "tExT"} {
		forbidden := secret("FORBIDDEN-")
		caseSecrets = append(caseSecrets, forbidden)
		blocked("echo__echo", map[string]any{key: "say " + forbidden}, "no-forbidden-text", forbidden)
	}
	// A return rule sees a JSON-RPC error's message as it sees a result.
	errPassword := secret("password-")
	blocked("echo__fail", map[string]any{"text": reverse("the " + errPassword), "reverse": true}, "no-password-in-errors", errPassword)
	// Return-value rules: structuredContent and text content.
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "everything__get-structured-content", Arguments: map[string]any{"location": "New York"}}); err != nil {
		t.Fatalf("structured content without rain: %v %+v", err, res)
	}
	blocked("everything__get-structured-content", map[string]any{"location": "Chicago"}, "no-rain", "drizzle")
	// The server reverses the text, so the password exists only in its
	// result, never in the request.
	password := secret("password-")
	blocked("echo__echo", map[string]any{"text": reverse("the " + password), "reverse": true}, "no-password-out", password)

	// The connection still serves after every block.
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "still-here"}}); err != nil || text(t, res) != "still-here" {
		t.Fatalf("after the blocks: %v %+v", err, res)
	}

	// Not to the server: its own message log has the allowed calls and none
	// of the blocked requests.
	serverLog, err := os.ReadFile(echoLog)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(serverLog), "plain-hello") || !strings.Contains(string(serverLog), reverse(password)) {
		t.Fatalf("the echo server log misses calls that reached it:\n%.2000s", serverLog)
	}
	for _, sec := range append([]string{tokenSecret, forbidden, needle}, caseSecrets...) {
		if strings.Contains(string(serverLog), sec) {
			t.Errorf("a blocked request reached the server (%s found in its log)", sec[:4])
		}
	}
	if strings.Contains(string(serverLog), strings.Repeat("p", 1000)) {
		t.Error("the padded blocked request reached the server")
	}

	// The ledger: denied rows name their rule; blocked requests keep only a
	// hash; no secret is anywhere in the database files.
	db := g.db(t)
	for rule, want := range map[string]int{"tools.everything__get-env": 1, "no-token-argument": 1, "no-forbidden-text": 4, "deep-needle": 1,
		"no-static-docs": 7, "no-rain": 1, "no-password-out": 1, "no-password-in-errors": 1} {
		if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE decision='denied' AND policy_action='block' AND policy_rule=?`, rule); n != want {
			t.Errorf("rule %s: %d denied rows, want %d", rule, n, want)
		}
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE decision='denied' AND policy_rule='no-token-argument' AND request_preview LIKE '{"redacted_by_policy":true,"hmac_sha256":"%' AND request_digest LIKE 'hmac-sha256:%'`); n != 1 {
		t.Error("blocked request row is not redacted to a hash")
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE decision='denied' AND policy_rule='no-rain' AND response_preview='{"redacted_by_policy":true}'`); n != 1 {
		t.Error("blocked response row is not redacted")
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE decision='warned' AND tool_name='everything__get-sum' AND policy_action='warn'`); n != 1 {
		t.Error("warned call not recorded as warned")
	}
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM mcp_calls WHERE decision='allowed' AND policy_rule='allow-echo' AND response_preview LIKE '%plain-hello%'`); n != 1 {
		t.Error("allowed echo row missing or not attributed to its allow rule")
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		data, err := os.ReadFile(filepath.Join(g.sessionDir, "session.db"+suffix))
		if err != nil {
			if suffix != "" && os.IsNotExist(err) {
				continue
			}
			t.Fatal(err)
		}
		for _, sec := range append([]string{tokenSecret, forbidden, needle, password, errPassword, "drizzle"}, caseSecrets...) {
			if strings.Contains(string(data), sec) {
				t.Errorf("session.db%s contains blocked data (%.8s…)", suffix, sec)
			}
		}
	}
	for _, f := range []string{g.logPath, filepath.Join(g.sessionDir, "mcp-aggregator.log")} {
		data, _ := os.ReadFile(f)
		for _, sec := range []string{tokenSecret, forbidden, needle} {
			if strings.Contains(string(data), sec) {
				t.Errorf("%s contains blocked data", filepath.Base(f))
			}
		}
	}
}

// TestPolicyLiveMutation changes policy under an open guest connection:
// `capsem policy reload` swaps it, the same connection sees it on its next
// request, and an invalid file is reported and leaves the policy in force.
func TestPolicyLiveMutation(t *testing.T) {
	logDir := t.TempDir()
	echoLog := filepath.Join(logDir, "echo.log")
	g := startGateway(t, fmt.Sprintf("[[mcp.servers]]\nname = \"echo\"\ncommand = %q\nenv = { MCPECHO_LOG = %q }\nwrite_paths = [%q]\n", testkit.EchoServer(t), echoLog, logDir))
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	call := func(text string) error {
		_, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": text}})
		return err
	}
	if err := call("before"); err != nil {
		t.Fatal(err)
	}
	cfgPath := g.cmd.Args[len(g.cmd.Args)-1]
	home := filepath.Join(filepath.Dir(g.sessionDir), "home")
	reload := func() (string, error) {
		cmd := exec.Command(testkit.CapsemBinary(t), "policy", "reload")
		cmd.Env = append(os.Environ(), "CAPSEM_HOME="+home)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	old, _ := os.ReadFile(cfgPath)
	os.WriteFile(cfgPath, append(old, []byte("[mcp.tools]\n\"echo__echo\" = \"block\"\n")...), 0o600)
	out, err := reload()
	if err != nil || !strings.Contains(out, "reloaded gateway") || !strings.Contains(out, "1 per-tool decision") {
		t.Fatalf("policy reload: %v\n%s", err, out)
	}
	afterSecret := secret("after-")
	if err := call(afterSecret); err == nil || !strings.Contains(err.Error(), "tools.echo__echo") {
		t.Fatalf("the open connection did not see the new policy: %v", err)
	}
	// The tool is now hidden from the list too.
	for tool, err := range s.Tools(ctx, nil) {
		if err == nil && tool.Name == "echo__echo" {
			t.Fatal("blocked tool still listed after reload")
		}
	}
	// An invalid file: reported with its reason, the block stays.
	os.WriteFile(cfgPath, append(old, []byte("[mcp]\ndefault = \"sometimes\"\n")...), 0o600)
	out, err = reload()
	if err == nil || !strings.Contains(out, "FAILED") || !strings.Contains(out, `"sometimes" is not a decision`) {
		t.Fatalf("invalid reload not reported: %v\n%s", err, out)
	}
	if err := call("still-blocked"); err == nil {
		t.Fatal("an invalid reload relaxed the policy")
	}
	// SIGHUP reloads too: restoring the file unblocks.
	os.WriteFile(cfgPath, old, 0o600)
	g.cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(20 * time.Second)
	for call("unblocked") != nil {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not restore the policy")
		}
		time.Sleep(100 * time.Millisecond)
	}
	logData, _ := os.ReadFile(echoLog)
	if strings.Contains(string(logData), afterSecret) || strings.Contains(string(logData), "still-blocked") {
		t.Error("a call blocked after the reload reached the server")
	}
	if !strings.Contains(string(logData), "unblocked") {
		t.Error("the server log misses the call after unblocking")
	}
}

// TestBuiltinDomainsFollowReload: the builtin server's domain lists change
// with a policy reload, like the rest of the policy.
func TestBuiltinDomainsFollowReload(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello-domain")
	}))
	defer web.Close()
	base := "[mcp.builtin]\nallow_private_networks = true\n"
	g := startGateway(t, base)
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	get := func() (string, bool) {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "builtin__http_get", Arguments: map[string]any{"url": web.URL}})
		if err != nil {
			return err.Error(), true
		}
		return text(t, res), res.IsError
	}
	if out, isErr := get(); isErr || !strings.Contains(out, "hello-domain") {
		t.Fatalf("before the reload: %v %s", isErr, out)
	}
	cfgPath := g.cmd.Args[len(g.cmd.Args)-1]
	os.WriteFile(cfgPath, []byte(base+"domain_block = [\"127.0.0.1\"]\n"), 0o600)
	cmd := exec.Command(testkit.CapsemBinary(t), "policy", "reload")
	cmd.Env = append(os.Environ(), "CAPSEM_HOME="+filepath.Join(filepath.Dir(g.sessionDir), "home"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("policy reload: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, isErr := get()
		if isErr && strings.Contains(out, `domain blocked by "127.0.0.1"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the builtin still fetches a domain blocked by the reloaded policy: %v %s", isErr, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	db := g.db(t)
	if n := scalar[int](t, db, `SELECT COUNT(*) FROM net_events WHERE domain='127.0.0.1' AND decision='denied'`); n < 1 {
		t.Error("the blocked fetch has no denied net_events row")
	}
}

// TestCorpPolicyOverridesUser runs the gateway with a corp.toml: a server
// corp blocks is never started even though the user file defines it, and
// corp's default wins over the user's.
func TestCorpPolicyOverridesUser(t *testing.T) {
	logDir := t.TempDir()
	blockedLog := filepath.Join(logDir, "blocked.log")
	corp := filepath.Join(t.TempDir(), "corp.toml")
	os.WriteFile(corp, []byte("[mcp]\ndefault = \"block\"\nblocked_servers = [\"blocked\"]\n[mcp.tools]\n\"echo__echo\" = \"allow\"\n"), 0o600)
	user := fmt.Sprintf("[mcp]\ndefault = \"allow\"\n[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n[[mcp.servers]]\nname = \"blocked\"\ncommand = %q\nenv = { MCPECHO_LOG = %q }\nwrite_paths = [%q]\n",
		testkit.EchoServer(t), testkit.EchoServer(t), blockedLog, logDir)
	g := startGateway(t, user, "CAPSEM_CORP_CONFIG="+corp)
	s := g.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "corp-allowed"}}); err != nil || text(t, res) != "corp-allowed" {
		t.Fatalf("corp per-tool allow: %v", err)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "echo__big", Arguments: map[string]any{"bytes": 1}}); err == nil || !strings.Contains(err.Error(), `"default"`) {
		t.Fatalf("corp default block did not win over the user's allow: %v", err)
	}
	if _, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "blocked__echo", Arguments: map[string]any{"text": "x"}}); err == nil || !strings.Contains(err.Error(), "blocked_servers") {
		t.Fatalf("corp-blocked server reachable: %v", err)
	}
	for tool, err := range s.Tools(ctx, nil) {
		if err == nil && (strings.HasPrefix(tool.Name, "blocked__") || tool.Name == "echo__big") {
			t.Errorf("%s is listed though corp policy blocks it", tool.Name)
		}
	}
	if _, err := os.Stat(blockedLog); !os.IsNotExist(err) {
		t.Errorf("the corp-blocked server was started (its log exists: %v)", err)
	}
}
