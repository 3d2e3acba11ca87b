// Package rawjson finds values in JSON text without decoding it: values off
// the path are only skipped, so looking into a 1 MiB document costs a scan,
// not a decode. Where a key repeats, the last one counts, as in JSON.parse
// and encoding/json. The input is expected to be valid JSON (its callers
// parsed it already); on malformed input a value is simply not found.
package rawjson

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// FindPath returns the raw JSON value at a path of object keys and array
// indexes in doc. A string holding a JSON object or array is entered when
// the path goes on (tools often return JSON as text).
func FindPath(doc []byte, path []string) ([]byte, bool) {
	cur := trimSpace(doc)
	for _, part := range path {
		if len(cur) == 0 {
			return nil, false
		}
		if cur[0] == '"' {
			var s string
			if json.Unmarshal(cur, &s) != nil {
				return nil, false
			}
			cur = trimSpace([]byte(s))
			if len(cur) == 0 || (cur[0] != '{' && cur[0] != '[') || !json.Valid(cur) {
				return nil, false
			}
		}
		var ok bool
		switch cur[0] {
		case '{':
			cur, _, ok = Member(cur, part)
		case '[':
			cur, ok = elementOf(cur, part)
		default:
			return nil, false
		}
		if !ok {
			return nil, false
		}
	}
	return cur, len(cur) > 0
}

// Member returns the value of the last member named key in obj, a JSON
// object (leading space allowed), and the offset in obj where it starts.
func Member(obj []byte, key string) (value []byte, start int, ok bool) {
	complete := EachMember(obj, func(k, v []byte) {
		if keyEquals(k, key) {
			// v is obj[start:end], so its capacity tells where it starts.
			value, start = v, cap(obj)-cap(v)
		}
	})
	if !complete || value == nil {
		return nil, 0, false
	}
	return value, start, true
}

// EachMember calls fn with each member of obj, a JSON object (leading space
// allowed), in order: its quoted key as it appears in the text and its raw
// value. A repeated key is passed each time. It reports false, having
// called fn for the members before the fault, when obj is not an object
// or is malformed.
func EachMember(obj []byte, fn func(quotedKey, value []byte)) bool {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipWS(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return true
	}
	for i < len(obj) {
		if obj[i] != '"' {
			return false
		}
		kEnd := skipString(obj, i)
		if kEnd < 0 {
			return false
		}
		key := obj[i:kEnd]
		i = skipWS(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		vStart := skipWS(obj, i+1)
		vEnd := skipValue(obj, vStart)
		if vEnd < 0 {
			return false
		}
		fn(key, obj[vStart:vEnd])
		i = skipWS(obj, vEnd)
		if i >= len(obj) {
			return false
		}
		if obj[i] == '}' {
			return true
		}
		if obj[i] != ',' {
			return false
		}
		i = skipWS(obj, i+1)
	}
	return false
}

// KeyIs reports whether a quoted JSON key (as EachMember passes it) is key,
// unescaping only when the key has escapes.
func KeyIs(quotedKey []byte, key string) bool { return keyEquals(quotedKey, key) }

// String decodes raw, one JSON value, when it is a string; ok is false for
// any other value. A string of printable ASCII without escapes, the common
// case for names and versions, is its own text and is not run through the
// decoder (which also replaces invalid UTF-8).
func String(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' {
		return "", false
	}
	if inner := raw[1 : len(raw)-1]; isPlainASCII(inner) {
		return string(inner), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func isPlainASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e || c == '\\' || c == '"' {
			return false
		}
	}
	return true
}

// elementOf returns the element at a decimal index of an array.
func elementOf(arr []byte, index string) ([]byte, bool) {
	n, err := strconv.Atoi(index)
	if err != nil || n < 0 || (len(index) > 1 && index[0] == '0') || index[0] == '+' {
		return nil, false
	}
	i := skipWS(arr, 1)
	if i < len(arr) && arr[i] == ']' {
		return nil, false
	}
	for k := 0; i < len(arr); k++ {
		end := skipValue(arr, i)
		if end < 0 {
			return nil, false
		}
		if k == n {
			return arr[i:end], true
		}
		i = skipWS(arr, end)
		if i >= len(arr) || arr[i] != ',' {
			return nil, false
		}
		i = skipWS(arr, i+1)
	}
	return nil, false
}

