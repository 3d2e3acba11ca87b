package guestwire

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// MaxImageEnv bounds the image environment file (GuestImageEnv).
const MaxImageEnv = 64 << 10

// ParseImageEnv reads a root image's environment file: one KEY=VALUE per
// line, taken literally (no quotes, no expansion); blank lines and lines
// starting with # are skipped. Names are shell variable names, and the
// result passes ValidateEnv, as a caller's environment must. A bad line is
// an error naming it.
func ParseImageEnv(data []byte) (map[string]string, error) {
	if len(data) > MaxImageEnv {
		return nil, fmt.Errorf("image environment: %d bytes, more than %d", len(data), MaxImageEnv)
	}
	env := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxImageEnv)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("image environment line %d: no '=' in %q", n, line)
		}
		if !validEnvName(key) {
			return nil, fmt.Errorf("image environment line %d: %q is not a variable name", n, key)
		}
		if strings.ContainsRune(value, 0) {
			return nil, fmt.Errorf("image environment line %d: %s holds a NUL byte", n, key)
		}
		env[key] = value
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("image environment: %w", err)
	}
	if err := ValidateEnv(env); err != nil {
		return nil, fmt.Errorf("image environment: %w", err)
	}
	return env, nil
}

// validEnvName: a letter or '_' first, then letters, digits and '_'.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
