package rawjson

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/rawjson/rawjsontest"
)

func TestFindPath(t *testing.T) {
	doc := `{"a":{"b":[10,{"c":"sk-x"}],"e\u0041":1},"dup":1,"dup":2,"text":"{\"inner\":[true]}","s":"x\"y","n":null}`
	cases := []struct {
		path string
		want string
	}{
		{"a.b.1.c", `"sk-x"`},
		{"a.b.0", `10`},
		{"a.eA", `1`},
		{"dup", `2`},
		{"text.inner.0", `true`},
		{"s", `"x\"y"`},
		{"n", `null`},
		{"a.b.2", ""},
		{"a.b.01", ""},
		{"a.x", ""},
		{"s.x", ""},
	}
	for _, tc := range cases {
		got, ok := FindPath([]byte(doc), strings.Split(tc.path, "."))
		if string(got) != tc.want || ok != (tc.want != "") {
			t.Errorf("FindPath(%q) = %q, %v; want %q", tc.path, got, ok, tc.want)
		}
	}
}

// FuzzFindPath: on valid JSON the scanner agrees with a full decode, both on
// presence and on the value found.
func FuzzFindPath(f *testing.F) {
	f.Add(`{"a":{"b":[1,{"c":"sk-x"}]}}`, "a.b.1.c")
	f.Add(`{"k":1,"k":{"x":2}}`, "k.x")
	f.Add(`{"t":"[1,2]"}`, "t.1")
	f.Add(`[ {"a" : "b\\"} , 2 ]`, "0.a")
	f.Fuzz(func(t *testing.T, doc, dotPath string) {
		var decoded any
		if json.Unmarshal([]byte(doc), &decoded) != nil {
			FindPath([]byte(doc), strings.Split(dotPath, ".")) // must not panic
			return
		}
		path := strings.Split(dotPath, ".")
		want, wantOK := rawjsontest.Lookup(decoded, path)
		raw, ok := FindPath([]byte(doc), path)
		if ok != wantOK {
			t.Fatalf("FindPath(%s, %q) found=%v, decode found=%v", doc, dotPath, ok, wantOK)
		}
		if ok {
			var got any
			if err := json.Unmarshal(raw, &got); err != nil || !reflect.DeepEqual(got, want) {
				t.Fatalf("FindPath(%s, %q) = %s, decode = %#v", doc, dotPath, raw, want)
			}
		}
	})
}

func TestMember(t *testing.T) {
	doc := ` { "a" : 1 , "m" : {"x":[1]} , "a" : "last" } `
	for _, tc := range []struct {
		key, want string
	}{
		{"a", `"last"`},
		{"m", `{"x":[1]}`},
		{"x", ""},
	} {
		v, at, ok := Member([]byte(doc), tc.key)
		if string(v) != tc.want || ok != (tc.want != "") {
			t.Errorf("Member(%q) = %q, %v; want %q", tc.key, v, ok, tc.want)
		}
		if ok && doc[at:at+len(v)] != tc.want {
			t.Errorf("Member(%q) offset %d points at %q", tc.key, at, doc[at:])
		}
	}
	for _, notObject := range []string{`[1]`, `"s"`, ``, `{}`, ` {  } `} {
		if _, _, ok := Member([]byte(notObject), "a"); ok {
			t.Errorf("Member(%q) found a member", notObject)
		}
	}
}

