// Package rawjsontest holds the test oracle for package rawjson, shared by
// its tests and by those of the policy engine that relies on it.
package rawjsontest

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Lookup is the oracle for rawjson.FindPath: the same walk over a fully
// decoded document (encoding/json's any), for tests of FindPath and of
// what relies on it.
func Lookup(v any, path []string) (any, bool) {
	for _, part := range path {
		if s, ok := v.(string); ok {
			t := strings.TrimSpace(s)
			if t == "" || (t[0] != '{' && t[0] != '[') || json.Unmarshal([]byte(t), &v) != nil {
				return nil, false
			}
		}
		switch cur := v.(type) {
		case map[string]any:
			next, ok := cur[part]
			if !ok {
				return nil, false
			}
			v = next
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(cur) || (len(part) > 1 && part[0] == '0') || part[0] == '+' {
				return nil, false
			}
			v = cur[i]
		default:
			return nil, false
		}
	}
	return v, true
}
