package netca

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLoadOrCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "net-ca.pem")
	// Processes start VMs at once: every one must end with the same CA.
	cas := make([]*CA, 8)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			ca, err := LoadOrCreate(path)
			if err != nil {
				t.Error(err)
			}
			cas[i] = ca
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, ca := range cas[1:] {
		if !ca.Certificate().Equal(cas[0].Certificate()) {
			t.Fatal("two processes made two CAs")
		}
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("CA file mode %#o, want 0600", info.Mode().Perm())
	}
	if dir, _ := os.Stat(filepath.Dir(path)); dir.Mode().Perm() != 0o700 {
		t.Fatalf("CA directory mode %#o, want 0700", dir.Mode().Perm())
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".netca-*"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
	if strings.Contains(string(cas[0].CertPEM()), "PRIVATE KEY") {
		t.Fatal("the certificate handed to guests carries the key")
	}
}

func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.pem")
	if _, err := LoadOrCreate(good); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(good)
	certOnly := data[:strings.Index(string(data), "-----BEGIN PRIVATE KEY")]
	other, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	otherKey := other[strings.Index(string(other), "-----BEGIN PRIVATE KEY"):]
	cases := []struct {
		name string
		data []byte
		mode os.FileMode
		want string
	}{
		{"readable by others", data, 0o644, "must be readable by its owner only (0600)"},
		{"group readable", data, 0o640, "owner only"},
		{"no key", certOnly, 0o600, "no key"},
		{"someone else's key", append(append([]byte{}, certOnly...), otherKey...), 0o600, "the key does not belong to the certificate"},
		{"not PEM", []byte("hello"), 0o600, "no certificate"},
		{"too big", make([]byte, maxFileBytes+10), 0o600, "larger than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(p, tc.data, tc.mode); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, tc.mode)
			_, err := LoadOrCreate(p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("error %v, want one naming %s and %q", err, p, tc.want)
			}
		})
	}
}

func TestLeaf(t *testing.T) {
	ca, err := LoadOrCreate(filepath.Join(t.TempDir(), "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	leaf, err := ca.Leaf("api.example.com")
	if err != nil {
		t.Fatal(err)
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: "api.example.com", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := leaf.Leaf.Verify(opts); err != nil {
		t.Fatalf("the leaf does not verify for its name: %v", err)
	}
	opts.DNSName = "other.example.com"
	if _, err := leaf.Leaf.Verify(opts); err == nil {
		t.Fatal("a leaf for api.example.com verified for other.example.com")
	}
	if d := leaf.Leaf.NotAfter.Sub(time.Now()); d > LeafValidity || d < LeafValidity-time.Minute {
		t.Fatalf("leaf valid for %s more, want about %s", d, LeafValidity)
	}
	again, _ := ca.Leaf("api.example.com")
	if again != leaf {
		t.Fatal("a fresh leaf was issued while the cached one had a day to run")
	}
	for i := range maxLeaves + 5 {
		if _, err := ca.Leaf(strings.Repeat("a", i%50+1) + ".example"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(ca.leaves); n > maxLeaves {
		t.Fatalf("%d leaves cached, bound %d", n, maxLeaves)
	}
}

func FuzzParse(f *testing.F) {
	data, err := generate()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		ca, err := parse(b)
		if err == nil && (ca.cert == nil || ca.key == nil || !ca.key.PublicKey.Equal(ca.cert.PublicKey)) {
			t.Fatal("parse accepted a CA without a matching key")
		}
	})
}
