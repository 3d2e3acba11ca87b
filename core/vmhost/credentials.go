package vmhost

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netca"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/paths"
)

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

// maxRootFile bounds one guest_roots file.
const maxRootFile = 256 << 10

// guestRoots reads the CA certificates the guest is to trust beside the
// distribution's (the [net] guest_roots files, globs expanded) as one PEM
// bundle, at most guestwire.MaxExtraRoots. A file that cannot be read or
// holds no certificate is logged and skipped: the VM still starts, its
// TLS clients trusting what they would without it.
func guestRoots(log *slog.Logger, patterns []string) []byte {
	var out []byte
	seen := map[string]bool{}
	for _, pattern := range patterns {
		expanded, err := netpolicy.ExpandPath(pattern)
		if err != nil {
			log.Warn("net.guest_roots: skipping an entry", "entry", pattern, "err", err)
			continue
		}
		files, err := filepath.Glob(expanded)
		if err != nil {
			log.Warn("net.guest_roots: skipping an entry", "entry", pattern, "err", err)
			continue
		}
		for _, f := range files {
			if seen[f] {
				continue
			}
			seen[f] = true
			certs, err := readRoots(f)
			if err != nil {
				log.Warn("net.guest_roots: skipping a file", "file", f, "err", err)
				continue
			}
			if len(out)+len(certs) > guestwire.MaxExtraRoots {
				log.Warn("net.guest_roots: past the bound, the rest is not trusted", "file", f, "bound_bytes", guestwire.MaxExtraRoots)
				return out
			}
			out = append(out, certs...)
		}
	}
	return out
}

// readRoots is the certificates of a PEM file, re-encoded (nothing but
// CERTIFICATE blocks that parse).
func readRoots(path string) ([]byte, error) {
	// Non-blocking, and regular files only: a FIFO a glob matched must
	// not hang the VM's start.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%v)", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxRootFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRootFile {
		return nil, fmt.Errorf("larger than %d bytes", maxRootFile)
	}
	var out []byte
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return nil, fmt.Errorf("a certificate that does not parse: %w", err)
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: block.Bytes})...)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return out, nil
}
