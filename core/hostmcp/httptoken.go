package hostmcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// MinTokenBytes and MaxTokenBytes bound the bearer token of capsem mcp
// --http: long enough not to be guessed, short enough for a header.
const (
	MinTokenBytes = 16
	MaxTokenBytes = 4096
)

// ReadTokenFile reads the bearer token of capsem mcp --http from path (see
// ParseToken). The file must be a regular file only its owner may read or
// write: the token opens every sandbox to whoever holds it.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("--token-file %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("--token-file %s: mode %04o lets others than its owner at the token: chmod 600 it", path, perm)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenBytes+2))
	if err != nil {
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	tok, err := ParseToken(data)
	if err != nil {
		return "", fmt.Errorf("--token-file %s: %w", path, err)
	}
	return tok, nil
}

// ParseToken reads a token file's content: the token, on one line (an
// ending newline is allowed), of MinTokenBytes to MaxTokenBytes visible
// ASCII characters, as an Authorization header carries it.
func ParseToken(data []byte) (string, error) {
	tok := bytes.TrimSuffix(bytes.TrimSuffix(data, []byte("\n")), []byte("\r"))
	if len(tok) == 0 {
		return "", errors.New("empty: want the token on one line")
	}
	for i, c := range tok {
		if c < 0x21 || c > 0x7e {
			return "", fmt.Errorf("byte %d is %q: a token is visible ASCII on one line, without spaces", i, c)
		}
	}
	if len(tok) < MinTokenBytes {
		return "", fmt.Errorf("the token has %d characters: want at least %d (e.g. openssl rand -hex 32)", len(tok), MinTokenBytes)
	}
	if len(tok) > MaxTokenBytes {
		return "", fmt.Errorf("the token has more than %d characters", MaxTokenBytes)
	}
	return string(tok), nil
}
