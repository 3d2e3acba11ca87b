package netpolicy

import "fmt"

// Lists is one allow list and one block list, as the builtin HTTP tools
// configure them: block wins over allow, and an empty allow list allows
// every host the block list does not name. It is immutable once compiled
// and safe for concurrent use.
type Lists struct {
	allow    patternSet[Pattern]
	block    patternSet[Pattern]
	hasAllow bool
}

// CompileLists parses both lists; the error names the list and the entry.
func CompileLists(allow, block []string) (*Lists, error) {
	lists := &Lists{}
	for _, entry := range block {
		pattern, err := ParsePattern(entry)
		if err != nil {
			return nil, fmt.Errorf("block list: %w", err)
		}
		lists.block.add(pattern, pattern)
	}
	for _, entry := range allow {
		pattern, err := ParsePattern(entry)
		if err != nil {
			return nil, fmt.Errorf("allow list: %w", err)
		}
		lists.allow.add(pattern, pattern)
		lists.hasAllow = true
	}
	return lists, nil
}

// Check decides one host (normalized here): block wins over allow, and a
// non-empty allow list refuses everything it does not name. Rule is the
// deciding pattern (the most specific one when several match); Source is
// always "" (the lists have no file).
func (l *Lists) Check(host string) Verdict {
	normalized, err := NormalizeHost(host)
	if err != nil {
		return Verdict{Reason: "invalid host: " + err.Error()}
	}
	if pattern, ok := l.block.match(normalized); ok {
		return Verdict{Rule: pattern.String(), Reason: fmt.Sprintf("domain blocked by %q", pattern.String())}
	}
	if !l.hasAllow {
		return Verdict{Allowed: true}
	}
	if pattern, ok := l.allow.match(normalized); ok {
		return Verdict{Allowed: true, Rule: pattern.String()}
	}
	return Verdict{Reason: "domain not in allow list"}
}
