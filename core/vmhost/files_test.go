package vmhost

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/api"
)

// Bad file-content requests are refused with a message that names the
// problem, before anything reaches the guest (this VM has no guest at all).
func TestFileContentRoutesRefuseBadRequests(t *testing.T) {
	v := &VM{}
	routes := v.routes()
	tooLarge := httptest.NewRequest(http.MethodPut, "/v1/files/content?path=/tmp/x", strings.NewReader("x"))
	tooLarge.ContentLength = api.MaxFileBytes + 1
	cases := []struct {
		name   string
		req    *http.Request
		status int
		has    string
	}{
		{"read without path", httptest.NewRequest(http.MethodGet, "/v1/files/content", nil), 400, "query parameter path is required"},
		{"write without path", httptest.NewRequest(http.MethodPut, "/v1/files/content", strings.NewReader("x")), 400, "query parameter path is required"},
		{"write with a decimal-looking mode", httptest.NewRequest(http.MethodPut, "/v1/files/content?path=/tmp/x&mode=999", strings.NewReader("x")), 400, `mode="999": want octal`},
		{"write with a setuid mode", httptest.NewRequest(http.MethodPut, "/v1/files/content?path=/tmp/x&mode=4755", strings.NewReader("x")), 400, "want octal permission bits from 0 to 777"},
		{"write over the size limit", tooLarge, 413, "the limit is 68719476736"},
		{"content by POST", httptest.NewRequest(http.MethodPost, "/v1/files/content?path=/tmp/x", strings.NewReader("x")), 405, ""},
		{"JSON stat without a body", httptest.NewRequest(http.MethodPost, "/v1/files/stat", strings.NewReader("")), 400, "invalid request body"},
		{"JSON stat with an unknown field", httptest.NewRequest(http.MethodPost, "/v1/files/stat", strings.NewReader(`{"path":"/x","data":"AA=="}`)), 400, `unknown field "data"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			routes.ServeHTTP(rec, tc.req)
			msg := rec.Body.String()
			var e api.Error
			if json.Unmarshal(rec.Body.Bytes(), &e) == nil {
				msg = e.Error
			}
			if rec.Code != tc.status || !strings.Contains(msg, tc.has) {
				t.Fatalf("%d %q, want %d containing %q", rec.Code, msg, tc.status, tc.has)
			}
		})
	}
}
