package guestwire

import (
	"bytes"
	"fmt"
	"io/fs"
	"strings"
)

// GuestMCPSocket is the Unix socket inside the guest where the agent bridges
// connections to logical port 5002 (the host MCP endpoint). Only the agent
// may own the virtio port, so the relay (capsem-mcp-server, a separate guest
// process) reaches the host through this socket.
const GuestMCPSocket = "/run/capsem/mcp.sock"

// Error lets a wire Error travel as a Go error on both ends.
func (e *Error) Error() string { return e.Message }

// Is maps the codes that have an io/fs equivalent, so callers can write
// errors.Is(err, fs.ErrNotExist).
func (e *Error) Is(target error) bool {
	switch target {
	case fs.ErrNotExist:
		return e.Code == CodeNotFound
	case fs.ErrExist:
		return e.Code == CodeExists
	case fs.ErrPermission:
		return e.Code == CodePermission
	}
	return false
}

// Errorf returns a wire error with a code and a message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// blockedEnvKeys change how a shell or the dynamic loader behaves before the
// command the caller meant to run even starts; injecting them would let a
// boot config or exec request run code the command never asked for.
var blockedEnvKeys = map[string]bool{
	"BASH_ENV":       true,
	"ENV":            true,
	"IFS":            true,
	"PS4":            true,
	"PROMPT_COMMAND": true,
	"SHELLOPTS":      true,
	"BASHOPTS":       true,
	"GLOBIGNORE":     true,
	"CDPATH":         true,
}

// ValidateEnvKey refuses an environment variable name that is empty, too
// long, contains '=' or NUL, or is on the injection blocklist (LD_*,
// BASH_FUNC_*, BASH_ENV, ENV, IFS, PS4, PROMPT_COMMAND, SHELLOPTS, BASHOPTS,
// GLOBIGNORE, CDPATH). PATH is allowed.
func ValidateEnvKey(key string) error {
	switch {
	case key == "":
		return Errorf(CodeInvalid, "environment variable name is empty")
	case len(key) > MaxEnvKey:
		return Errorf(CodeInvalid, "environment variable name %.32q… is %d bytes, the limit is %d", key, len(key), MaxEnvKey)
	case strings.ContainsAny(key, "=\x00"):
		return Errorf(CodeInvalid, "environment variable name %q contains '=' or NUL", key)
	case strings.HasPrefix(key, "LD_"):
		return Errorf(CodeInvalid, "environment variable %s is refused: LD_* variables change how every program is loaded", key)
	case strings.HasPrefix(key, "BASH_FUNC_"):
		return Errorf(CodeInvalid, "environment variable %s is refused: it defines a shell function", key)
	case blockedEnvKeys[key]:
		return Errorf(CodeInvalid, "environment variable %s is refused: it changes how the shell runs commands", key)
	}
	return nil
}

// ValidateEnv checks every key (ValidateEnvKey), every value (no NUL, at most
// MaxEnvValue bytes) and the count (at most MaxEnvVars).
func ValidateEnv(env map[string]string) error {
	if len(env) > MaxEnvVars {
		return Errorf(CodeInvalid, "environment has %d variables, the limit is %d", len(env), MaxEnvVars)
	}
	for k, v := range env {
		if err := ValidateEnvKey(k); err != nil {
			return err
		}
		if len(v) > MaxEnvValue {
			return Errorf(CodeInvalid, "environment variable %s has a value of %d bytes, the limit is %d", k, len(v), MaxEnvValue)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return Errorf(CodeInvalid, "environment variable %s has a NUL byte in its value", k)
		}
	}
	return nil
}

// ValidatePath refuses a path that is not absolute, is too long, contains NUL
// or a ".." component. The guest resolves paths itself, component by
// component, so "." and repeated slashes are harmless and allowed.
func ValidatePath(path string) error {
	switch {
	case path == "":
		return Errorf(CodeInvalid, "path is empty")
	case len(path) > MaxPath:
		return Errorf(CodeInvalid, "path of %d bytes, the limit is %d", len(path), MaxPath)
	case strings.IndexByte(path, 0) >= 0:
		return Errorf(CodeInvalid, "path %q contains a NUL byte", path)
	case path[0] != '/':
		return Errorf(CodeInvalid, "path %q is not absolute", path)
	}
	for _, c := range strings.Split(path, "/") {
		if c == ".." {
			return Errorf(CodeInvalid, "path %q contains a \"..\" component", path)
		}
	}
	return nil
}

