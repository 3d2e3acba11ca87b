package vmhost

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/paths"
)

func TestLogsRoute(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	for i := 0; i < 50; i++ {
		b.WriteString("line ")
		b.WriteString(strings.Repeat("x", i%3))
		b.WriteString("\n")
	}
	os.WriteFile(filepath.Join(dir, "console.log"), []byte(b.String()+"boot: agent connected\n"), 0o600)
	v := &VM{opts: Options{SessionDir: dir}, session: paths.Session{Dir: dir}}
	cases := []struct {
		query  string
		status int
		lines  int
		has    string
	}{
		{"", 200, 51, "agent connected"},
		{"?tail=3", 200, 3, "agent connected"},
		{"?grep=agent", 200, 1, "agent connected"},
		{"?grep=xx&tail=5", 200, 5, "xx"},
		{"?tail=abc", 400, 0, "want a number"},
		{"?tail=0", 400, 0, "want a number"},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		v.handleLogs(rec, httptest.NewRequest(http.MethodGet, "/logs"+tc.query, nil))
		body := rec.Body.String()
		if rec.Code != tc.status || !strings.Contains(body, tc.has) {
			t.Errorf("%s: %d %q", tc.query, rec.Code, body)
			continue
		}
		if tc.status == 200 && strings.Count(body, "\n") != tc.lines {
			t.Errorf("%s: %d lines, want %d", tc.query, strings.Count(body, "\n"), tc.lines)
		}
	}
	missing := &VM{session: paths.Session{Dir: filepath.Join(dir, "nope")}}
	rec := httptest.NewRecorder()
	missing.handleLogs(rec, httptest.NewRequest(http.MethodGet, "/logs", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("missing log: %d", rec.Code)
	}
}
