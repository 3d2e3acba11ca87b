package builtintools

import (
	"net/http"
	"testing"
)

func TestIsBinaryMediaType(t *testing.T) {
	tests := []struct {
		contentType string
		want        bool
	}{
		{"text/html; charset=utf-8", false},
		{"text/plain", false},
		{"application/json", false},
		{"application/xml", false},
		{"application/javascript", false},
		{"image/png", true},
		{"image/svg+xml", true},
		{"audio/mpeg", true},
		{"video/mp4", true},
		{"font/woff2", true},
		{"application/octet-stream", true},
		{"application/pdf", true},
		{"application/zip", true},
		{"application/gzip", true},
		{"application/x-gzip", true},
		{"application/x-tar", true},
		{"application/wasm", true},
		{"application/x-executable", true},
		{"APPLICATION/PDF", true},
		{"image/png; this is : not valid", true},
	}
	for _, test := range tests {
		mediaType, _ := mediaTypeOf(test.contentType)
		if got := isBinaryMediaType(mediaType); got != test.want {
			t.Errorf("isBinaryMediaType(%q) = %v, want %v", test.contentType, got, test.want)
		}
	}
}

func TestDecodeText(t *testing.T) {
	tests := []struct {
		name     string
		body     []byte
		charset  string
		wantText string
		wantOK   bool
	}{
		{"utf-8", []byte("héllo"), "utf-8", "héllo", true},
		{"no charset", []byte("plain"), "", "plain", true},
		{"latin-1", []byte{'c', 'a', 'f', 0xE9}, "iso-8859-1", "café", true},
		{"windows-1252 quotes", []byte{0x93, 'q', 0x94, 0x80}, "windows-1252", "“q”€", true},
		{"mislabelled utf-8 kept", []byte("café"), "iso-8859-1", "café", true},
		{"invalid utf-8", []byte{0xff, 0xfe, 'a'}, "", "\uFFFDa", false},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			text, ok := decodeText(test.body, test.charset)
			if text != test.wantText || ok != test.wantOK {
				t.Errorf("decodeText = %q %v, want %q %v", text, ok, test.wantText, test.wantOK)
			}
		})
	}
}

func TestSniffedMediaType(t *testing.T) {
	header := http.Header{}
	if mediaType, _ := sniffedMediaType(header, []byte("\x89PNG\r\n\x1a\n\x00\x00")); mediaType != "image/png" {
		t.Errorf("sniffed PNG as %q", mediaType)
	}
	if mediaType, _ := sniffedMediaType(header, []byte("<!DOCTYPE html><p>x")); mediaType != "text/html" {
		t.Errorf("sniffed HTML as %q", mediaType)
	}
	header.Set("Content-Type", "application/json; charset=latin1")
	if mediaType, charset := sniffedMediaType(header, []byte("<html>")); mediaType != "application/json" || charset != "latin1" {
		t.Errorf("header type = %q %q, want the header to win", mediaType, charset)
	}
}
