package endpoint

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/jsonrpc"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/mcpframe"
	"github.com/capsem/capsem/core/policy"
)

// fakeUpstream answers like an aggregator with one server "srv".
type fakeUpstream struct {
	mu        sync.Mutex
	calls     []string
	cancelled int
}

func (f *fakeUpstream) Do(ctx context.Context, req *aggwire.Request) (*aggwire.Response, error) {
	f.mu.Lock()
	f.calls = append(f.calls, req.Method+" "+req.Name+req.URI)
	f.mu.Unlock()
	switch req.Method {
	case aggwire.MethodListTools:
		return &aggwire.Response{Tools: []aggwire.Tool{{Name: "srv__echo", OriginalName: "echo", Server: "srv", Description: "echo",
			InputSchema: []byte(`{"type":"object"}`), Annotations: &aggwire.Annotations{ReadOnlyHint: true}}}}, nil
	case aggwire.MethodListResources:
		return &aggwire.Response{Resources: []aggwire.Resource{{URI: "capsem://srv/mem://a", OriginalURI: "mem://a", Server: "srv", Name: "a"}}}, nil
	case aggwire.MethodListPrompts:
		return &aggwire.Response{Prompts: []aggwire.Prompt{{Name: "srv__p", OriginalName: "p", Server: "srv"}}}, nil
	case aggwire.MethodReadResource:
		return &aggwire.Response{Result: []byte(`{"contents":[{"uri":"mem://a","text":"A"}]}`)}, nil
	case aggwire.MethodGetPrompt:
		return &aggwire.Response{Result: []byte(`{"messages":[]}`)}, nil
	case aggwire.MethodCallTool:
		var args map[string]any
		json.Unmarshal(req.Arguments, &args)
		switch req.Name {
		case "srv__echo":
			b, _ := json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": args["text"]}}})
			return &aggwire.Response{Result: b, NetEvents: []aggwire.NetEvent{{TimestampUnixNano: time.Now().UnixNano(), Domain: "example.com", Port: 443, Method: "GET", Path: "/", StatusCode: 200, Decision: "allowed", IP: "192.0.2.7"}}}, nil
		case "srv__sleep":
			select {
			case <-time.After(10 * time.Second):
				return &aggwire.Response{Result: []byte(`{"content":[]}`)}, nil
			case <-ctx.Done():
				f.mu.Lock()
				f.cancelled++
				f.mu.Unlock()
				return nil, ctx.Err()
			}
		case "srv__200k":
			return &aggwire.Response{Result: []byte(`{"content":[{"type":"text","text":"` + strings.Repeat("y", 200<<10) + `"}]}`)}, nil
		case "srv__big":
			return &aggwire.Response{Result: []byte(`{"content":[{"type":"text","text":"` + strings.Repeat("x", mcpframe.MaxBodyLen) + `"}]}`)}, nil
		case "srv__fail":
			return &aggwire.Response{Code: aggwire.CodeUpstream, Error: "tool call: server error -32602: bad thing happened"}, nil
		}
		return &aggwire.Response{Code: aggwire.CodeInvalidParams, Error: fmt.Sprintf("unknown tool %q", req.Name)}, nil
	}
	return nil, fmt.Errorf("unexpected method %s", req.Method)
}

type harness struct {
	t    *testing.T
	ep   *Endpoint
	up   *fakeUpstream
	led  *ledger.Ledger
	db   string
	conn net.Conn
	rd   *mcpframe.Reader
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "session.db")
	led, err := ledger.Open(context.Background(), dbPath, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	up := &fakeUpstream{}
	cfg.Upstream = up
	cfg.Recorder = LedgerRecorder{Ledger: led}
	ep := New(cfg)
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() { ep.ServeConn(context.Background(), server); close(done) }()
	t.Cleanup(func() {
		client.Close()
		<-done
		led.Close()
	})
	client.Write([]byte("\x00CAPSEM_META:claude\n"))
	return &harness{t: t, ep: ep, up: up, led: led, db: dbPath, conn: client, rd: mcpframe.NewReader(bufio.NewReader(client))}
}

