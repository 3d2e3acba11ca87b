package personalities

import (
	"reflect"
	"strings"
	"testing"

	"github.com/alecthomas/kong"

	"github.com/capsem/capsem/core/envvars"
)

// envFields are the fields of the grammar under t that kong reads from
// the environment (env:"..."), in every command.
func envFields(t reflect.Type, seen map[reflect.Type]bool) []reflect.StructField {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return nil
	}
	seen[t] = true
	var out []reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Tag.Get("env") != "" {
			out = append(out, f)
		}
		out = append(out, envFields(f.Type, seen)...)
	}
	return out
}

// kongAccepts reports whether kong parses value of the variable name into
// a flag like field.
func kongAccepts(t *testing.T, field reflect.StructField, name, value string) error {
	t.Helper()
	typ := reflect.StructOf([]reflect.StructField{{Name: "F", Type: field.Type, Tag: field.Tag}})
	parser, err := kong.New(reflect.New(typ).Interface(), kong.Exit(func(int) { t.Fatalf("kong exited on %s=%q", name, value) }))
	if err != nil {
		t.Fatalf("kong on the field of %s: %v", name, err)
	}
	t.Setenv(name, value)
	_, err = parser.Parse(nil)
	return err
}

// TestKongEnvTagsAgreeWithTheRegistry: every variable kong reads is
// declared in core/envvars, and kong and the registry (capsem env's check)
// accept the same values of it, so what capsem env calls valid is what the
// commands take.
func TestKongEnvTagsAgreeWithTheRegistry(t *testing.T) {
	fields := envFields(reflect.TypeOf(CLI{}), map[reflect.Type]bool{})
	if len(fields) < 4 {
		t.Fatalf("found %d fields with env tags in the grammar; the walk is broken", len(fields))
	}
	samples := []string{"1", "0", "yes", "No", "TRUE", "on", "off", "abc", "64", "0x40", "-1", "1_000", " 5", "5 ",
		"99999999999999999999", "debug", "info", "warn", "error", "DEBUG", "/tmp/x", "~/x", "kvm"}
	for _, f := range fields {
		for name := range strings.SplitSeq(f.Tag.Get("env"), ",") {
			s := envvars.Find(name)
			if s == nil {
				t.Errorf("field %s reads %s, which core/envvars does not declare", f.Name, name)
				continue
			}
			for _, v := range samples {
				kongErr, regErr := kongAccepts(t, f, name, v), s.Check(v)
				if (kongErr == nil) != (regErr == nil) {
					t.Errorf("%s=%q: kong says %v, the registry says %v", name, v, kongErr, regErr)
				}
			}
		}
	}
}
