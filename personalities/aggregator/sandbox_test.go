package aggregator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "tool")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want, wantErr string
	}{
		{name: "tool", path: dir, want: exe},
		{name: "tool", path: "/nonexistent:" + dir, want: exe},
		{name: "sh", path: "/bin", want: "/bin/sh"},
		{name: exe, path: "", want: exe},
		// A relative PATH entry would search the working directory.
		{name: "tool", path: "relative:.", wantErr: `command "tool" not found in PATH relative:.`},
		{name: "plain", path: dir, wantErr: "not found"},
		{name: "adir", path: dir, wantErr: "not found"},
		{name: "./tool", path: dir, wantErr: `command "./tool" is relative`},
		{name: "", path: dir, wantErr: "empty command"},
	} {
		got, err := lookPath(tc.name, tc.path)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("lookPath(%q, %q) = %q, %v; want error %q", tc.name, tc.path, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("lookPath(%q, %q) = %q, %v; want %q", tc.name, tc.path, got, err, tc.want)
		}
	}
}