// ValidateExec checks an Exec request: exactly one of Argv and Shell, bounded
// argv without NUL, a valid environment, an absolute cwd, non-negative
// timeout and caps not above MaxOutputCap.
func ValidateExec(e *Exec) error {
	if e == nil {
		return Errorf(CodeInvalid, "exec request has no exec payload")
	}
	switch {
	case len(e.Argv) == 0 && e.Shell == "":
		return Errorf(CodeInvalid, "exec needs argv or a shell command")
	case len(e.Argv) > 0 && e.Shell != "":
		return Errorf(CodeInvalid, "exec takes argv or a shell command, not both")
	case len(e.Argv) > MaxArgv:
		return Errorf(CodeInvalid, "argv has %d entries, the limit is %d", len(e.Argv), MaxArgv)
	case len(e.Argv) > 0 && e.Argv[0] == "":
		return Errorf(CodeInvalid, "argv[0] is empty")
	case strings.IndexByte(e.Shell, 0) >= 0:
		return Errorf(CodeInvalid, "shell command contains a NUL byte")
	case e.TimeoutMS < 0:
		return Errorf(CodeInvalid, "timeout_ms %d is negative", e.TimeoutMS)
	case e.StdoutCap < 0 || e.StdoutCap > MaxOutputCap:
		return Errorf(CodeInvalid, "stdout_cap %d is outside 0..%d", e.StdoutCap, MaxOutputCap)
	case e.StderrCap < 0 || e.StderrCap > MaxOutputCap:
		return Errorf(CodeInvalid, "stderr_cap %d is outside 0..%d", e.StderrCap, MaxOutputCap)
	}
	for i, a := range e.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return Errorf(CodeInvalid, "argv[%d] contains a NUL byte", i)
		}
	}
	if e.Cwd != "" {
		if err := ValidatePath(e.Cwd); err != nil {
			return Errorf(CodeInvalid, "cwd: %s", err)
		}
	}
	return ValidateEnv(e.Env)
}

// MaxTrustCA bounds BootConfig.TrustCA; MaxExtraRoots bounds
// BootConfig.ExtraRoots.
const (
	MaxTrustCA    = 16 << 10
	MaxExtraRoots = 1 << 20
)

// ValidateBootConfig checks the environment, the files (count, paths) and the
// host name.
func ValidateBootConfig(c *BootConfig) error {
	if c == nil {
		return Errorf(CodeInvalid, "boot_config request has no boot_config payload")
	}
	if err := ValidateEnv(c.Env); err != nil {
		return err
	}
	if len(c.Files) > MaxBootFiles {
		return Errorf(CodeInvalid, "boot config has %d files, the limit is %d", len(c.Files), MaxBootFiles)
	}
	for _, f := range c.Files {
		if err := ValidatePath(f.Path); err != nil {
			return Errorf(CodeInvalid, "boot file: %s", err)
		}
		if len(f.Data) > MaxBootFileSize {
			return Errorf(CodeTooLarge, "boot file %s is %d bytes, the limit is %d", f.Path, len(f.Data), MaxBootFileSize)
		}
		if f.Mode&^0o7777 != 0 {
			return Errorf(CodeInvalid, "boot file %s has mode %#o: only permission bits are allowed", f.Path, f.Mode)
		}
	}
	if len(c.TrustCA) > 0 {
		if len(c.TrustCA) > MaxTrustCA {
			return Errorf(CodeTooLarge, "trust_ca is %d bytes, the limit is %d", len(c.TrustCA), MaxTrustCA)
		}
		if !bytes.HasPrefix(bytes.TrimSpace(c.TrustCA), []byte("-----BEGIN CERTIFICATE-----")) {
			return Errorf(CodeInvalid, "trust_ca is not a PEM certificate")
		}
	}
	if len(c.ExtraRoots) > 0 {
		if len(c.ExtraRoots) > MaxExtraRoots {
			return Errorf(CodeTooLarge, "extra_roots is %d bytes, the limit is %d", len(c.ExtraRoots), MaxExtraRoots)
		}
		if !bytes.HasPrefix(bytes.TrimSpace(c.ExtraRoots), []byte("-----BEGIN CERTIFICATE-----")) {
			return Errorf(CodeInvalid, "extra_roots are not PEM certificates")
		}
	}
	if len(c.Hostname) > MaxHostname {
		return Errorf(CodeInvalid, "hostname of %d bytes, the limit is %d", len(c.Hostname), MaxHostname)
	}
	if strings.ContainsAny(c.Hostname, "\x00/ \t\n") {
		return Errorf(CodeInvalid, "hostname %q contains NUL, '/' or white space", c.Hostname)
	}
	if len(c.VMID) > MaxVMID || strings.ContainsFunc(c.VMID, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}) {
		return Errorf(CodeInvalid, "vm_id %q: want at most %d of [a-z0-9-]", c.VMID, MaxVMID)
	}
	return nil
}

// OutputCap returns the effective cap for a requested one.
func OutputCap(requested int64) int64 {
	if requested < MinOutputCap {
		return MinOutputCap
	}
	if requested > MaxOutputCap {
		return MaxOutputCap
	}
	return requested
}

// ValidateWake checks a wake message: a seed of MinWakeSeed..MaxWakeSeed
// bytes and a clock that is not negative.
func ValidateWake(w *Wake) error {
	if w == nil {
		return Errorf(CodeInvalid, "wake message has no wake payload")
	}
	if len(w.Seed) < MinWakeSeed || len(w.Seed) > MaxWakeSeed {
		return Errorf(CodeInvalid, "wake seed of %d bytes: want %d to %d", len(w.Seed), MinWakeSeed, MaxWakeSeed)
	}
	if w.ClockUnixNano < 0 {
		return Errorf(CodeInvalid, "wake clock %d is negative", w.ClockUnixNano)
	}
	return nil
}
