package endpoint

import (
	"os"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/mcpframe"
	"github.com/capsem/capsem/core/policy"
)

// TestRefusedFramesKeepNoSecret attacks the ledger as a hostile guest
// would: it sends a secret that a block rule covers in every kind of frame
// the endpoint refuses before policy runs (a replayed stream id, a request
// without an id, JSON-RPC 1.0, invalid JSON, a call sent as a notification
// and a request on the notification stream) and in a frame named with
// terminal escapes. Every row's preview is redacted, the secret is nowhere
// in the database files, a call on the notification stream is recorded as
// refused, and frame names are sanitised like the metadata name.
func TestRefusedFramesKeepNoSecret(t *testing.T) {
	const secretValue = "sk-attack-0123456789"
	h := newHarness(t, Config{Policy: &policy.Engine{Default: policy.Entry{Decision: policy.Allow},
		Rules: []policy.Rule{{Name: "no-keys", Action: policy.Block, Argument: "token"}}}})
	call := `"method":"tools/call","params":{"name":"srv__echo","arguments":{"text":"x","token":"` + secretValue + `"}}`
	// A good call first, then the same stream id again: a replay.
	if r := h.call(1, `{"jsonrpc":"2.0","id":1,"method":"ping"}`); r.msg == nil {
		t.Fatal("ping")
	}
	for _, f := range []struct {
		stream uint32
		body   string
	}{
		{1, `{"jsonrpc":"2.0","id":2,` + call + `}`}, // replayed stream id
		{3, `{"jsonrpc":"2.0",` + call + `}`},        // no id on a request stream
		{4, `{"jsonrpc":"1.0","id":4,` + call + `}`}, // not JSON-RPC 2.0
		{5, `{"jsonrpc":"2.0","id":5,` + call},       // invalid JSON
	} {
		if r := h.call(f.stream, f.body); !strings.Contains(r.raw, `"error"`) {
			t.Fatalf("stream %d: %s, want an error", f.stream, r.raw)
		}
	}
	h.send(0, `{"jsonrpc":"2.0",`+call+`}`)        // a call sent as a notification
	h.send(0, `{"jsonrpc":"2.0","id":9,`+call+`}`) // a request on the notification stream
	h.send(0, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	evil := mcpframe.Frame{StreamID: 6, Name: "ev\x1b[31mil\u202etxt.exe\u200b", Payload: []byte(`{"jsonrpc":"2.0","id":6,"method":"ping"}`)}
	b, err := mcpframe.Encode(&evil)
	if err != nil {
		t.Fatal(err)
	}
	h.sendRaw(b)
	if r := h.recv(); r.stream != 6 {
		t.Fatalf("the named frame's answer: %+v", r)
	}

	rows := h.rows(`SELECT stream_id, method, decision, request_preview, process_name FROM mcp_calls ORDER BY id`)
	if len(rows) != 9 {
		t.Fatalf("%d rows, want 9: %v", len(rows), rows)
	}
	for _, r := range rows {
		if p, _ := r[3].(string); strings.Contains(p, secretValue) {
			t.Errorf("row %v keeps the secret in its preview", r)
		}
	}
	refused := 0
	for _, r := range rows[5:7] { // the two stream-0 frames that are calls
		if r[2] != "error" {
			t.Errorf("a call on the notification stream recorded as %v: %v", r[2], r)
		} else {
			refused++
		}
	}
	if rows[7][1] != "notifications/initialized" || rows[7][2] != "allowed" {
		t.Errorf("a real notification: %v", rows[7])
	}
	if name := rows[8][4].(string); name != "ev_[31mil_txt.exe_" {
		t.Errorf("frame name recorded as %q", name)
	}
	for _, suffix := range []string{"", "-wal"} {
		data, err := os.ReadFile(h.db + suffix)
		if err != nil {
			continue
		}
		if strings.Contains(string(data), secretValue) {
			t.Errorf("session.db%s holds the secret", suffix)
		}
	}
}
