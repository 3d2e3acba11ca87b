package builtintools

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPaginateText(t *testing.T) {
	const mixed = "aé€😀b" // 1 + 2 + 3 + 4 + 1 bytes
	tests := []struct {
		name       string
		text       string
		startIndex int
		maxLength  int
		wantText   string
		wantStart  int
		wantEnd    int
		wantErr    string
	}{
		{name: "whole", text: "hello", maxLength: 10, wantText: "hello", wantEnd: 5},
		{name: "window", text: "hello world", startIndex: 6, maxLength: 3, wantText: "wor", wantStart: 6, wantEnd: 9},
		{name: "end cut back to character start", text: mixed, maxLength: 5, wantText: "aé", wantEnd: 3},
		{name: "start moved back to character start", text: mixed, startIndex: 4, maxLength: 6, wantText: "€", wantStart: 3, wantEnd: 6},
		{name: "window smaller than a character still progresses", text: mixed, startIndex: 6, maxLength: 1, wantText: "😀", wantStart: 6, wantEnd: 10},
		{name: "start at end is empty", text: "abc", startIndex: 3, maxLength: 5, wantText: "", wantStart: 3, wantEnd: 3},
		{name: "empty text", text: "", maxLength: 5, wantText: ""},
		{name: "start past end", text: "abc", startIndex: 4, maxLength: 5, wantErr: "past the end of the content (3 bytes)"},
		{name: "negative start", text: "abc", startIndex: -1, maxLength: 5, wantErr: "must not be negative"},
		{name: "zero length", text: "abc", maxLength: 0, wantErr: "must be positive"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			page, err := paginateText(test.text, test.startIndex, test.maxLength)
			if test.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), test.wantErr) {
					t.Fatalf("error = %v, want containing %q", err, test.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if page.text != test.wantText || page.start != test.wantStart || page.end != test.wantEnd || page.total != len(test.text) {
				t.Errorf("page = %+v, want text %q start %d end %d total %d", page, test.wantText, test.wantStart, test.wantEnd, len(test.text))
			}
		})
	}
}

// TestPaginateTextNeverSplitsCharacters pages through multibyte text with
// every window size and checks that pages are valid UTF-8 and join back to
// the original.
func TestPaginateTextNeverSplitsCharacters(t *testing.T) {
	text := strings.Repeat("Grüße, 世界! 😀🎉 ", 20)
	for maxLength := 1; maxLength <= 12; maxLength++ {
		var joined strings.Builder
		for start := 0; start < len(text); {
			page, err := paginateText(text, start, maxLength)
			if err != nil {
				t.Fatalf("maxLength %d start %d: %v", maxLength, start, err)
			}
			if !utf8.ValidString(page.text) {
				t.Fatalf("maxLength %d start %d: page %q is not valid UTF-8", maxLength, start, page.text)
			}
			if page.end <= start {
				t.Fatalf("maxLength %d start %d: no progress", maxLength, start)
			}
			if len(page.text) > max(maxLength, utf8.UTFMax) {
				t.Fatalf("maxLength %d: page of %d bytes", maxLength, len(page.text))
			}
			joined.WriteString(page.text)
			start = page.end
		}
		if joined.String() != text {
			t.Fatalf("maxLength %d: pages do not join back to the text", maxLength)
		}
	}
	// Every start offset, even inside a character, gives valid UTF-8.
	for start := 0; start <= len(text); start++ {
		page, err := paginateText(text, start, 7)
		if err != nil || !utf8.ValidString(page.text) {
			t.Fatalf("start %d: page %q err %v", start, page.text, err)
		}
	}
}

func TestNormalizePaging(t *testing.T) {
	if start, length, err := normalizePaging(0, 0); err != nil || start != 0 || length != defaultMaxLength {
		t.Errorf("defaults: got %d %d %v", start, length, err)
	}
	if _, _, err := normalizePaging(0, maxMaxLength+1); err == nil || !strings.Contains(err.Error(), "larger than the limit") {
		t.Errorf("oversized max_length: error = %v", err)
	}
	if _, _, err := normalizePaging(-5, 10); err == nil {
		t.Error("negative start_index: want an error")
	}
}
