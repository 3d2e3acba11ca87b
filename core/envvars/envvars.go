// Package envvars is the one registry of the CAPSEM_* environment
// variables capsem reads: each is declared once, in declared.go, with its
// meaning, its kind of value, who sets it, where it is read and whether the
// service passes it on to the per-VM processes. Code reads a variable
// through its handle (envvars.Home.Get(), envvars.MCPInflight.Value()),
// never by a name of its own: only this package can make a handle (their
// fields are unexported), so an undeclared variable cannot be read through
// one, and a test scans the repository for CAPSEM_* names that bypass the
// registry and for declarations nothing reads.
//
// Kong reads a few of them itself (env:"..." struct tags, which must be
// literals); the scan checks those names too, and a test in personalities
// checks that kong and the registry accept the same values.
package envvars

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Audience says who sets a variable, and so whether it is documented as a
// setting.
type Audience uint8

const (
	// User variables are settings people make; capsem env lists them.
	User Audience = iota + 1
	// Internal variables are set by one capsem process for another (a
	// sandboxed child, a guest process, the builtin tool server); they are
	// not settings.
	Internal
	// Test variables are set by the tests (make test) for the test kit or
	// for a process under test.
	Test
)

// String names the audience for people.
func (a Audience) String() string {
	switch a {
	case User:
		return "user"
	case Internal:
		return "internal"
	case Test:
		return "test"
	}
	return "audience(" + strconv.Itoa(int(a)) + ")"
}

// Readers is the set of places a variable is read.
type Readers uint8

const (
	// Host is capsem on the host: the CLI, the service, the per-VM
	// process, the gateway, the test kit.
	Host Readers = 1 << iota
	// Guest is capsem inside the VM: the agent, the MCP relay, the doctor.
	Guest
	// Sandboxed is capsem's sandboxed children on the host: the MCP
	// aggregator and builtin tool server, and privsep's first stage.
	Sandboxed
)

// String lists the readers for people: "host", "host+guest".
func (r Readers) String() string {
	var names []string
	for _, n := range []struct {
		bit  Readers
		name string
	}{{Host, "host"}, {Guest, "guest"}, {Sandboxed, "sandboxed"}} {
		if r&n.bit != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, "+")
}

// Setting is one declared variable: what the registry knows of it, and
// its raw value. Only declared.go makes them.
type Setting struct {
	name     string
	meaning  string
	unset    string
	audience Audience
	readers  Readers
	passOn   bool
	kind     string
	check    func(value string) error
}

// Name is the variable's name, CAPSEM_...
func (s *Setting) Name() string { return s.name }

// Meaning says in one line, for people, what the variable does.
func (s *Setting) Meaning() string { return s.meaning }

// Unset says what capsem does when the variable is unset (or empty), for
// people; "" when there is nothing to say.
func (s *Setting) Unset() string { return s.unset }

// Audience says who sets the variable.
func (s *Setting) Audience() Audience { return s.audience }

// Readers says where the variable is read.
func (s *Setting) Readers() Readers { return s.readers }

// PassedOn reports whether the service passes the variable on from its
// own environment to each per-VM process.
func (s *Setting) PassedOn() bool { return s.passOn }

// Kind names the variable's kind of value, for people: "path", "seconds".
func (s *Setting) Kind() string { return s.kind }

// Get is the variable's value in this process's environment, "" when it
// is unset.
func (s *Setting) Get() string { return os.Getenv(s.name) }

// Lookup is the variable's value in this process's environment and
// whether it is set at all (set but empty counts as set).
func (s *Setting) Lookup() (string, bool) { return os.LookupEnv(s.name) }

// Pair is the NAME=value entry that gives a child process the variable.
func (s *Setting) Pair(value string) string { return s.name + "=" + value }

// Check reports whether value is one the variable's readers accept; the
// error names the variable and the value. "" is always accepted: it means
// unset.
func (s *Setting) Check(value string) error {
	if value == "" {
		return nil
	}
	return s.check(value)
}

// Var is a declared variable whose value parses to a T.
type Var[T any] struct {
	*Setting
	k kind[T]
}

// Value parses the variable from this process's environment; ok is false,
// with no error, when it is unset or empty (or blank, for kinds that ignore
// surrounding blanks).
func (v Var[T]) Value() (value T, ok bool, err error) { return v.ValueFrom(os.Getenv) }

// ValueFrom is Value in the environment getenv reads.
func (v Var[T]) ValueFrom(getenv func(string) string) (value T, ok bool, err error) {
	raw := getenv(v.name)
	if v.k.trim {
		raw = strings.TrimSpace(raw)
	}
	if raw == "" {
		return value, false, nil
	}
	value, err = v.Parse(raw)
	return value, err == nil, err
}

// Parse parses raw as a value of the variable; the error names the
// variable and raw.
func (v Var[T]) Parse(raw string) (T, error) {
	if v.k.trim {
		raw = strings.TrimSpace(raw)
	}
	value, err := v.k.parse(raw)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s=%q: %w", v.name, raw, err)
	}
	return value, nil
}

// kind is a kind of value: its name for people and its parser.
type kind[T any] struct {
	name string
	// trim makes surrounding blanks insignificant, and a blank value unset.
	trim bool
	// parse says, when value is not one of the kind, what is wanted
	// (without the variable's name, which Var.Parse adds).
	parse func(value string) (T, error)
}

// about is the declaration of one variable, as declared.go writes it.
type about struct {
	name     string
	meaning  string
	unset    string
	audience Audience
	readers  Readers
	passOn   bool
}

// declare makes the handle of a variable of kind k; registry (in
// declared.go) lists it.
func declare[T any](k kind[T], a about) Var[T] {
	s := &Setting{name: a.name, meaning: a.meaning, unset: a.unset, audience: a.audience,
		readers: a.readers, passOn: a.passOn, kind: k.name}
	v := Var[T]{Setting: s, k: k}
	s.check = func(value string) error {
		if k.trim && strings.TrimSpace(value) == "" {
			return nil
		}
		_, err := v.Parse(value)
		return err
	}
	return v
}

// All is every declared variable, in the order of declared.go (related ones
// together).
func All() []*Setting { return append([]*Setting(nil), registry...) }

// Find is the declared variable called name, nil when there is none.
func Find(name string) *Setting {
	for _, s := range registry {
		if s.name == name {
			return s
		}
	}
	return nil
}

// PassedOn names the variables the service passes on from its own
// environment to each per-VM process.
func PassedOn() []string {
	var names []string
	for _, s := range registry {
		if s.passOn {
			names = append(names, s.name)
		}
	}
	return names
}
