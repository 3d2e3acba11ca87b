package netpolicy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	case strings.Contains(value, PlaceholderPrefix):
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
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSecretBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxSecretBytes)
	}
	return b, nil
}
