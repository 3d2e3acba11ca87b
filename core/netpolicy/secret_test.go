package netpolicy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	t.Setenv("CAPSEM_TEST_SECRET_ENV", "  env-value\n")
	cases := []struct {
		name      string
		cred      Credential
		want, err string
	}{
		{"file", Credential{SourceFile: write("ok", "sk-value\n", 0o600)}, "sk-value", ""},
		{"env", Credential{SourceEnv: "CAPSEM_TEST_SECRET_ENV"}, "env-value", ""},
		{"env unset", Credential{SourceEnv: "CAPSEM_TEST_SECRET_UNSET"}, "", "source_env CAPSEM_TEST_SECRET_UNSET is not set"},
		{"readable by others", Credential{SourceFile: write("open", "sk", 0o644)}, "", "must be readable by its owner only"},
		{"missing", Credential{SourceFile: filepath.Join(dir, "none")}, "", "no such file"},
		{"empty", Credential{SourceFile: write("empty", " \n", 0o600)}, "", "is empty"},
		{"two lines", Credential{SourceFile: write("lines", "a\nb", 0o600)}, "", "line break"},
		{"a placeholder", Credential{SourceFile: write("ph", "capsem-placeholder-x", 0o600)}, "", "is a placeholder"},
		{"too big", Credential{SourceFile: write("big", strings.Repeat("a", MaxSecretBytes+1), 0o600)}, "", "larger than"},
		{"a directory", Credential{SourceFile: dir}, "", "not a regular file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cred.Host = "api.example.com"
			got, err := CredentialRule{Credential: tc.cred}.ReadSecret()
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("error %v, want %q", err, tc.err)
			}
			if got != "" || (err != nil && strings.Contains(err.Error(), "sk")) {
				t.Fatalf("the value leaked: %q / %v", got, err)
			}
		})
	}
}