func (h *harness) sendRaw(b []byte) {
	h.t.Helper()
	if _, err := h.conn.Write(b); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) send(stream uint32, payload string) {
	h.t.Helper()
	f := mcpframe.Frame{StreamID: stream, Name: "claude", Payload: []byte(payload)}
	if stream == 0 {
		f.Flags = mcpframe.FlagNotification
	}
	b, err := mcpframe.Encode(&f)
	if err != nil {
		h.t.Fatal(err)
	}
	h.sendRaw(b)
}

type reply struct {
	stream uint32
	msg    *jsonrpc.Message
	raw    string
}

func (h *harness) recv() reply {
	h.t.Helper()
	h.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := h.rd.Read()
	if err != nil {
		h.t.Fatalf("reading response: %v", err)
	}
	m, err := jsonrpc.ParseResponse(f.Payload)
	if err != nil {
		h.t.Fatalf("bad response %s: %v", f.Payload, err)
	}
	return reply{f.StreamID, m, string(f.Payload)}
}

func (h *harness) call(stream uint32, payload string) reply {
	h.t.Helper()
	h.send(stream, payload)
	r := h.recv()
	if r.stream != stream {
		h.t.Fatalf("response on stream %d, want %d", r.stream, stream)
	}
	return r
}

func (h *harness) rows(query string, args ...any) [][]any {
	h.t.Helper()
	db, err := sql.Open("sqlite3", "file:"+h.db+"?mode=ro")
	if err != nil {
		h.t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.Query(query, args...)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rs.Close()
	cols, _ := rs.Columns()
	var out [][]any
	for rs.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		rs.Scan(ptrs...)
		out = append(out, vals)
	}
	return out
}

func errCode(r reply) int64 {
	if r.msg.Error == nil {
		return 0
	}
	return r.msg.Error.Code
}

