package api

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// queryField is one parameter a route's query may carry, and how it is
// read.
type queryField struct {
	name  string
	parse func(v string) error
}

// parseQuery reads q by fields: every parameter known and given once,
// each read by its field; the first that is not fails it, by name.
func parseQuery(q url.Values, fields ...queryField) error {
	for k, v := range q {
		if len(v) != 1 {
			return fmt.Errorf("query parameter %s: given %d times, want once", k, len(v))
		}
		i := slices.IndexFunc(fields, func(f queryField) bool { return f.name == k })
		if i < 0 {
			names := make([]string, len(fields))
			for j, f := range fields {
				names[j] = f.name
			}
			return fmt.Errorf("query parameter %s: unknown (want %s)", k, strings.Join(names, ", "))
		}
		if err := fields[i].parse(v[0]); err != nil {
			return err
		}
	}
	return nil
}
