package envvars

import (
	"regexp"
	"slices"
	"testing"
)

// TestDeclarations: every declaration is complete and says one thing once.
func TestDeclarations(t *testing.T) {
	valid := regexp.MustCompile(`^CAPSEM_[A-Z0-9_]*[A-Z0-9]$`)
	seen := map[string]bool{}
	for _, s := range All() {
		name := s.Name()
		switch {
		case !valid.MatchString(name):
			t.Errorf("%q is not a CAPSEM_ variable name", name)
		case seen[name]:
			t.Errorf("%s is declared twice", name)
		case s.Meaning() == "":
			t.Errorf("%s has no meaning", name)
		case s.Kind() == "":
			t.Errorf("%s has no kind", name)
		case s.Audience() < User || s.Audience() > Test:
			t.Errorf("%s has no audience", name)
		case s.Readers() == 0 || s.Readers()&^(Host|Guest|Sandboxed) != 0:
			t.Errorf("%s has readers %d", name, s.Readers())
		case s.PassedOn() && (s.Audience() != User || s.Readers()&Host == 0):
			// The per-VM process is a host process started for the user.
			t.Errorf("%s is passed on to per-VM processes but is not a user setting read on the host", name)
		}
		seen[name] = true
		if Find(name) != s {
			t.Errorf("Find(%q) does not find its declaration", name)
		}
	}
	if Find("CAPSEM_NOT_DECLARED") != nil {
		t.Error("Find made up a declaration")
	}
}

// TestPassedOn pins the variables the service passes on to each per-VM
// process (core/service processEnv): a change here changes what a VM's
// process sees.
func TestPassedOn(t *testing.T) {
	want := []string{"CAPSEM_HOME", "CAPSEM_CACHE_DIR", "CAPSEM_RUN_DIR", "CAPSEM_UDS_PATH", "CAPSEM_CORP_CONFIG",
		"CAPSEM_ACCEL", "CAPSEM_BOOT_STATE", "CAPSEM_LOG_LEVEL"}
	if got := PassedOn(); !slices.Equal(got, want) {
		t.Errorf("PassedOn() = %q, want %q", got, want)
	}
}

// TestAllIsACopy: a caller cannot reorder or drop declarations.
func TestAllIsACopy(t *testing.T) {
	a := All()
	a[0] = nil
	if All()[0] == nil {
		t.Error("All returned the registry itself")
	}
}

func TestStrings(t *testing.T) {
	if got := (Host | Sandboxed).String(); got != "host+sandboxed" {
		t.Errorf("Readers.String() = %q", got)
	}
	if got := Internal.String(); got != "internal" {
		t.Errorf("Audience.String() = %q", got)
	}
}
