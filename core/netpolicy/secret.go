package netpolicy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/capsem/capsem/core/unixsock"
)

// MaxSecretBytes bounds a credential's source file.
const MaxSecretBytes = 16 << 10

// ExpandPath resolves a configured "~/…" against the user's home.
func ExpandPath(p string) (string, error) {
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

// ReadSecret reads the credential's real value: from a file only its
// owner may read (refused otherwise, like an ssh key), or from this
// process's environment. Errors name the source, never the value.
func (cr CredentialRule) ReadSecret() (string, error) {
	var value string
	if cr.SourceEnv != "" {
		v, ok := os.LookupEnv(cr.SourceEnv)
		if !ok || strings.TrimSpace(v) == "" {
			return "", fmt.Errorf("source_env %s is not set in the service's environment", cr.SourceEnv)
		}
		value = v
	} else {
		path, err := ExpandPath(cr.SourceFile)
		if err != nil {
			return "", err
		}
		b, err := unixsock.ReadPrivateFile(path, MaxSecretBytes)
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
	case strings.Contains(value, PlaceholderPrefix):
		return "", fmt.Errorf("the credential for %s is a placeholder, not the real value", cr.Host)
	}
	return value, nil
}
