package envcmd

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/envvars"
)

var update = flag.Bool("update", false, "rewrite golden files")

// env is a fixed environment: some settings set, one to a value its
// readers refuse, one with a control character, one set but empty.
var env = map[string]string{
	"CAPSEM_HOME":          "/home/me/capsem home",
	"CAPSEM_ACCEL":         "tcg",
	"CAPSEM_TCG_CACHE_MIB": "abc",
	"CAPSEM_RUN_DIR":       "/run/\x1b]0;title\x07",
	"CAPSEM_CORP_CONFIG":   "",
	"CAPSEM_SANDBOX":       "nnp,caps",
	"UNRELATED":            "x",
}

func lookup(name string) (string, bool) {
	v, ok := env[name]
	return v, ok
}

func TestWriteGolden(t *testing.T) {
	for _, tc := range []struct {
		golden string
		all    bool
	}{{"env.golden", false}, {"env-all.golden", true}} {
		t.Run(tc.golden, func(t *testing.T) {
			var out bytes.Buffer
			if err := Write(&out, lookup, tc.all); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != string(want) {
				t.Errorf("capsem env differs from %s (go test -update rewrites it):\n%s", path, out.String())
			}
		})
	}
}

// TestWriteListsWhatItShould: the user's settings, each once, and the
// internal and test ones only with --all; a refused value says why; a
// control character is shown escaped, never sent to the terminal.
func TestWriteListsWhatItShould(t *testing.T) {
	var user, all bytes.Buffer
	if err := Write(&user, lookup, false); err != nil {
		t.Fatal(err)
	}
	if err := Write(&all, lookup, true); err != nil {
		t.Fatal(err)
	}
	listed := map[string]int{}
	for line := range strings.Lines(user.String()) {
		if strings.HasPrefix(line, " ") || strings.HasPrefix(line, "(") {
			continue // a setting's details, or the closing note
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(line, " unset\n"), "=")
		listed[name]++
	}
	for _, s := range envvars.All() {
		want := 0
		if s.Audience() == envvars.User {
			want = 1
		}
		if listed[s.Name()] != want {
			t.Errorf("%s is listed %d times by capsem env, want %d", s.Name(), listed[s.Name()], want)
		}
		if !strings.Contains(all.String(), "\n"+s.Name()) && !strings.HasPrefix(all.String(), s.Name()) {
			t.Errorf("capsem env --all lacks %s", s.Name())
		}
	}
	if !strings.Contains(user.String(), `    refused: CAPSEM_TCG_CACHE_MIB="abc": want a whole number of MiB`) {
		t.Errorf("the refused value is not explained:\n%s", user.String())
	}
	if strings.ContainsRune(user.String(), '\x1b') || strings.ContainsRune(user.String(), '\x07') {
		t.Error("a control character reached the output")
	}
	if strings.Contains(user.String(), "UNRELATED") {
		t.Error("capsem env lists a variable that is not capsem's")
	}
}