func TestEachMember(t *testing.T) {
	type member struct{ key, value string }
	for _, tc := range []struct {
		doc  string
		want []member
		ok   bool
	}{
		{` { "a" : 1 , "m" : {"x":["}",1]} , "a" : "last" } `, []member{{`"a"`, `1`}, {`"m"`, `{"x":["}",1]}`}, {`"a"`, `"last"`}}, true},
		{`{"k\"ey":"v\\","e\u0061":null}`, []member{{`"k\"ey"`, `"v\\"`}, {`"e\u0061"`, `null`}}, true},
		{`{}`, nil, true},
		{` {  } `, nil, true},
		{`[1]`, nil, false},
		{`"s"`, nil, false},
		{``, nil, false},
		{`{"a":1,`, []member{{`"a"`, `1`}}, false},
		{`{"a" 1}`, nil, false},
		{`{"a":1 "b":2}`, []member{{`"a"`, `1`}}, false},
	} {
		var got []member
		ok := EachMember([]byte(tc.doc), func(k, v []byte) { got = append(got, member{string(k), string(v)}) })
		if ok != tc.ok || len(got) != len(tc.want) {
			t.Errorf("EachMember(%s) = %v, %v; want %v, %v", tc.doc, got, ok, tc.want, tc.ok)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("EachMember(%s) member %d = %v, want %v", tc.doc, i, got[i], tc.want[i])
			}
		}
	}
	for _, tc := range []struct {
		quoted, key string
		want        bool
	}{
		{`"id"`, "id", true},
		{`"ID"`, "id", false},
		{`"i\u0064"`, "id", true},
		{`"i\u0064x"`, "id", false},
		// Bytes that are not UTF-8 read as U+FFFD, as a decoder reads them.
		{"\"a\xffb\"", "a\xffb", false},
		{"\"a\xffb\"", "a\ufffdb", true},
	} {
		if got := KeyIs([]byte(tc.quoted), tc.key); got != tc.want {
			t.Errorf("KeyIs(%s, %q) = %v", tc.quoted, tc.key, got)
		}
	}
}

func TestString(t *testing.T) {
	for _, tc := range []struct {
		raw, want string
		ok        bool
	}{
		{`"srv__echo"`, "srv__echo", true},
		{`""`, "", true},
		{`"a\nb"`, "a\nb", true},         // an escape goes through the decoder
		{`"caf\u00e9"`, "café", true},    // so does a \u escape
		{`"café"`, "café", true},         // and raw UTF-8
		{"\"a\xffb\"", "a\ufffdb", true}, // invalid UTF-8 becomes U+FFFD, as encoding/json does
		{`"a\"b"`, `a"b`, true},
		{`null`, "", false},
		{`7`, "", false},
		{`{"a":"b"}`, "", false},
		{`"`, "", false},
		{``, "", false},
	} {
		got, ok := String([]byte(tc.raw))
		if got != tc.want || ok != tc.ok {
			t.Errorf("String(%q) = %q, %v; want %q, %v", tc.raw, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzString checks String against encoding/json on any JSON value: the
// same text for a string, and ok false for anything else.
func FuzzString(f *testing.F) {
	for _, s := range []string{`"a"`, `"\u00e9\n"`, "\"\xff\"", `"\ud800"`, `null`, `1`, `[]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !json.Valid([]byte(raw)) || strings.TrimSpace(raw) != raw {
			return
		}
		got, ok := String([]byte(raw))
		var want string
		err := json.Unmarshal([]byte(raw), &want)
		isString := raw[0] == '"'
		if ok != isString || (isString && (err != nil || got != want)) {
			t.Fatalf("String(%q) = %q, %v; encoding/json: %q, %v", raw, got, ok, want, err)
		}
	})
}

// TestFindPathKeyNotUTF8: a policy path names what the server will decode,
// so an argument key with bytes that are not UTF-8 is found by its U+FFFD
// reading, and not by its raw bytes.
func TestFindPathKeyNotUTF8(t *testing.T) {
	args := []byte("{\"token\xff\":\"sk-secret\"}")
	if v, ok := FindPath(args, []string{"token\ufffd"}); !ok || string(v) != `"sk-secret"` {
		t.Fatalf("FindPath by the decoded key = %q, %v", v, ok)
	}
	if _, ok := FindPath(args, []string{"token\xff"}); ok {
		t.Fatal("FindPath found a key by bytes no decoder reads that way")
	}
}
