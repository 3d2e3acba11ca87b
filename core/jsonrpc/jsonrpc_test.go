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
		{"form feed is not JSON space", "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\f", CodeParseError, ``, "", false},
		{"CR LF around", "\r\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\r\n", 0, `1`, "ping", false},
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
		{"error member of the wrong type", `{"jsonrpc":"2.0","id":5,"method":"ping","error":5}`, CodeInvalidRequest, `5`, "", false},
		{"error member not an error", `{"jsonrpc":"2.0","id":5,"method":"ping","error":{"code":"x"}}`, CodeInvalidRequest, `5`, "", false},
		{"null error member", `{"jsonrpc":"2.0","id":5,"method":"ping","error":null}`, 0, `5`, "ping", false},
		// Member names match exactly, as in the MCP SDKs; the last of a repeat counts.
		{"version name cased", `{"JSONRPC":"2.0","id":6,"method":"ping"}`, CodeInvalidRequest, `6`, "", false},
		{"method name cased", `{"jsonrpc":"2.0","id":6,"Method":"ping"}`, CodeInvalidRequest, `6`, "", false},
		{"cased duplicate ignored", `{"jsonrpc":"2.0","id":6,"method":"ping","Method":"tools/list"}`, 0, `6`, "ping", false},
		{"cased id is no id", `{"jsonrpc":"2.0","ID":6,"method":"ping"}`, 0, ``, "ping", true},
		{"last method counts", `{"jsonrpc":"2.0","id":6,"method":"tools/list","method":"ping"}`, 0, `6`, "ping", false},
		{"escaped names", `{"json\u0072pc":"2\u002e0","\u0069d":7,"m\u0065thod":"p\u0069ng"}`, 0, `7`, "ping", false},
		{"version not a string", `{"jsonrpc":2.0,"id":8,"method":"ping"}`, CodeInvalidRequest, `8`, "", false},
		{"string id normalized", `{"jsonrpc":"2.0","id":"\u0061b","method":"ping"}`, 0, `"ab"`, "ping", false},
		{"space everywhere", " \n{ \"jsonrpc\" : \"2.0\" , \"id\" : 9 , \"method\" : \"ping\" , \"params\" : { } }\n", 0, `9`, "ping", false},
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

// TestParseRequestParams: params come back as their text, whatever the
// space around them; the last of a repeated params counts; null is none.
func TestParseRequestParams(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{" \n{ \"jsonrpc\" : \"2.0\" , \"id\" : 9 , \"method\" : \"ping\" , \"params\" : { } }\n", `{ }`},
		{`{"jsonrpc":"2.0","id":9,"method":"ping","params":{"a":1},"params":[2]}`, `[2]`},
		{`{"jsonrpc":"2.0","id":9,"method":"ping","Params":{"a":1}}`, ``},
		{`{"jsonrpc":"2.0","id":9,"method":"ping","params":null}`, ``},
		{`{"jsonrpc":"2.0","id":9,"method":"ping","params":{"s":"}\"{"}}`, `{"s":"}\"{"}`},
	} {
		msg, perr, _ := ParseRequest([]byte(tc.in))
		if perr != nil || string(msg.Params) != tc.want {
			t.Errorf("ParseRequest(%q): params %q, %+v; want %q", tc.in, msg.Params, perr, tc.want)
		}
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

// FuzzParseRequestMatchesExactDecode checks ParseRequest against a decode of
// the whole message into a map (exact member names, the last repeat wins):
// the same verdict, and on success the same id, method and params.
func FuzzParseRequestMatchesExactDecode(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__b","arguments":{}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"JSONRPC":"2.0","id":1,"method":"x"}`, `{"jsonrpc":"2.0","id":"\u0061","Method":"x","method":"y"}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","params":null}`, `{"jsonrpc":"2.0","id":[],"method":"x"}`,
		`{"jsonrpc":"2.0","id":1,"method":"x","error":{"code":1,"message":"m"}}`, `{"jsonrpc":"2.0","id":1,"method":"x","Error":7}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var members map[string]json.RawMessage
		if json.Unmarshal(data, &members) != nil || members == nil {
			return // not an object: the other fuzz target covers it
		}
		msg, perr, _ := ParseRequest(data)
		wantID, idErr := normalizeID(members["id"])
		var version, method string
		versionOK := json.Unmarshal(members["jsonrpc"], &version) == nil && version == "2.0" && members["jsonrpc"][0] == '"'
		methodOK := len(members["method"]) > 0 && members["method"][0] == '"' && json.Unmarshal(members["method"], &method) == nil && method != ""
		params := members["params"]
		if isNull(params) {
			params = nil
		}
		paramsOK := params == nil || params[0] == '{' || params[0] == '['
		var e Error
		errorOK := isNull(members["error"]) || json.Unmarshal(members["error"], &e) == nil
		if idErr != nil || !versionOK || !methodOK || !paramsOK || !errorOK {
			if perr == nil || perr.Code != CodeInvalidRequest {
				t.Fatalf("%s: got %+v, %+v; want an invalid-request error", data, msg, perr)
			}
			return
		}
		if perr != nil {
			t.Fatalf("%s: unexpected error %+v", data, perr)
		}
		if string(msg.ID) != string(wantID) || msg.Method != method || string(msg.Params) != string(params) {
			t.Fatalf("%s: got id %s method %q params %s; want %s %q %s", data, msg.ID, msg.Method, msg.Params, wantID, method, params)
		}
	})
}
