package api

import (
	"net/http"
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
