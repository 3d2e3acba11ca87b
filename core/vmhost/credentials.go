package vmhost

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netca"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/paths"
)

// maxSecretBytes bounds a credential's source file.
const maxSecretBytes = 16 << 10

// credentialCA loads the install's CA on first use (the first VM of an
// install with credentials makes it) and keeps it for the VM's life.
type credentialCA struct {
	mu sync.Mutex
	ca *netca.CA
}

func (c *credentialCA) get() (*netca.CA, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ca != nil {
		return c.ca, nil
	}
	path, err := paths.NetCA()
	if err != nil {
		return nil, err
	}
	ca, err := netca.LoadOrCreate(path)
	if err != nil {
		return nil, err
	}
	c.ca = ca
	return ca, nil
}

// Leaf is netstack.CA's: a certificate for name from the install's CA.
func (c *credentialCA) Leaf(name string) (*tls.Certificate, error) {
	ca, err := c.get()
	if err != nil {
		return nil, err
	}
	return ca.Leaf(name)
}

// guestTrust is what the boot config gives the guest for credentials: the
// placeholder in each credential's variable, and the CA with the variables
// that point TLS clients at it. With no credential, nothing: the guest
// then trusts no capsem CA.
func (c *credentialCA) guestTrust(creds []netpolicy.CredentialRule) (map[string]string, []byte, error) {
	if len(creds) == 0 {
		return nil, nil, nil
	}
	ca, err := c.get()
	if err != nil {
		return nil, nil, fmt.Errorf("the network's CA for [[net.credentials]]: %w", err)
	}
	env := guestwire.TrustEnv()
	for _, cr := range creds {
		env[cr.GuestEnv] = cr.Placeholder
	}
	return env, ca.CertPEM(), nil
}

// expandPath resolves a configured "~/…" against the user's home.
func expandPath(p string) (string, error) {
	rest, ok := strings.CutPrefix(p, "~/")
	if !ok {
		return p, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", p, err)
	}
	return filepath.Join(home, rest), nil
}

// readSecret reads a credential's real value: from a file only its owner
// may read (refused otherwise, like an ssh key), or from this process's
// environment. Errors name the source, never the value.
func readSecret(cr netpolicy.CredentialRule) (string, error) {
	var value string
	if cr.SourceEnv != "" {
		v, ok := os.LookupEnv(cr.SourceEnv)
		if !ok || strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("source_env %s is not set in the service's environment", cr.SourceEnv)
		}
		value = v
	} else {
		path, err := expandPath(cr.SourceFile)
		if err != nil {
			return "", err
		}
		b, err := readPrivateFile(path)
		if err != nil {
			return "", fmt.Errorf("source_file %s: %w", cr.SourceFile, err)
		}
		value = string(b)
	}
	value = strings.TrimSpace(value)
	switch {
	case value == "":
		return "", fmt.Errorf("the credential for %s is empty", cr.Host)
	case strings.ContainsAny(value, "\r\n\x00"):
		return "", fmt.Errorf("the credential for %s holds a line break or NUL, which no header value may", cr.Host)
	case strings.Contains(value, netpolicy.PlaceholderPrefix):
		return "", fmt.Errorf("the credential for %s is a placeholder, not the real value", cr.Host)
	}
	return value, nil
}

func readPrivateFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("mode %#o: a secret must be readable by its owner only (chmod 600)", perm)
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("belongs to uid %d, not to this user", st.Uid)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSecretBytes {
		return nil, fmt.Errorf("larger than %d bytes", maxSecretBytes)
	}
	return b, nil
}
