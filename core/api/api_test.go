package api

import (
	"net/http"
	"strings"
	"testing"
)

// A code reported after a stream's 200 has the status it would have had,
// and each status's default code comes back from it.
func TestStatusOfCode(t *testing.T) {
	cases := []struct {
		code   string
		status int
	}{
		{CodeBadRequest, http.StatusBadRequest},
		{CodeRefused, http.StatusBadRequest},
		{CodeNotFound, http.StatusNotFound},
		{CodeConflict, http.StatusConflict},
		{CodeInterrupted, http.StatusConflict},
		{CodeTooLarge, http.StatusRequestEntityTooLarge},
		{CodeNoSpace, http.StatusInsufficientStorage},
		{CodeUnavailable, http.StatusServiceUnavailable},
		{CodeInternal, http.StatusInternalServerError},
		{"from-a-newer-sender", http.StatusInternalServerError},
	}
	for _, tc := range cases {
		if got := StatusOfCode(tc.code); got != tc.status {
			t.Errorf("StatusOfCode(%q) = %d, want %d", tc.code, got, tc.status)
		}
		if def := CodeOf(tc.status); def != tc.code && tc.code != CodeRefused && tc.code != CodeInterrupted && tc.code != "from-a-newer-sender" {
			t.Errorf("CodeOf(%d) = %q, want %q", tc.status, def, tc.code)
		}
	}
}

func TestCheckTraceID(t *testing.T) {
	cases := []struct {
		id string
		ok bool
	}{
		{"", true},
		{"trace-1", true},
		{"00f067aa0ba902b7:span.1_x", true},
		{strings.Repeat("a", MaxTraceID), true},
		{strings.Repeat("a", MaxTraceID+1), false},
		{"has space", false},
		{"new\nline", false},
		{"quote\"", false},
		{"é", false},
	}
	for _, tc := range cases {
		if err := CheckTraceID(tc.id); (err == nil) != tc.ok {
			t.Errorf("CheckTraceID(%q) = %v", tc.id, err)
		}
	}
}

func FuzzCheckTraceID(f *testing.F) {
	f.Add("trace-1")
	f.Fuzz(func(t *testing.T, id string) {
		if CheckTraceID(id) == nil && (len(id) > MaxTraceID || strings.ContainsAny(id, " \n\t\"'\\\x00")) {
			t.Fatalf("accepted %q", id)
		}
	})
}
