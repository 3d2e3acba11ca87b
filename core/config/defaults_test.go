package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDefaultNetPolicy: capsem's own layer lets the AI CLIs reach their
// model APIs and the package managers their registries, and nothing else;
// a user's file adds to it, and takes back what it blocks or (with
// default = "block") does not allow itself.
func TestDefaultNetPolicy(t *testing.T) {
	for _, tc := range []struct {
		name, user string
		allowed    map[string]bool
	}{
		{"no files", "", map[string]bool{
			"api.anthropic.com": true, "api.openai.com": true, "generativelanguage.googleapis.com": true,
			"registry.npmjs.org": true, "pypi.org": true, "files.pythonhosted.org": true, "deb.debian.org": true,
			"example.com": false, "evil.api.anthropic.com": false, "github.com": false,
		}},
		{"a user's allow adds", "[net]\nallow = [\"github.com\"]\n", map[string]bool{
			"github.com": true, "api.anthropic.com": true, "example.com": false,
		}},
		{"a user's block takes back", "[net]\nblock = [\"api.openai.com\", \"*.npmjs.org\"]\n", map[string]bool{
			"api.openai.com": false, "registry.npmjs.org": false, "api.anthropic.com": true,
		}},
		{"a user's default block keeps only its own", "[net]\ndefault = \"block\"\nallow = [\"pypi.org\"]\n", map[string]bool{
			"pypi.org": true, "api.anthropic.com": false, "registry.npmjs.org": false,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := Sources{}
			if tc.user != "" {
				src.UserPath = filepath.Join(t.TempDir(), "user.toml")
				if err := os.WriteFile(src.UserPath, []byte(tc.user), 0o600); err != nil {
					t.Fatal(err)
				}
				src.UserRequired = true
			}
			m, err := LoadHierarchy(src)
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.allowed {
				if v := m.Net.Name(name); v.Allowed != want {
					t.Errorf("%s: allowed %v (rule %q from %q), want %v", name, v.Allowed, v.Rule, v.Source, want)
				}
			}
			if v := m.Net.Name("api.anthropic.com"); v.Allowed && v.Source != DefaultsSource && tc.user == "" {
				t.Errorf("the allow came from %q, want %q", v.Source, DefaultsSource)
			}
		})
	}
}

// TestDefaultCredentials: capsem's own credentials for the three model
// APIs apply only when the environment holds their key; a user's
// credential for the same variable replaces the default one.
func TestDefaultCredentials(t *testing.T) {
	for _, k := range []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"} {
		t.Setenv(k, "")
	}
	hosts := func(m *Merged) (out []string) {
		for _, c := range m.Net.Credentials() {
			out = append(out, c.Host+" "+c.GuestEnv+" "+c.Source)
		}
		return out
	}
	m, err := LoadHierarchy(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	if got := hosts(m); len(got) != 0 {
		t.Fatalf("no keys set (or only blank ones), yet credentials: %q", got)
	}
	t.Setenv("ANTHROPIC_API_KEY", "sk-test")
	t.Setenv("GEMINI_API_KEY", "g-test")
	m, err = LoadHierarchy(Sources{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"api.anthropic.com ANTHROPIC_API_KEY " + DefaultsSource, "generativelanguage.googleapis.com GEMINI_API_KEY " + DefaultsSource}
	if got := hosts(m); !slices.Equal(got, want) {
		t.Fatalf("credentials %q, want %q", got, want)
	}
	user := filepath.Join(t.TempDir(), "user.toml")
	os.WriteFile(user, []byte("[net]\nallow = [\"llm.corp.example\"]\n[[net.credentials]]\nhost = \"llm.corp.example\"\nheader = \"x-api-key\"\nsource_env = \"CORP_KEY\"\nguest_env = \"ANTHROPIC_API_KEY\"\n"), 0o600)
	m, err = LoadHierarchy(Sources{UserPath: user, UserRequired: true})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"llm.corp.example ANTHROPIC_API_KEY " + user, "generativelanguage.googleapis.com GEMINI_API_KEY " + DefaultsSource}
	if got := hosts(m); !slices.Equal(got, want) {
		t.Fatalf("with the user's credential: %q, want %q", got, want)
	}
}
