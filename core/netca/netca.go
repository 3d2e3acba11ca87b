// Package netca is the per-install certificate authority with which the
// guest's network terminates TLS for the hosts that have credentials (and
// for no other host), so the per-VM process can put the real secret into a
// request the guest made with a placeholder.
//
// Threat model: the guest trusts this CA (its certificate is in the guest's
// trust store), so whoever holds its key can impersonate any site to every
// VM of this install. The key therefore lives only on the host, in one file
// of its owner's (0600, refused when anyone else may read it or it belongs
// to another user), and never crosses into a guest. Leaves are issued per
// name on demand, valid for a day, and kept in memory only.
package netca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/capsem/capsem/core/unixsock"
)

// Validity of the CA and of the leaves it issues.
const (
	CAValidity   = 10 * 365 * 24 * time.Hour
	LeafValidity = 24 * time.Hour
	// leafRenew is how close to its end a cached leaf is replaced.
	leafRenew = time.Hour
	// maxLeaves bounds the cache; past it the cache starts over.
	maxLeaves = 1024
	// maxFileBytes bounds the CA file read.
	maxFileBytes = 64 << 10
)

// CA issues leaf certificates.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	// leafKey signs every leaf's handshakes: one key per process is
	// enough (each leaf is a different certificate for it).
	leafKey *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// LoadOrCreate loads the CA kept in path, creating it (and its directory)
// when it does not exist. Two processes creating it at once end with the
// same CA: the file appears whole, once.
func LoadOrCreate(path string) (*CA, error) {
	ca, err := Load(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return ca, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	data, err := generate()
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".netca-*")
	if err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("netca: writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("netca: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	// A link never replaces: whoever links first made the CA.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("netca: %w", err)
	}
	return Load(path)
}

// Load reads the CA from path, refusing a file another user could read or
// replace.
func Load(path string) (*CA, error) {
	data, err := unixsock.ReadPrivateFile(path, maxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	ca, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("netca: %s: %w", path, err)
	}
	return ca, nil
}

// generate makes a new CA: its certificate and key, PEM.
func generate() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("netca: generating the key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Capsem sandbox CA (" + host + ")", Organization: []string{"Capsem"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("netca: signing the CA: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return append(out, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})...), nil
}

func randomSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	return serial, nil
}

// parse reads a CA file: one certificate and its PKCS#8 ECDSA key.
func parse(data []byte) (*CA, error) {
	ca := &CA{leaves: map[string]*tls.Certificate{}}
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			if ca.cert != nil {
				return nil, errors.New("more than one certificate")
			}
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("the certificate: %w", err)
			}
			ca.cert, ca.certPEM = cert, pem.EncodeToMemory(b)
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("the key: %w", err)
			}
			ek, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("the key is a %T, not ECDSA", k)
			}
			ca.key = ek
		default:
			return nil, fmt.Errorf("unexpected PEM block %q", b.Type)
		}
	}
	switch {
	case ca.cert == nil:
		return nil, errors.New("no certificate")
	case ca.key == nil:
		return nil, errors.New("no key")
	case !ca.cert.IsCA:
		return nil, errors.New("the certificate is not a CA's")
	case !ca.key.PublicKey.Equal(ca.cert.PublicKey):
		return nil, errors.New("the key does not belong to the certificate")
	}
	if time.Now().After(ca.cert.NotAfter) {
		return nil, fmt.Errorf("the CA expired on %s (remove the file to make a new one)", ca.cert.NotAfter.Format(time.DateOnly))
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the leaf key: %w", err)
	}
	ca.leafKey = leafKey
	return ca, nil
}

// CertPEM is the CA's certificate, for the guest's trust store.
func (c *CA) CertPEM() []byte { return c.certPEM }

// Certificate is the CA's certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Leaf is a certificate for name (a DNS name, as a TLS ClientHello's SNI
// gives it), issued now or taken from the cache while it has more than an
// hour to run.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[name]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(LeafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("netca: issuing a certificate for %q: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("netca: %w", err)
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: c.leafKey, Leaf: leaf}
	if len(c.leaves) >= maxLeaves {
		clear(c.leaves)
	}
	c.leaves[name] = l
	return l, nil
}
