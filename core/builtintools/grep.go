package builtintools

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Bounds on grep_http's inputs and output.
const (
	maxPatternBytes     = 4096
	defaultContextLines = 3
	maxContextLines     = 50
	defaultMaxMatches   = 50
	maxMaxMatches       = 1000
	// maxShownLineBytes clips very long lines (minified pages put a whole
	// document on one line) to a window around the match.
	maxShownLineBytes = 1000
)

// compileGrepPattern compiles a case-insensitive Go regexp (RE2 syntax:
// linear time, no backreferences or lookaround).
func compileGrepPattern(pattern string) (*regexp.Regexp, error) {
	if pattern == "" {
		return nil, errors.New("pattern must not be empty")
	}
	if len(pattern) > maxPatternBytes {
		return nil, fmt.Errorf("pattern is %d bytes; the limit is %d", len(pattern), maxPatternBytes)
	}
	compiled, err := regexp.Compile("(?i)" + pattern)
	if err != nil {
		return nil, fmt.Errorf("invalid pattern %q (Go RE2 syntax, no lookaround or backreferences): %w", pattern, err)
	}
	return compiled, nil
}

// grepResult is the rendered matches of one search.
type grepResult struct {
	totalMatches int
	shownMatches int
	report       string // the "--- Match" blocks
}

// grepText finds the lines of text that match and renders each with
// contextLines lines around it, numbered from 1. All matching lines are
// counted; only the first maxMatches are rendered.
func grepText(text string, pattern *regexp.Regexp, contextLines, maxMatches int) grepResult {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	var report strings.Builder
	result := grepResult{}
	for index, line := range lines {
		location := pattern.FindStringIndex(line)
		if location == nil {
			continue
		}
		result.totalMatches++
		if result.shownMatches >= maxMatches {
			continue
		}
		result.shownMatches++
		if report.Len() > 0 {
			report.WriteString("\n")
		}
		fmt.Fprintf(&report, "--- Match %d (line %d) ---\n", result.shownMatches, index+1)
		first := max(0, index-contextLines)
		last := min(len(lines)-1, index+contextLines)
		for contextIndex := first; contextIndex <= last; contextIndex++ {
			marker := "    "
			shown := clipLine(lines[contextIndex], 0)
			if contextIndex == index {
				marker = ">>> "
				shown = clipLine(line, location[0])
			}
			report.WriteString(marker + strconv.Itoa(contextIndex+1) + ": " + shown + "\n")
		}
	}
	result.report = report.String()
	return result
}

// clipLine shortens a line longer than maxShownLineBytes to a window that
// starts a little before focus, on character boundaries, marking cuts with
// "…".
func clipLine(line string, focus int) string {
	if len(line) <= maxShownLineBytes {
		return line
	}
	start := characterStart(line, max(0, focus-maxShownLineBytes/4))
	end := min(len(line), start+maxShownLineBytes)
	end = characterStart(line, end)
	clipped := line[start:end]
	if start > 0 {
		clipped = "…" + clipped
	}
	if end < len(line) {
		clipped += "…"
	}
	return clipped
}
