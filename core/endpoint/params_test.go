package endpoint

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestStringParam(t *testing.T) {
	cases := []struct {
		params, want, errHas string
	}{
		{`{"name":"srv__echo","arguments":{}}`, "srv__echo", ""},
		{`{"arguments":{"name":"inner"},"name":"srv__echo"}`, "srv__echo", ""},
		{`{"name":"first__a","name":"last__b"}`, "last__b", ""},      // the last of a repeated key counts
		{`{"Name":"srv__echo"}`, "", ""},                             // keys match exactly, as in the MCP SDKs
		{`{"NAME":"srv__evil","name":"srv__echo"}`, "srv__echo", ""}, // a differently cased key is another key
		{`{"name":null}`, "", ""},                                    // null is absent
		{`{}`, "", ""},                                               // absent
		{`{ "name" : "srv__echo" }`, "srv__echo", ""},                // space around
		{`{"name":"srv\u005f_echo"}`, "srv__echo", ""},               // an escape is decoded
		{`{"n\u0061me":"srv__echo"}`, "srv__echo", ""},               // in the key too
		{`{"name":"caf\u00e9__x"}`, "café__x", ""},                   // non-ASCII through the decoder
		{`{"name":"café__x"}`, "café__x", ""},                        // raw UTF-8
		{`{"name":"a\"b__c"}`, `a"b__c`, ""},                         // escaped quote
		{`{"name":1}`, "", "name must be a string"},                  // not a string
		{`{"name":["srv__echo"]}`, "", "name must be a string"},      // not a string
		{`{"name":{"x":"srv__echo"}}`, "", "name must be a string"},  // not a string
	}
	for _, tc := range cases {
		if !json.Valid([]byte(tc.params)) {
			t.Fatalf("test input %s is not JSON", tc.params)
		}
		got, perr := stringParam(json.RawMessage(tc.params), "name")
		if tc.errHas != "" {
			if perr == nil || !strings.Contains(perr.Message, tc.errHas) {
				t.Errorf("%s: error %v, want one containing %q", tc.params, perr, tc.errHas)
			}
			continue
		}
		if perr != nil || got != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.params, got, perr, tc.want)
		}
	}
}

// FuzzStringParam checks stringParam against a decode of the whole object
// into a map (exact keys, the last repeat wins, as in the MCP SDKs).
func FuzzStringParam(f *testing.F) {
	for _, s := range []string{`{"name":"srv__echo"}`, `{"name":"a","name":"b"}`, `{"Name":"x"}`, `{"name":"\u00e9\n"}`,
		`{"name":null}`, `{"name":1}`, `{"n\u0061me":"x"}`, `{"name":"\ud800"}`, "{\"name\":\"\xff\"}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, params string) {
		if !json.Valid([]byte(params)) || !strings.HasPrefix(params, "{") {
			return
		}
		got, perr := stringParam(json.RawMessage(params), "name")
		var members map[string]json.RawMessage
		if err := json.Unmarshal([]byte(params), &members); err != nil {
			t.Fatalf("reference decode of %q: %v", params, err)
		}
		raw, present := members["name"]
		if !present || string(raw) == "null" {
			if perr != nil || got != "" {
				t.Fatalf("%q: got %q, %v; want absent", params, got, perr)
			}
			return
		}
		var want string
		if err := json.Unmarshal(raw, &want); err != nil {
			if perr == nil {
				t.Fatalf("%q: got %q, want an error (%v)", params, got, err)
			}
			return
		}
		if perr != nil || got != want {
			t.Fatalf("%q: got %q, %v; want %q", params, got, perr, want)
		}
	})
}
