package jsonrpc

import (
	"encoding/json"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		name     string
		in       string
		code     int64  // 0: success
		id       string // expected raw id ("" = nil)
		method   string
		notified bool
	}{
		{"numeric id", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, 0, `1`, "tools/list", false},
		{"string id", `{"jsonrpc":"2.0","id":"abc","method":"ping"}`, 0, `"abc"`, "ping", false},
		{"fractional id kept", `{"jsonrpc":"2.0","id":1.5,"method":"ping"}`, 0, `1.5`, "ping", false},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, 0, ``, "notifications/initialized", true},
		{"null id is absent", `{"jsonrpc":"2.0","id":null,"method":"ping"}`, 0, ``, "ping", true},
		{"params object", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"a__b"}}`, 0, `2`, "tools/call", false},
		{"invalid json", `{"jsonrpc":`, CodeParseError, ``, "", false},
		{"empty", `   `, CodeParseError, ``, "", false},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, CodeInvalidRequest, ``, "", false},
		{"scalar", `42`, CodeInvalidRequest, ``, "", false},
		{"wrong version", `{"jsonrpc":"1.0","id":3,"method":"ping"}`, CodeInvalidRequest, `3`, "", false},
		{"missing version", `{"id":3,"method":"ping"}`, CodeInvalidRequest, `3`, "", false},
		{"missing method", `{"jsonrpc":"2.0","id":4}`, CodeInvalidRequest, `4`, "", false},
		{"empty method", `{"jsonrpc":"2.0","id":4,"method":""}`, CodeInvalidRequest, `4`, "", false},
		{"method not string", `{"jsonrpc":"2.0","id":4,"method":7}`, CodeInvalidRequest, `4`, "", false},
		{"object id", `{"jsonrpc":"2.0","id":{},"method":"ping"}`, CodeInvalidRequest, ``, "", false},
		{"bool id", `{"jsonrpc":"2.0","id":true,"method":"ping"}`, CodeInvalidRequest, ``, "", false},
		{"scalar params", `{"jsonrpc":"2.0","id":5,"method":"ping","params":3}`, CodeInvalidRequest, `5`, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg, perr, id := ParseRequest([]byte(tc.in))
			if tc.code != 0 {
				if perr == nil || perr.Code != tc.code {
					t.Fatalf("want code %d, got %+v", tc.code, perr)
				}
				if string(id) != tc.id {
					t.Fatalf("error id %q want %q", id, tc.id)
				}
				return
			}
			if perr != nil {
				t.Fatalf("unexpected error %+v", perr)
			}
			if string(msg.ID) != tc.id || msg.Method != tc.method || msg.IsNotification() != tc.notified {
				t.Fatalf("got %+v", msg)
			}
		})
	}
}

func TestIDText(t *testing.T) {
	for in, want := range map[string]string{`1`: "1", `"x y"`: "x y", ``: "", `-3.5`: "-3.5", `"\u00e9"`: "é"} {
		if got := IDText(json.RawMessage(in)); got != want {
			t.Errorf("IDText(%s) = %q want %q", in, got, want)
		}
	}
}

func TestResponsesAreValidJSON(t *testing.T) {
	for _, b := range [][]byte{
		ResultResponse(json.RawMessage(`7`), json.RawMessage(`{"ok":true}`)),
		ResultResponse(nil, nil),
		ErrorResponse(json.RawMessage(`"s"`), NewError(CodeMethodNotFound, "method not found: %s", `x"y`)),
		ErrorResponse(nil, NewError(CodeParseError, "parse error")),
	} {
		m, err := ParseResponse(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if m.Error == nil && m.Result == nil {
			t.Fatalf("%s: empty", b)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__b","arguments":{}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`[1,2]`, `{"id":"x"}`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, perr, id := ParseRequest(data)
		if (msg == nil) == (perr == nil) {
			t.Fatalf("exactly one of message and error: %v %v", msg, perr)
		}
		var resp []byte
		if perr != nil {
			resp = ErrorResponse(id, perr)
		} else {
			resp = ResultResponse(msg.ID, json.RawMessage(`{}`))
		}
		if !json.Valid(resp) {
			t.Fatalf("response is not valid JSON: %s", resp)
		}
	})
}

// FuzzParseResponse reads what upstream servers send back: a parsed
// response has a version, an id that is a number or string (or none), and a
// result or an error; nothing panics.
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":"a","error":{"code":-32601,"message":"no"}}`,
		`{"jsonrpc":"2.0","id":null,"result":null}`,
		`{"jsonrpc":"1.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","id":{},"result":1}`, `[]`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msg, err := ParseResponse(data)
		if err != nil {
			if msg != nil {
				t.Fatal("a message and an error")
			}
			return
		}
		if msg.Result == nil && msg.Error == nil {
			t.Fatalf("parsed %s with neither result nor error", data)
		}
		if msg.ID != nil {
			var id any
			if json.Unmarshal(msg.ID, &id) != nil {
				t.Fatalf("id %s is not JSON", msg.ID)
			}
			switch id.(type) {
			case float64, string:
			default:
				t.Fatalf("id %s is neither a number nor a string", msg.ID)
			}
		}
	})
}
