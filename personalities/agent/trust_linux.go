package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/capsem/capsem/core/guestwire"
)

// maxSystemBundle bounds the distribution's CA bundle read.
const maxSystemBundle = 8 << 20

// trustCA makes the guest's TLS clients trust ca (PEM, the capsem CA;
// nil for none) and extra (PEM, more roots the host trusts; nil for none):
// ca is written alone, both are appended to the distribution's bundle for
// programs that read only that, and the bundle with them is the one
// SSL_CERT_FILE names. Written again at every boot config, each is added
// once. Where the distribution has a bundle, both are also among its
// local certificates, so the bundle made anew (update-ca-certificates,
// which a package's install can run) still has them.
func trustCA(ca, extra []byte) error {
	return trustCAAt(ca, extra, trustPaths{ca: guestwire.GuestCAFile, bundle: guestwire.GuestCABundle, system: guestwire.GuestSystemBundle,
		added: guestwire.GuestExtraCAs, local: localCAs})
}

// localCAs is capsem's file among the distribution's local certificates
// (update-ca-certificates adds each *.crt there to the bundle it makes).
const localCAs = "/usr/local/share/ca-certificates/capsem.crt"

// trustPaths are the files trustCA writes: the capsem CA alone, the
// bundle of everything trusted, the distribution's bundle, what capsem
// adds to it alone, and the same among the distribution's local
// certificates (written only where its directory exists).
type trustPaths struct{ ca, bundle, system, added, local string }

func trustCAAt(ca, extra []byte, at trustPaths) error {
	var add [][]byte
	if len(bytes.TrimSpace(ca)) > 0 {
		ca = append(bytes.Clone(bytes.TrimSpace(ca)), '\n')
		if err := writeTrustFile(at.ca, ca); err != nil {
			return err
		}
		add = append(add, ca)
	}
	if len(bytes.TrimSpace(extra)) > 0 {
		add = append(add, append(bytes.Clone(bytes.TrimSpace(extra)), '\n'))
	}
	system, err := readBounded(at.system, maxSystemBundle)
	hasSystem := err == nil // a root without one (busybox) gets none made
	switch {
	case errors.Is(err, fs.ErrNotExist):
		system = nil
	case err != nil:
		return err
	}
	added := false
	for _, pem := range add {
		if bytes.Contains(system, bytes.TrimSpace(pem)) {
			continue
		}
		system = append(append(system, '\n'), pem...)
		added = true
	}
	if hasSystem && added {
		// Replaced whole rather than appended to: on the full root the
		// distribution's bundle is in the read-only image, and an append
		// would first copy it up into the VM's layer, synced.
		if err := writeRemadeFile(at.system, system, 0, maxSystemBundle+guestwire.MaxTrustCA+guestwire.MaxExtraRoots); err != nil {
			return fmt.Errorf("adding to %s: %w", at.system, err)
		}
	}
	if err := writeTrustFile(at.added, bytes.Join(add, nil)); err != nil {
		return err
	}
	if hasSystem && at.local != "" {
		if _, err := os.Stat(filepath.Dir(at.local)); err == nil {
			if err := writeTrustFile(at.local, bytes.Join(add, nil)); err != nil {
				return err
			}
		}
	}
	return writeTrustFile(at.bundle, bytes.TrimLeft(system, "\n"))
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}

// writeTrustFile replaces path with data, readable by all, whole (the
// agent's file write: no link followed, renamed into place).
func writeTrustFile(path string, data []byte) error {
	return writeRemadeFile(path, data, 0o644, maxSystemBundle+guestwire.MaxTrustCA+guestwire.MaxExtraRoots)
}
