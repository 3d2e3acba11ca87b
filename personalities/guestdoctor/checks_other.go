//go:build !linux

package guestdoctor

import (
	"context"
	"runtime"

	"github.com/capsem/capsem/core/doctor"
)

// checks: the guest is Linux; elsewhere there is nothing to check.
func checks(map[string]string, string) []doctor.Group {
	return []doctor.Group{{Name: "env", Checks: []doctor.Check{{Name: "os", Run: func(_ context.Context, r *doctor.Reporter) {
		r.Failf("run capsem-doctor inside a capsem VM", "capsem-doctor checks a Linux guest; this is %s", runtime.GOOS)
	}}}}}
}
