package rawjson

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func foldValues(doc string, path string) []string {
	var out []string
	FindPathFold([]byte(doc), strings.Split(path, "."), func(v []byte) bool {
		out = append(out, string(v))
		return false
	})
	return out
}

func TestFindPathFold(t *testing.T) {
	for _, c := range []struct {
		doc, path string
		want      []string
	}{
		{`{"text":1}`, "text", []string{"1"}},
		{`{"TEXT":1,"Text":2,"text":3,"other":4}`, "text", []string{"1", "2", "3"}},
		{`{"A":{"b":1},"a":{"B":2}}`, "a.b", []string{"1", "2"}},
		{`{"a":[{"B":1},{"b":2}]}`, "a.1.b", []string{"2"}},
		{`{"a":"{\"B\":7}"}`, "a.b", []string{"7"}}, // into JSON held as text, as FindPath
		{`{"k\u0041":1}`, "ka", []string{"1"}},
		{`{"\u212a":1}`, "k", []string{"1"}}, // KELVIN SIGN folds to k
		{`{"a":1}`, "b", nil},
		{`[1,2]`, "a", nil},
		{`{"a":1`, "a", nil},
	} {
		if got := foldValues(c.doc, c.path); !reflect.DeepEqual(got, c.want) {
			t.Errorf("FindPathFold(%s, %s) = %q, want %q", c.doc, c.path, got, c.want)
		}
	}
	// It stops at the first value fn accepts.
	calls := 0
	if !FindPathFold([]byte(`{"x":1,"X":2}`), []string{"x"}, func([]byte) bool { calls++; return true }) || calls != 1 {
		t.Errorf("calls %d", calls)
	}
}

// FuzzFindPathFold: whatever a decoder finds at the path with keys matched
// the way encoding/json matches them (exact, else without case), the fold
// finds too: a block rule sees at least what the server will.
func FuzzFindPathFold(f *testing.F) {
	f.Add([]byte(`{"Text":"x","a":{"B":[1,{"c":2}]}}`), "text")
	f.Add([]byte(`{"a":{"B":[1,{"c":2}]}}`), "A.b.1.C")
	f.Fuzz(func(t *testing.T, doc []byte, path string) {
		if path == "" || strings.Contains("."+path+".", "..") {
			return
		}
		parts := strings.Split(path, ".")
		// A struct-like decode: each level takes the member encoding/json
		// would bind to a field named part.
		var v any
		if json.Unmarshal(doc, &v) != nil {
			return
		}
		cur := v
		for _, p := range parts {
			m, ok := cur.(map[string]any)
			if !ok {
				return // arrays and JSON in strings: FindPath's own tests
			}
			next, found := m[p]
			if !found {
				for k, val := range m {
					if strings.EqualFold(k, p) {
						next, found = val, true
						break
					}
				}
			}
			if !found {
				return
			}
			cur = next
		}
		want, _ := json.Marshal(cur)
		seen := false
		FindPathFold(doc, parts, func(raw []byte) bool {
			var got any
			if json.Unmarshal(raw, &got) == nil {
				b, _ := json.Marshal(got)
				seen = seen || string(b) == string(want)
			}
			return false
		})
		if !seen {
			t.Fatalf("the decoder finds %s at %q in %s; the fold does not", want, path, doc)
		}
	})
}
