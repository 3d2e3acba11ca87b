package vmhost

import (
	"crypto/tls"
	"fmt"
	"sync"

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
