package builtintools

import (
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// mediaTypeOf returns the lower-case media type without parameters, and the
// charset parameter if any. A malformed header still yields its type part.
func mediaTypeOf(contentType string) (mediaType, charset string) {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		mediaType, _, _ = strings.Cut(contentType, ";")
		mediaType = strings.ToLower(strings.TrimSpace(mediaType))
		return mediaType, ""
	}
	return mediaType, strings.ToLower(params["charset"])
}

// binaryMediaFragments are substrings that mark a non-text media type.
var binaryMediaFragments = []string{"pdf", "zip", "gzip", "x-tar", "wasm", "x-executable", "x-msdownload", "x-7z", "x-rar", "vnd.rar", "x-bzip", "x-xz"}

// isBinaryMediaType reports whether a response of this media type should be
// refused by the text tools (fetch_http and grep_http) unless raw output was
// asked for.
func isBinaryMediaType(mediaType string) bool {
	for _, prefix := range []string{"image/", "audio/", "video/", "font/"} {
		if strings.HasPrefix(mediaType, prefix) {
			return true
		}
	}
	if mediaType == "application/octet-stream" {
		return true
	}
	for _, fragment := range binaryMediaFragments {
		if strings.Contains(mediaType, fragment) {
			return true
		}
	}
	return false
}

// sniffedMediaType is the media type from the header, or sniffed from the
// body when the server sent none.
func sniffedMediaType(header http.Header, body []byte) (mediaType, charset string) {
	if contentType := header.Get("Content-Type"); contentType != "" {
		return mediaTypeOf(contentType)
	}
	return mediaTypeOf(http.DetectContentType(body))
}

func isHTMLMediaType(mediaType string) bool {
	return mediaType == "text/html" || mediaType == "application/xhtml+xml"
}

// decodeText turns a body into valid UTF-8. Latin-1 and Windows-1252 are
// decoded (they are common and need no tables beyond one small one);
// anything else is read as UTF-8. ok is false when the bytes were not valid
// in that encoding, which callers treat as binary.
func decodeText(body []byte, charset string) (text string, ok bool) {
	switch charset {
	case "iso-8859-1", "latin1", "latin-1", "iso8859-1", "l1", "windows-1252", "cp1252", "us-ascii", "ascii":
		if utf8.Valid(body) {
			// Mislabelled UTF-8 is common, and real Latin-1 text is almost
			// never valid UTF-8 by accident; keeping it avoids mojibake.
			return string(body), true
		}
		return decodeWindows1252(body), true
	}
	if utf8.Valid(body) {
		return string(body), true
	}
	return strings.ToValidUTF8(string(body), "\uFFFD"), false
}

// windows1252High maps bytes 0x80–0x9F, where Windows-1252 differs from
// Latin-1; 0 marks an unassigned byte.
var windows1252High = [32]rune{
	'€', 0, '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', 0, 'Ž', 0,
	0, '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', 0, 'ž', 'Ÿ',
}

func decodeWindows1252(body []byte) string {
	var builder strings.Builder
	builder.Grow(len(body) + len(body)/8)
	for _, b := range body {
		switch {
		case b < 0x80:
			builder.WriteByte(b)
		case b < 0xA0 && windows1252High[b-0x80] != 0:
			builder.WriteRune(windows1252High[b-0x80])
		default:
			builder.WriteRune(rune(b))
		}
	}
	return builder.String()
}
