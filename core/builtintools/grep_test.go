package builtintools

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCompileGrepPattern(t *testing.T) {
	tests := []struct {
		pattern string
		wantErr string
	}{
		{pattern: "error"},
		{pattern: `v\d+\.\d+`},
		{pattern: "", wantErr: "must not be empty"},
		{pattern: "(unclosed", wantErr: `invalid pattern "(unclosed"`},
		{pattern: "(?=lookahead)", wantErr: "invalid pattern"},
		{pattern: strings.Repeat("a", maxPatternBytes+1), wantErr: "the limit is 4096"},
	}
	for _, test := range tests {
		_, err := compileGrepPattern(test.pattern)
		if test.wantErr == "" && err != nil {
			t.Errorf("compileGrepPattern(%.20q): %v", test.pattern, err)
		}
		if test.wantErr != "" && (err == nil || !strings.Contains(err.Error(), test.wantErr)) {
			t.Errorf("compileGrepPattern(%.20q) error = %v, want containing %q", test.pattern, err, test.wantErr)
		}
	}
}

func TestGrepText(t *testing.T) {
	text := "alpha\nbeta\nERROR one\ngamma\ndelta\nerror two\nepsilon\nzeta\nError three"
	pattern, err := compileGrepPattern("error")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		contextLines int
		maxMatches   int
		wantTotal    int
		wantShown    int
		wantReport   string
	}{
		{
			name: "no context", contextLines: 0, maxMatches: 10, wantTotal: 3, wantShown: 3,
			wantReport: "--- Match 1 (line 3) ---\n>>> 3: ERROR one\n\n" +
				"--- Match 2 (line 6) ---\n>>> 6: error two\n\n" +
				"--- Match 3 (line 9) ---\n>>> 9: Error three\n",
		},
		{
			name: "context and limit", contextLines: 1, maxMatches: 2, wantTotal: 3, wantShown: 2,
			wantReport: "--- Match 1 (line 3) ---\n    2: beta\n>>> 3: ERROR one\n    4: gamma\n\n" +
				"--- Match 2 (line 6) ---\n    5: delta\n>>> 6: error two\n    7: epsilon\n",
		},
		{
			name: "context clipped at the edges", contextLines: 5, maxMatches: 1, wantTotal: 3, wantShown: 1,
			wantReport: "--- Match 1 (line 3) ---\n    1: alpha\n    2: beta\n>>> 3: ERROR one\n    4: gamma\n    5: delta\n    6: error two\n    7: epsilon\n    8: zeta\n",
		},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			got := grepText(text, pattern, test.contextLines, test.maxMatches)
			if got.totalMatches != test.wantTotal || got.shownMatches != test.wantShown || got.report != test.wantReport {
				t.Errorf("grepText = total %d shown %d report:\n%s\nwant total %d shown %d report:\n%s",
					got.totalMatches, got.shownMatches, got.report, test.wantTotal, test.wantShown, test.wantReport)
			}
		})
	}
}

func TestClipLineKeepsMatchAndCharacters(t *testing.T) {
	line := strings.Repeat("é", 2000) + "NEEDLE" + strings.Repeat("ü", 2000)
	clipped := clipLine(line, strings.Index(line, "NEEDLE"))
	if !strings.Contains(clipped, "NEEDLE") {
		t.Error("clipped line lost the match")
	}
	if !utf8.ValidString(clipped) || !strings.HasPrefix(clipped, "…") || !strings.HasSuffix(clipped, "…") {
		t.Errorf("clipped line is malformed: %.40q…", clipped)
	}
	if len(clipped) > maxShownLineBytes+2*len("…") {
		t.Errorf("clipped line is %d bytes", len(clipped))
	}
	if short := "short line"; clipLine(short, 0) != short {
		t.Error("a short line was changed")
	}
}