// keyEquals compares a quoted JSON key with a path segment, unescaping only
// when the key has escapes.
func keyEquals(quoted []byte, key string) bool {
	inner := quoted[1 : len(quoted)-1]
	// Without escapes a key is its bytes, unless they are not UTF-8: a
	// decoder (encoding/json, the server that gets the arguments) reads
	// those as U+FFFD, so they must be compared the same way.
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner) == key
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == key
}

// skipValue returns the index just past the value starting at i, or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		// Containers: track depth, jumping over strings whole.
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				if i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	default:
		start := i
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				if i == start {
					return -1
				}
				return i
			}
			i++
		}
		if i == start {
			return -1
		}
		return i
	}
}

// skipString returns the index just past the string starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		end := j + k
		// The quote is escaped when an odd run of backslashes precedes it.
		bs := 0
		for p := end - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return end + 1
		}
		j = end + 1
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// TrimSpace removes the white space JSON allows around a value (space, tab,
// CR, LF) and nothing else: bytes.TrimSpace would also take a form feed or
// U+0085 and so make text that is not JSON look like it.
func TrimSpace(b []byte) []byte { return trimSpace(b) }

func trimSpace(b []byte) []byte {
	b = b[skipWS(b, 0):]
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r' || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}

// FindPathFold is FindPath with object keys compared without regard to
// case (strings.EqualFold, the folding encoding/json uses to match a key
// to a field): every value the path reaches by any matching key is passed
// to fn, until fn returns true, which FindPathFold then returns. Each part
// of the document is visited at most once per path segment, so the work is
// linear in the document's size whatever its repeated keys.
func FindPathFold(doc []byte, path []string, fn func(value []byte) bool) bool {
	cur := trimSpace(doc)
	if len(path) == 0 {
		return len(cur) > 0 && fn(cur)
	}
	if len(cur) == 0 {
		return false
	}
	if cur[0] == '"' {
		var s string
		if json.Unmarshal(cur, &s) != nil {
			return false
		}
		cur = trimSpace([]byte(s))
		if len(cur) == 0 || (cur[0] != '{' && cur[0] != '[') || !json.Valid(cur) {
			return false
		}
	}
	part, rest := path[0], path[1:]
	switch cur[0] {
	case '{':
		var matches [][]byte
		if !EachMember(cur, func(quotedKey, value []byte) {
			if keyFolds(quotedKey, part) {
				matches = append(matches, value)
			}
		}) {
			return false // not an object after all
		}
		for _, v := range matches {
			if FindPathFold(v, rest, fn) {
				return true
			}
		}
		return false
	case '[':
		v, ok := elementOf(cur, part)
		return ok && FindPathFold(v, rest, fn)
	}
	return false
}

// keyFolds compares a quoted JSON key with a path segment without regard
// to case.
func keyFolds(quoted []byte, key string) bool {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return strings.EqualFold(string(inner), key)
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && strings.EqualFold(s, key)
}

// EachString reports whether fn returns true for any string in a JSON
// value (keys excepted). It decodes the value whole: it is for small
// documents (an error's data), not for results.
func EachString(doc []byte, fn func(string) bool) bool {
	var v any
	if json.Unmarshal(doc, &v) != nil {
		return false
	}
	return eachString(v, fn)
}

func eachString(v any, fn func(string) bool) bool {
	switch t := v.(type) {
	case string:
		return fn(t)
	case []any:
		for _, e := range t {
			if eachString(e, fn) {
				return true
			}
		}
	case map[string]any:
		for _, e := range t {
			if eachString(e, fn) {
				return true
			}
		}
	}
	return false
}
