package endpoint

import (
	"encoding/json"
	"reflect"
	"testing"
)

// decorateOracle is what decorateStateless must produce, computed by a full
// decode: every member of the result (the last of a repeated key), resultType
// "complete" unless present, and _meta with the gateway's identity added to
// the keys it had (an _meta that is not an object is replaced).
func decorateOracle(t *testing.T, e *Endpoint, result []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(result, &m); err != nil {
		t.Fatalf("oracle: %v", err)
	}
	if _, ok := m["resultType"]; !ok {
		m["resultType"] = "complete"
	}
	meta, _ := m["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	info, _ := json.Marshal(e.serverInfo())
	var infoAny any
	json.Unmarshal(info, &infoAny)
	meta[metaServerInfo] = infoAny
	m["_meta"] = meta
	return m
}

func checkDecorated(t *testing.T, e *Endpoint, in []byte) {
	t.Helper()
	out := e.decorateStateless(in)
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decorated %s into invalid JSON %s: %v", in, out, err)
	}
	if want := decorateOracle(t, e, in); !reflect.DeepEqual(got, want) {
		t.Fatalf("decorated %s\n got %s\nwant %v", in, out, want)
	}
}

func TestDecorateStateless(t *testing.T) {
	e := New(Config{Version: "test"})
	for _, in := range []string{
		`{}`,
		` { } `,
		`{"content":[{"type":"text","text":"hi"}]}`,
		`{"content":[],"resultType":"incomplete"}`,
		`{"_meta":{"progressToken":7},"content":[]}`,
		`{"_meta":null,"x":1}`,
		`{"_meta":"not an object","x":1}`,
		`{"_meta":{"a":1},"_meta":{"b":2}}`,
		`{"resultType":"x","resultType":"y"}`,
		`{"text":"{\"_meta\":1}","k\"ey":"}"}`,
	} {
		checkDecorated(t, e, []byte(in))
	}
	// Not a JSON object: unchanged.
	// (A form feed is not JSON white space, so "{}\f" is not JSON.)
	for _, in := range []string{`[1]`, `"s"`, `{"a":`, ``, `null`, "{}\f", "\u00a0{}"} {
		if out := e.decorateStateless([]byte(in)); string(out) != in {
			t.Errorf("decorateStateless(%q) = %q, want it unchanged", in, out)
		}
	}
}

func TestStatelessRequest(t *testing.T) {
	for _, tc := range []struct {
		params string
		want   bool
	}{
		{`{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}`, true},
		{`{"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01"},"arguments":{"big":"…"}}`, true},
		{`{"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-11-25"}}`, false},
		{`{"_meta":{"io.modelcontextprotocol/protocolVersion":20260728}}`, false},
		{`{"arguments":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}`, false},
		{`{"_meta":"{\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}"}`, false},
		{`{"name":"x"}`, false},
		{``, false},
	} {
		if got := statelessRequest(json.RawMessage(tc.params)); got != tc.want {
			t.Errorf("statelessRequest(%s) = %v, want %v", tc.params, got, tc.want)
		}
	}
}

// FuzzDecorateStateless: on any JSON object the splice agrees with a full
// decode; anything else comes back unchanged.
func FuzzDecorateStateless(f *testing.F) {
	f.Add(`{"content":[{"type":"text","text":"hi"}]}`)
	f.Add(`{"_meta":{"a":1},"_meta":{"b":2},"resultType":"x"}`)
	f.Add(` {"_meta" : [1] } `)
	f.Add(`[]`)
	e := New(Config{Version: "fuzz"})
	f.Fuzz(func(t *testing.T, in string) {
		var m map[string]any
		if json.Unmarshal([]byte(in), &m) != nil || m == nil {
			if out := e.decorateStateless([]byte(in)); string(out) != in {
				t.Fatalf("decorateStateless(%q) changed a non-object into %q", in, out)
			}
			return
		}
		checkDecorated(t, e, []byte(in))
	})
}
