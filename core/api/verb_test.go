package api

import (
	"net/http"
	"testing"
)

// verbFacts is what a verb says of itself, its path with the ref "a/b".
type verbFacts struct {
	param, path  string
	body, answer bool
	status       int
	limit        int64
}

func factsOf[In, Out any](v Verb[In, Out]) verbFacts {
	return verbFacts{v.Param(), v.Path("a/b"), v.HasBody(), v.HasAnswer(), v.SuccessStatus(), v.Limit()}
}

func TestVerb(t *testing.T) {
	for name, tc := range map[string]struct{ got, want verbFacts }{
		"fork":       {factsOf(ForkVerb), verbFacts{"vm", "/v1/vms/a%2Fb/fork", true, true, http.StatusOK, MaxRequestBody}},
		"create":     {factsOf(CreateVerb), verbFacts{"", "/v1/vms", true, true, http.StatusCreated, MaxRequestBody}},
		"delete":     {factsOf(DeleteVerb), verbFacts{"vm", "/v1/vms/a%2Fb", false, false, http.StatusNoContent, MaxRequestBody}},
		"image":      {factsOf(ImageVerb), verbFacts{"image", "/v1/images/a%2Fb", false, true, http.StatusOK, MaxRequestBody}},
		"write file": {factsOf(WriteFileVerb), verbFacts{"vm", "/v1/vms/a%2Fb/files/write", true, false, http.StatusNoContent, maxWriteFileBody}},
		"version":    {factsOf(VersionVerb), verbFacts{"", "/v1/version", false, true, http.StatusOK, MaxRequestBody}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, tc.got, tc.want)
		}
	}
}