func TestDispatchEveryMethod(t *testing.T) {
	h := newHarness(t, Config{Version: "test"})
	init := h.call(1, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	var ir struct {
		ProtocolVersion string         `json:"protocolVersion"`
		Capabilities    map[string]any `json:"capabilities"`
		ServerInfo      map[string]any `json:"serverInfo"`
	}
	json.Unmarshal(init.msg.Result, &ir)
	if ir.ProtocolVersion != "2025-06-18" || ir.Capabilities["tools"] == nil || ir.ServerInfo["name"] != "capsem-gateway" {
		t.Fatalf("initialize: %s", init.raw)
	}
	unknownVersion := h.call(2, `{"jsonrpc":"2.0","id":2,"method":"initialize","params":{"protocolVersion":"1999-01-01"}}`)
	if !strings.Contains(unknownVersion.raw, `"protocolVersion":"2025-11-25"`) {
		t.Fatalf("unknown version must get the latest: %s", unknownVersion.raw)
	}
	h.send(0, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	cases := []struct {
		stream   uint32
		req      string
		code     int64
		contains string
	}{
		{3, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`, 0, `"name":"srv__echo"`},
		{4, `{"jsonrpc":"2.0","id":"s4","method":"tools/call","params":{"name":"srv__echo","arguments":{"text":"hi"}}}`, 0, `"text":"hi"`},
		{5, `{"jsonrpc":"2.0","id":5,"method":"resources/list"}`, 0, `capsem://srv/mem://a`},
		{6, `{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"capsem://srv/mem://a"}}`, 0, `"text":"A"`},
		{7, `{"jsonrpc":"2.0","id":7,"method":"prompts/list"}`, 0, `"name":"srv__p"`},
		{8, `{"jsonrpc":"2.0","id":8,"method":"prompts/get","params":{"name":"srv__p"}}`, 0, `"messages"`},
		{9, `{"jsonrpc":"2.0","id":9,"method":"ping"}`, 0, `"result":{}`},
		{10, `{"jsonrpc":"2.0","id":10,"method":"server/discover"}`, 0, `"2026-07-28"`},
		{11, `{"jsonrpc":"2.0","id":11,"method":"nope/nothing"}`, jsonrpc.CodeMethodNotFound, `method not found: nope/nothing`},
		{12, `{"jsonrpc":"2.0","id":12,"method":"tools/call"}`, jsonrpc.CodeInvalidParams, `missing params`},
		{13, `{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{}}`, jsonrpc.CodeInvalidParams, `missing tool name`},
		{14, `{"jsonrpc":"2.0","id":14,"method":"resources/read","params":{}}`, jsonrpc.CodeInvalidParams, `missing resource URI`},
		{15, `{"jsonrpc":"2.0","id":15,"method":"prompts/get","params":{"arguments":{}}}`, jsonrpc.CodeInvalidParams, `missing prompt name`},
		{16, `{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"echo"}}`, jsonrpc.CodeInvalidParams, `not namespaced`},
		{17, `{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"srv__fail"}}`, jsonrpc.CodeInternalError, `bad thing happened`},
		{18, `{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"srv__missing"}}`, jsonrpc.CodeInvalidParams, `unknown tool`},
		{19, `{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":"srv__echo","arguments":[1]}}`, jsonrpc.CodeInvalidParams, `must be a JSON object`},
		{20, `{"jsonrpc":"2.0","id":20,"method":"resources/read","params":{"uri":"file:///etc/passwd"}}`, jsonrpc.CodeInvalidParams, `not namespaced`},
		{21, `{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"Name":"srv__echo","arguments":{"text":"hi"}}}`, jsonrpc.CodeInvalidParams, `missing tool name`},
		{22, `{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":7}}`, jsonrpc.CodeInvalidParams, `name must be a string`},
		{23, `{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{"name":"srv\u005f_echo","arguments":{"text":"escaped"}}}`, 0, `"text":"escaped"`},
		{24, `{"jsonrpc":"2.0","id":24,"method":"resources/read","params":{"uri":["capsem://srv/mem://a"]}}`, jsonrpc.CodeInvalidParams, `uri must be a string`},
		{25, `{"jsonrpc":"2.0","id":25,"method":"tools/call","params":"srv__echo"}`, jsonrpc.CodeInvalidRequest, `params must be an object or array`},
	}
	for _, tc := range cases {
		r := h.call(tc.stream, tc.req)
		if errCode(r) != tc.code || !strings.Contains(r.raw, tc.contains) {
			t.Errorf("%s: got %s (code %d), want code %d containing %q", tc.req, r.raw, errCode(r), tc.code, tc.contains)
		}
	}
	// Every message has exactly one row, the notification included.
	got := h.rows(`SELECT COUNT(*) FROM mcp_calls`)[0][0].(int64)
	if want := int64(len(cases) + 3); got != want {
		t.Fatalf("%d rows, want %d", got, want)
	}
	row := h.rows(`SELECT server_name, tool_name, request_id, decision, process_name, stream_id, transport, request_preview, response_preview FROM mcp_calls WHERE request_id = 's4'`)
	if len(row) != 1 || row[0][0] != "srv" || row[0][1] != "srv__echo" || row[0][3] != "allowed" || row[0][4] != "claude" || row[0][5] != int64(4) || row[0][6] != "frame" ||
		!strings.Contains(row[0][7].(string), `"text":"hi"`) || !strings.Contains(row[0][8].(string), `"text":"hi"`) {
		t.Fatalf("string-id row: %v", row)
	}
	// Two echo calls (stream 4, and 23 with an escaped name) each hand back one.
	if n := h.rows(`SELECT COUNT(*) FROM net_events WHERE domain='example.com' AND conn_type='mcp_builtin' AND process_name='claude' AND source='builtin' AND ip='192.0.2.7' AND policy_action='allow'`)[0][0].(int64); n != 2 {
		t.Fatalf("net_events rows: %d", n)
	}
	fail := h.rows(`SELECT decision, error_code, error_message FROM mcp_calls WHERE request_id='17'`)
	if fail[0][0] != "error" || fail[0][1] != int64(jsonrpc.CodeInternalError) || !strings.Contains(fail[0][2].(string), "bad thing happened") {
		t.Fatalf("terminal error row: %v", fail)
	}
	note := h.rows(`SELECT decision, request_id FROM mcp_calls WHERE method='notifications/initialized'`)
	if len(note) != 1 || note[0][0] != "allowed" || note[0][1] != nil {
		t.Fatalf("notification row: %v", note)
	}
}

func TestMalformedInputKeepsServing(t *testing.T) {
	h := newHarness(t, Config{})
	// Invalid JSON: -32700 with a null id.
	r := h.call(1, `{"jsonrpc":"2.0","id":1,"method":`)
	if errCode(r) != jsonrpc.CodeParseError || r.msg.ID != nil {
		t.Fatalf("invalid JSON: %s", r.raw)
	}
	// Wrong version, batch.
	if r := h.call(2, `{"jsonrpc":"1.0","id":2,"method":"ping"}`); errCode(r) != jsonrpc.CodeInvalidRequest || string(r.msg.ID) != "2" {
		t.Fatalf("version: %s", r.raw)
	}
	if r := h.call(3, `[{"jsonrpc":"2.0","id":3,"method":"ping"}]`); errCode(r) != jsonrpc.CodeInvalidRequest {
		t.Fatalf("batch: %s", r.raw)
	}
	// A request frame without an id.
	if r := h.call(4, `{"jsonrpc":"2.0","method":"ping"}`); errCode(r) != jsonrpc.CodeInvalidRequest || !strings.Contains(r.raw, "missing a JSON-RPC id") {
		t.Fatalf("missing id: %s", r.raw)
	}
	// A notification frame carrying an id: dropped, no answer, row written.
	h.send(0, `{"jsonrpc":"2.0","id":99,"method":"ping"}`)
	// Malformed flags on stream 77: answered on 77, connection stays.
	bad := []byte{0, 0, 0, 18, 0x4D, 0x43, 1, 16, 0, 0, 0, 77, 0x80, 0, 0, 0, 0, 0, 0, 2, '{', '}'}
	h.sendRaw(bad)
	if r := h.recv(); r.stream != 77 || errCode(r) != jsonrpc.CodeInvalidRequest || !strings.Contains(r.raw, "reserved flag") {
		t.Fatalf("bad flags: %+v %s", r.stream, r.raw)
	}
	// Bad magic on stream 78.
	bad = []byte{0, 0, 0, 18, 0x4D, 0x44, 1, 16, 0, 0, 0, 78, 0, 0, 0, 0, 0, 0, 0, 2, '{', '}'}
	h.sendRaw(bad)
	if r := h.recv(); r.stream != 78 || !strings.Contains(r.raw, "bad magic") {
		t.Fatalf("bad magic: %s", r.raw)
	}
	// Stream-id reuse (replay of completed stream 4) and going backwards.
	if r := h.call(4, `{"jsonrpc":"2.0","id":40,"method":"ping"}`); errCode(r) != jsonrpc.CodeInvalidRequest || !strings.Contains(r.raw, "replays") || string(r.msg.ID) != "40" {
		t.Fatalf("replay: %s", r.raw)
	}
	// The connection still serves.
	if r := h.call(100, `{"jsonrpc":"2.0","id":100,"method":"ping"}`); errCode(r) != 0 {
		t.Fatalf("after errors: %s", r.raw)
	}
	// In-flight duplicate: start a slow call on 101, reuse 101.
	h.send(101, `{"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":"srv__sleep"}}`)
	time.Sleep(50 * time.Millisecond)
	if r := h.call(101, `{"jsonrpc":"2.0","id":1010,"method":"ping"}`); !strings.Contains(r.raw, "already in flight") {
		t.Fatalf("duplicate in flight: %s", r.raw)
	}
	h.send(0, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":101}}`)
	if r := h.recv(); r.stream != 101 || r.msg.Error == nil {
		t.Fatalf("cancelled call: %s", r.raw)
	}
	if n := h.rows(`SELECT COUNT(*) FROM mcp_calls WHERE decision='error' AND error_message LIKE '%JSON-RPC id; dropped%'`)[0][0].(int64); n != 1 {
		t.Fatalf("notification-with-id row missing")
	}
	if n := h.rows(`SELECT COUNT(*) FROM mcp_calls WHERE error_message LIKE 'invalid MCP frame%'`)[0][0].(int64); n != 2 {
		t.Fatalf("invalid frame rows: %d", n)
	}
}

func TestFatalLengthClosesOnlyThatConnection(t *testing.T) {
	h := newHarness(t, Config{})
	h.sendRaw([]byte{0xff, 0xff, 0xff, 0xff})
	h.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := h.rd.Read(); err == nil {
		t.Fatal("connection should close after an out-of-range length")
	}
}

func TestTimeoutCancelsUpstreamAndRecords(t *testing.T) {
	h := newHarness(t, Config{ToolTimeouts: map[string]time.Duration{"srv__sleep": 100 * time.Millisecond}})
	start := time.Now()
	r := h.call(1, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"srv__sleep"}}`)
	if errCode(r) != jsonrpc.CodeTimeout || !strings.Contains(r.raw, "timed out") {
		t.Fatalf("timeout: %s", r.raw)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("timeout took %v", time.Since(start))
	}
	h.up.mu.Lock()
	cancelled := h.up.cancelled
	h.up.mu.Unlock()
	if cancelled != 1 {
		t.Fatalf("upstream call not cancelled")
	}
	row := h.rows(`SELECT decision, error_code FROM mcp_calls WHERE request_id='1'`)
	if row[0][0] != "error" || row[0][1] != int64(jsonrpc.CodeTimeout) {
		t.Fatalf("timeout row %v", row)
	}
	// A reload swaps the deadlines on the open connection: the tool
	// default now applies to srv__sleep (short), and a longer per-tool
	// override is honoured too.
	h.ep.SetTimeouts(Timeouts{Tool: 150 * time.Millisecond})
	start = time.Now()
	if r := h.call(2, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"srv__sleep"}}`); errCode(r) != jsonrpc.CodeTimeout {
		t.Fatalf("after SetTimeouts: %s", r.raw)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 5*time.Second {
		t.Fatalf("the new tool default took %v", d)
	}
	if got := h.ep.timeoutFor("ping", ""); got != DefaultTimeout {
		t.Fatalf("zero default not filled in: %v", got)
	}
}

func TestClientCancelNotification(t *testing.T) {
	h := newHarness(t, Config{})
	h.send(1, `{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"srv__sleep"}}`)
	time.Sleep(50 * time.Millisecond)
	h.send(0, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow"}}`)
	r := h.recv()
	if r.stream != 1 || r.msg.Error == nil || !strings.Contains(r.raw, "cancelled") {
		t.Fatalf("cancel: %s", r.raw)
	}
}

func TestOversizedResponseBecomesError(t *testing.T) {
	h := newHarness(t, Config{})
	r := h.call(1, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"srv__big"}}`)
	if errCode(r) != jsonrpc.CodeInternalError || !strings.Contains(r.raw, "too large") {
		t.Fatalf("big: %.200s", r.raw)
	}
	if r := h.call(2, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); errCode(r) != 0 {
		t.Fatalf("connection must survive: %s", r.raw)
	}
}

// blockHook blocks srv__echo requests with text "secret" and responses
// containing "classified", warns on prompts, and replaces resource reads.
type blockHook struct{}

func (blockHook) CheckRequest(_ context.Context, c *policy.Call) policy.Verdict {
	if c.Name == "srv__echo" && strings.Contains(string(c.Arguments), "secret") {
		return policy.Verdict{Decision: policy.Block, Rule: "no-secrets", Reason: "argument contains a secret"}
	}
	if c.Method == "prompts/get" {
		return policy.Verdict{Decision: policy.Warn, Rule: "warn-prompts"}
	}
	return policy.Verdict{Rule: "default"}
}

func (blockHook) CheckError(_ context.Context, c *policy.Call, message string, data json.RawMessage) policy.Verdict {
	if strings.Contains(message, "classified") {
		return policy.Verdict{Decision: policy.Block, Rule: "no-classified"}
	}
	return policy.Verdict{Rule: "default"}
}

func (blockHook) CheckResponse(_ context.Context, c *policy.Call, result json.RawMessage) policy.Verdict {
	if strings.Contains(string(result), "classified") {
		return policy.Verdict{Decision: policy.Block, Rule: "no-classified"}
	}
	if c.Method == "resources/read" {
		return policy.Verdict{Rule: "redact", Replace: json.RawMessage(`{"contents":[]}`)}
	}
	return policy.Verdict{Rule: "default"}
}

func TestPolicyHookBlocksWarnsReplacesAndRedacts(t *testing.T) {
	h := newHarness(t, Config{})
	// Live swap on an open connection.
	if r := h.call(1, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"srv__echo","arguments":{"text":"secret-1"}}}`); errCode(r) != 0 {
		t.Fatalf("allow-all: %s", r.raw)
	}
	h.ep.SetPolicy(blockHook{})
	calls := len(h.up.calls)
	r := h.call(2, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"srv__echo","arguments":{"text":"secret-2"}}}`)
	if errCode(r) != jsonrpc.CodeInvalidRequest || !strings.Contains(r.raw, "no-secrets") || strings.Contains(r.raw, "secret-2") {
		t.Fatalf("blocked request: %s", r.raw)
	}
	if len(h.up.calls) != calls {
		t.Fatal("a blocked request reached the upstream")
	}
	r = h.call(3, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"srv__echo","arguments":{"text":"classified-3"}}}`)
	if errCode(r) != jsonrpc.CodeInvalidRequest || strings.Contains(r.raw, "classified-3") {
		t.Fatalf("blocked response: %s", r.raw)
	}
	if r := h.call(4, `{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"srv__p"}}`); errCode(r) != 0 {
		t.Fatalf("warn: %s", r.raw)
	}
	if r := h.call(5, `{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"capsem://srv/mem://a"}}`); !strings.Contains(r.raw, `"contents":[]`) {
		t.Fatalf("replace: %s", r.raw)
	}
	rows := h.rows(`SELECT request_id, decision, policy_rule, request_preview, response_preview FROM mcp_calls WHERE request_id IN ('2','3','4','5') ORDER BY request_id`)
	want := []struct{ decision, rule string }{{"denied", "no-secrets"}, {"denied", "no-classified"}, {"warned", "warn-prompts"}, {"allowed", "redact"}}
	for i, w := range want {
		if rows[i][1] != w.decision || rows[i][2] != w.rule {
			t.Errorf("row %v: want %v", rows[i], w)
		}
	}
	if !strings.Contains(rows[0][3].(string), "redacted_by_policy") {
		t.Errorf("blocked request preview not redacted: %v", rows[0][3])
	}
	if !strings.Contains(rows[1][4].(string), "redacted_by_policy") {
		t.Errorf("blocked response preview not redacted: %v", rows[1][4])
	}
	// Neither blocked secret is in the ledger where it must not be: the
	// blocked request's arguments nowhere, the blocked result nowhere.
	if n := h.rows(`SELECT COUNT(*) FROM mcp_calls WHERE request_preview LIKE '%secret-2%' OR response_preview LIKE '%secret-2%' OR error_message LIKE '%secret-2%'`)[0][0].(int64); n != 0 {
		t.Errorf("blocked request arguments leaked into %d rows", n)
	}
	if n := h.rows(`SELECT COUNT(*) FROM mcp_calls WHERE response_preview LIKE '%classified-3%' OR error_message LIKE '%classified-3%'`)[0][0].(int64); n != 0 {
		t.Errorf("blocked response leaked into %d rows", n)
	}
}

