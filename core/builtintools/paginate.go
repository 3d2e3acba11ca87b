package builtintools

import (
	"fmt"
	"unicode/utf8"
)

// Pagination counts bytes of the UTF-8 text a tool returns (or of the raw
// body, for base64 output). Byte offsets are what a client can compute
// without decoding, and they make start_index=next_start_index exact.
// Boundaries are moved back to the start of a character, so a page never
// splits a multi-byte character.
const (
	defaultMaxLength = 5000
	// maxMaxLength keeps one page well inside the gateway's 1 MiB frame even
	// after JSON escaping.
	maxMaxLength = 256 << 10
)

// textPage is one window of a longer text.
type textPage struct {
	text  string
	start int // byte offset of text in the whole
	end   int // byte offset just past text
	total int // byte length of the whole
}

func (p textPage) hasMore() bool { return p.end < p.total }

// paginateText cuts the window [startIndex, startIndex+maxLength) out of s,
// moving both ends back to character boundaries. If maxLength is smaller
// than the character at startIndex, that one character is returned so a
// client paging forward always makes progress.
func paginateText(s string, startIndex, maxLength int) (textPage, error) {
	start, _, err := pageBounds(len(s), startIndex, maxLength)
	if err != nil {
		return textPage{}, err
	}
	start = characterStart(s, start)
	end := len(s)
	if maxLength < len(s)-start {
		end = characterStart(s, start+maxLength)
		if end <= start {
			_, size := utf8.DecodeRuneInString(s[start:])
			end = start + size
		}
	}
	return textPage{text: s[start:end], start: start, end: end, total: len(s)}, nil
}

// paginateBytes is paginateText for opaque bytes (base64 output), with no
// character boundaries to respect.
func paginateBytes(b []byte, startIndex, maxLength int) (page []byte, start, end int, err error) {
	start, end, err = pageBounds(len(b), startIndex, maxLength)
	if err != nil {
		return nil, 0, 0, err
	}
	return b[start:end], start, end, nil
}

func pageBounds(total, startIndex, maxLength int) (start, end int, err error) {
	if startIndex < 0 {
		return 0, 0, fmt.Errorf("start_index must not be negative, got %d", startIndex)
	}
	if maxLength <= 0 {
		return 0, 0, fmt.Errorf("max_length must be positive, got %d", maxLength)
	}
	if startIndex > total {
		return 0, 0, fmt.Errorf("start_index %d is past the end of the content (%d bytes)", startIndex, total)
	}
	end = total
	if maxLength < total-startIndex {
		end = startIndex + maxLength
	}
	return startIndex, end, nil
}

// characterStart moves i back to the first byte of the UTF-8 sequence that
// contains it (at most three bytes back, so invalid input cannot make it
// walk far).
func characterStart(s string, i int) int {
	for back := 0; back < utf8.UTFMax-1 && i > 0 && i < len(s) && !utf8.RuneStart(s[i]); back++ {
		i--
	}
	return i
}

// normalizePaging applies the defaults and the bound on max_length.
func normalizePaging(startIndex, maxLength int) (int, int, error) {
	if maxLength == 0 {
		maxLength = defaultMaxLength
	}
	if maxLength > maxMaxLength {
		return 0, 0, fmt.Errorf("max_length %d is larger than the limit of %d bytes; page with start_index instead", maxLength, maxMaxLength)
	}
	if maxLength < 0 {
		return 0, 0, fmt.Errorf("max_length must be positive, got %d", maxLength)
	}
	if startIndex < 0 {
		return 0, 0, fmt.Errorf("start_index must not be negative, got %d", startIndex)
	}
	return startIndex, maxLength, nil
}
