package service

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"

	"github.com/capsem/capsem/core/vmrecord"
)

// MaxNameLen bounds a VM name (it is the guest's host name, at most 63).
const MaxNameLen = 63

// CheckName reports why name cannot name a VM, or nil: lower-case letters,
// digits and '-', starting with a letter or digit, at most MaxNameLen, and
// not of the form of an id (a name and an id must never be confused).
func CheckName(name string) error { return checkName("VM", name) }

// checkName is CheckName for the name of a kind of thing ("VM",
// "image"): images share VM names' form and namespace.
func checkName(kind, name string) error {
	if name == "" {
		return badRequest("%s name is empty", kind)
	}
	if len(name) > MaxNameLen {
		return badRequest("%s name is %d characters long, more than %d", kind, len(name), MaxNameLen)
	}
	for i, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && i > 0
		if !ok {
			return badRequest("%s name %q: use lower-case letters, digits and '-', starting with a letter or digit", kind, name)
		}
	}
	if vmrecord.IDPattern.MatchString(name) {
		return badRequest("%s name %q has the form of a VM id", kind, name)
	}
	return nil
}

func newID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "vm-" + hex.EncodeToString(b)
}

func notFound(ref string) error {
	return refuse(http.StatusNotFound, "no VM named %q (see capsem_list)", ref)
}

func notRunning(r *vmrecord.Record) error {
	return refuse(http.StatusServiceUnavailable, "VM %s is %s, not running%s", r.Label(), r.State, resumeHint(r))
}

func resumeHint(r *vmrecord.Record) string {
	if r.Persistent {
		return fmt.Sprintf(" (resume it with capsem_resume %s)", r.Label())
	}
	return ""
}