func TestPipelinedOutOfOrderAndBackpressure(t *testing.T) {
	h := newHarness(t, Config{InFlight: 2})
	// Two slow calls fill the cap; a ping queued behind them is answered only
	// after one finishes (reading is back-pressured), and answers arrive in
	// completion order.
	h.send(1, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"srv__sleep"}}`)
	h.send(2, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"srv__echo","arguments":{"text":"fast"}}}`)
	r := h.recv()
	if r.stream != 2 {
		t.Fatalf("fast call should complete first, got stream %d", r.stream)
	}
	h.send(0, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`)
	if r := h.recv(); r.stream != 1 {
		t.Fatalf("got stream %d", r.stream)
	}
}

// TestHalfCloseStillGetsAnswers: a client that sends its requests and then
// closes its write side (as the relay does at stdin EOF) gets every answer.
func TestHalfCloseStillGetsAnswers(t *testing.T) {
	dir := t.TempDir()
	led, err := ledger.Open(context.Background(), filepath.Join(dir, "session.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	ep := New(Config{Upstream: &fakeUpstream{}, Recorder: LedgerRecorder{Ledger: led}})
	ln, err := net.Listen("unix", filepath.Join(dir, "ep.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ep.Serve(ctx, ln)
	for i := 0; i < 20; i++ { // the race this guards against was timing-dependent
		c, err := net.Dial("unix", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		var buf []byte
		for id := uint32(1); id <= 3; id++ {
			buf, _ = mcpframe.Append(buf, &mcpframe.Frame{StreamID: id, Name: "x", Payload: []byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"ping"}`, id))})
		}
		c.Write(buf)
		c.(*net.UnixConn).CloseWrite()
		r := mcpframe.NewReader(c)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for n := 0; n < 3; n++ {
			if _, err := r.Read(); err != nil {
				t.Fatalf("round %d: answer %d lost after half-close: %v", i, n+1, err)
			}
		}
		c.Close()
	}
}

