package endpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/policy"
)

// TestRowsKeepDigestsOfWholeMessages: past the preview's cap a row still
// tells the whole request and response apart (their full length and
// SHA-256); what policy withheld gets a digest keyed by the session's
// secret, so a guessed secret cannot be confirmed by hashing it.
func TestRowsKeepDigestsOfWholeMessages(t *testing.T) {
	h := newHarness(t, Config{Policy: &policy.Engine{Default: policy.Entry{Decision: policy.Allow},
		Rules: []policy.Rule{{Name: "no-keys", Action: policy.Block, Argument: "token"}}}})
	big := strings.Repeat("x", 300<<10) // past the 256 KiB preview
	params := `{"name":"srv__echo","arguments":{"text":"` + big + `"}}`
	r := h.call(1, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":`+params+`}`)
	if !strings.Contains(r.raw, big[:100]) {
		t.Fatalf("the big echo: %.200s", r.raw)
	}
	blockedParams := `{"name":"srv__echo","arguments":{"text":"x","token":"sk-guessable"}}`
	h.call(2, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":`+blockedParams+`}`)

	sha := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	row := h.rows(`SELECT request_digest, response_digest, bytes_sent, bytes_received, length(request_preview) FROM mcp_calls WHERE request_id = '1'`)[0]
	if row[0] != "sha256:"+sha(params) || row[1] != "sha256:"+sha(r.raw) || row[2].(int64) < int64(len(params)) ||
		row[3].(int64) != int64(len(r.raw)) || row[4].(int64) >= int64(len(params)) {
		t.Fatalf("big call's row: digests %v %v, bytes %v %v, preview %v bytes (request %d, response %d bytes)",
			row[0], row[1], row[2], row[3], row[4], len(params), len(r.raw))
	}
	blocked := h.rows(`SELECT request_digest, request_preview FROM mcp_calls WHERE request_id = '2'`)[0]
	if !strings.HasPrefix(blocked[0].(string), "hmac-sha256:") || !strings.Contains(blocked[1].(string), `"hmac_sha256":`) {
		t.Fatalf("blocked call's row: %v", blocked)
	}
	data, err := os.ReadFile(h.db + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), sha(blockedParams)) || strings.Contains(string(data), "sk-guessable") {
		t.Fatal("the ledger confirms the blocked secret (its plain SHA-256 or itself)")
	}
}
