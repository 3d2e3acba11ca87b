package policy

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// findPath returns the raw JSON value at a dot path (object keys and array
// indexes) in doc without decoding the rest: values off the path are only
// skipped, so a rule on a 1 MiB argument object costs a scan, not a decode.
// Where a key repeats, the last one counts, as in JSON.parse and
// encoding/json (the server must not see a different value than the rule).
// A string holding a JSON object or array is entered when the path goes on.
// doc is expected to be valid JSON (the gateway parsed it already); on
// malformed input the path is simply not found.
func findPath(doc []byte, path []string) ([]byte, bool) {
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
			cur, ok = memberOf(cur, part)
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

// memberOf returns the value of the last member named key in an object.
func memberOf(obj []byte, key string) ([]byte, bool) {
	var found []byte
	i := skipWS(obj, 1)
	if i < len(obj) && obj[i] == '}' {
		return nil, false
	}
	for i < len(obj) {
		if obj[i] != '"' {
			return nil, false
		}
		kEnd := skipString(obj, i)
		if kEnd < 0 {
			return nil, false
		}
		match := keyEquals(obj[i:kEnd], key)
		i = skipWS(obj, kEnd)
		if i >= len(obj) || obj[i] != ':' {
			return nil, false
		}
		vStart := skipWS(obj, i+1)
		vEnd := skipValue(obj, vStart)
		if vEnd < 0 {
			return nil, false
		}
		if match {
			found = obj[vStart:vEnd]
		}
		i = skipWS(obj, vEnd)
		if i >= len(obj) {
			return nil, false
		}
		if obj[i] == '}' {
			return found, found != nil
		}
		if obj[i] != ',' {
			return nil, false
		}
		i = skipWS(obj, i+1)
	}
	return nil, false
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
	if bytes.IndexByte(inner, '\\') < 0 {
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

func trimSpace(b []byte) []byte {
	b = b[skipWS(b, 0):]
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r' || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}