// TestEnginePastOneMiBOnTheHostPath: on the host-initiated rail (Handle, no
// frames, so no 1 MiB bound) the real policy engine still matches an
// argument that sits behind 1.5 MiB of padding, the upstream never sees the
// call, and the lists hide a blocked tool.
func TestEnginePastOneMiBOnTheHostPath(t *testing.T) {
	h := newHarness(t, Config{})
	h.ep.SetPolicy(&policy.Engine{
		Tools: map[string]policy.Entry{"srv__p": {Decision: policy.Block, Rank: policy.RankUser}},
		Rules: []policy.Rule{{Name: "no-token", Action: policy.Block, Tool: "srv__*", Argument: "auth.token", Matches: regexp.MustCompile(`^sk-`)}},
	})
	secret := "sk-" + strings.Repeat("Z", 40)
	params := `{"name":"srv__echo","arguments":{"pad":"` + strings.Repeat("p", 3<<19) + `","auth":{"token":"` + secret + `"}}}`
	msg, perr, _ := jsonrpc.ParseRequest([]byte(`{"jsonrpc":"2.0","id":"host-1","method":"tools/call","params":` + params + `}`))
	if perr != nil {
		t.Fatal(perr)
	}
	before := len(h.up.calls)
	resp := string(h.ep.Handle(context.Background(), CallMeta{Transport: "host"}, msg))
	if !strings.Contains(resp, `"code":-32600`) || !strings.Contains(resp, "no-token") || strings.Contains(resp, secret) {
		t.Fatalf("1.5 MiB call not blocked by its argument rule: %.300s", resp)
	}
	if len(h.up.calls) != before {
		t.Fatal("the blocked host call reached the upstream")
	}
	rows := h.rows(`SELECT decision, policy_rule, request_preview FROM mcp_calls WHERE request_id = 'host-1'`)
	if len(rows) != 1 || rows[0][0] != "denied" || rows[0][1] != "no-token" || strings.Contains(rows[0][2].(string), secret) {
		t.Fatalf("ledger row %v", rows)
	}
	if r := h.call(7, `{"jsonrpc":"2.0","id":7,"method":"prompts/list"}`); strings.Contains(r.raw, "srv__p") {
		t.Fatalf("a blocked prompt is listed: %s", r.raw)
	}
	if r := h.call(8, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`); !strings.Contains(r.raw, "srv__echo") {
		t.Fatalf("an allowed tool is missing from the list: %s", r.raw)
	}
}
