package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTrustCA(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nCAPSEM\n-----END CERTIFICATE-----"
	const root = "-----BEGIN CERTIFICATE-----\nSYSTEM-ROOT\n-----END CERTIFICATE-----\n"
	for _, withSystem := range []bool{true, false} {
		dir := t.TempDir()
		at := trustPaths{ca: filepath.Join(dir, "capsem", "ca.pem"), bundle: filepath.Join(dir, "capsem", "ca-bundle.pem"), system: filepath.Join(dir, "certs.crt"), added: filepath.Join(dir, "capsem", "added.pem"),
			local: filepath.Join(dir, "local", "capsem.crt")}
		if withSystem {
			if err := os.WriteFile(at.system, []byte(root), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Dir(at.local), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		// Every boot config writes it again (a resumed VM gets one too):
		// the CA is added once.
		for range 2 {
			if err := trustCAAt([]byte(ca+"\n\n"), nil, at); err != nil {
				t.Fatal(err)
			}
		}
		read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
		if got := read(at.ca); got != ca+"\n" {
			t.Fatalf("ca file %q", got)
		}
		bundle := read(at.bundle)
		if strings.Count(bundle, "CAPSEM") != 1 || strings.Contains(bundle, "SYSTEM-ROOT") != withSystem {
			t.Fatalf("system bundle %v: bundle %q", withSystem, bundle)
		}
		if withSystem {
			if sys := read(at.system); strings.Count(sys, "CAPSEM") != 1 || !strings.HasPrefix(sys, root) {
				t.Fatalf("the system bundle %q", sys)
			}
			// Among the local certificates, for a bundle made anew.
			if local := read(at.local); local != ca+"\n" {
				t.Fatalf("the local certificates' file %q", local)
			}
		} else if _, err := os.Stat(at.system); err == nil {
			t.Fatal("a system bundle was made where there was none")
		} else if _, err := os.Stat(filepath.Dir(at.local)); err == nil {
			t.Fatal("a local certificates' directory was made where there was none")
		}
	}
}

// TestTrustExtraRoots: the host's extra roots join the system bundle and
// the capsem bundle once, with or without a capsem CA; without one no CA
// file is written.
func TestTrustExtraRoots(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nCAPSEM\n-----END CERTIFICATE-----"
	const extra = "-----BEGIN CERTIFICATE-----\nPROXY-A\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nPROXY-B\n-----END CERTIFICATE-----\n"
	const root = "-----BEGIN CERTIFICATE-----\nSYSTEM-ROOT\n-----END CERTIFICATE-----\n"
	for _, withCA := range []bool{true, false} {
		dir := t.TempDir()
		at := trustPaths{ca: filepath.Join(dir, "capsem", "ca.pem"), bundle: filepath.Join(dir, "capsem", "ca-bundle.pem"), system: filepath.Join(dir, "certs.crt"), added: filepath.Join(dir, "capsem", "added.pem")}
		if err := trustCAAt([]byte(ca), []byte(extra), trustPaths{ca: filepath.Join(dir, "bare", "ca.pem"), bundle: filepath.Join(dir, "bare", "bundle.pem"),
			system: filepath.Join(dir, "bare", "none.crt"), added: filepath.Join(dir, "bare", "added.pem")}); err != nil {
			t.Fatalf("a root without a system bundle: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "bare", "none.crt")); err == nil {
			t.Error("a system bundle was made where there was none")
		}
		os.WriteFile(at.system, []byte(root), 0o644)
		at.local = filepath.Join(dir, "local", "capsem.crt")
		os.Mkdir(filepath.Dir(at.local), 0o755)
		var caPEM []byte
		if withCA {
			caPEM = []byte(ca)
		}
		for range 2 {
			if err := trustCAAt(caPEM, []byte(extra), at); err != nil {
				t.Fatal(err)
			}
		}
		read := func(p string) string { b, _ := os.ReadFile(p); return string(b) }
		if got := read(at.local); strings.Count(got, "PROXY-A") != 1 || strings.Count(got, "PROXY-B") != 1 || strings.Contains(got, "SYSTEM-ROOT") ||
			strings.Count(got, "CAPSEM") != map[bool]int{true: 1, false: 0}[withCA] {
			t.Errorf("with CA %v, the local certificates' file: %q", withCA, got)
		}
		for _, f := range []string{at.system, at.bundle} {
			got := read(f)
			if strings.Count(got, "PROXY-A") != 1 || strings.Count(got, "PROXY-B") != 1 || strings.Count(got, "SYSTEM-ROOT") != 1 ||
				strings.Count(got, "CAPSEM") != map[bool]int{true: 1, false: 0}[withCA] {
				t.Errorf("with CA %v, %s: %q", withCA, f, got)
			}
		}
		if got := read(at.added); strings.Count(got, "PROXY-A") != 1 || strings.Contains(got, "SYSTEM-ROOT") ||
			strings.Count(got, "CAPSEM") != map[bool]int{true: 1, false: 0}[withCA] {
			t.Errorf("with CA %v: what capsem adds, alone: %q", withCA, got)
		}
		if _, err := os.Stat(at.ca); (err == nil) != withCA {
			t.Errorf("with CA %v: the CA file: %v", withCA, err)
		}
	}
}
