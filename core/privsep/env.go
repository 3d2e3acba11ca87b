package privsep

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/capsem/capsem/core/envvars"
)

// The environment variables with a meaning to this package are declared in
// core/envvars:
//   - PrivsepStage marks the first stage; only [Command] sets it.
//   - PrivsepPolicy carries the encoded policy to the first stage.
//   - ParentPID carries the parent's pid to the first stage, which exits
//     when getppid no longer matches: the parent died before the
//     parent-death signal was armed. It is removed before the second stage.
//   - Sandbox is set in the second stage and lists, comma-separated, the
//     mechanisms the first stage applied: "nnp", "caps", "landlock-v<ABI>",
//     "seccomp". It is informational (a doctor can print it); an
//     unrestricted process can set it too.

// stageSandbox is the only value of envvars.PrivsepStage [Enter] accepts.
const stageSandbox = "sandbox"

// SafePath is the PATH every child starts with: system directories only, so
// that nothing from the user's PATH (which may point into writable or
// session directories) is searched.
const SafePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Bounds on caller-supplied environment entries; the kernel refuses single
// strings over 128 KiB, and a clear error beats an E2BIG from fork/exec.
const (
	maxEnvName  = 256
	maxEnvValue = 32 << 10
)

// DefaultPassEnv returns the names copied from the parent's environment into
// every child when they are set. A trailing "*" matches a prefix.
func DefaultPassEnv() []string {
	return []string{"USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ"}
}

// reserved reports names that only this package may set.
func reserved(name string) bool {
	return name == envvars.PrivsepStage.Name() || name == envvars.PrivsepPolicy.Name() ||
		name == envvars.ParentPID.Name() || name == envvars.Sandbox.Name()
}

// dangerous reports names that change what runs before any program code
// does (dynamic loader, shell start-up, exported shell functions). They are
// refused so that configured env cannot smuggle code into a child; the same
// list guards env injection into the guest.
func dangerous(name string) bool {
	return strings.HasPrefix(name, "LD_") || name == "BASH_ENV" || name == "ENV" ||
		strings.HasPrefix(name, "BASH_FUNC_")
}

// CheckEnv reports why a variable may not be given to a sandboxed child
// (an MCP server's configured env included): empty or malformed names,
// the sandbox's own, those that run code before the program does (LD_*,
// BASH_ENV, ENV, BASH_FUNC_*), oversized or NUL-bearing values.
func CheckEnv(name, value string) error { return checkEnvEntry(name, value) }

// checkEnvEntry validates one caller-supplied name and value.
func checkEnvEntry(name, value string) error {
	switch {
	case name == "":
		return errors.New("empty environment variable name")
	case len(name) > maxEnvName:
		return fmt.Errorf("environment variable name %.32q... longer than %d bytes", name, maxEnvName)
	case strings.ContainsAny(name, "=\x00"):
		return fmt.Errorf("environment variable name %q contains '=' or NUL", name)
	case reserved(name):
		return fmt.Errorf("environment variable %s is reserved for the sandbox", name)
	case dangerous(name):
		return fmt.Errorf("environment variable %s is not allowed (loader or shell start-up)", name)
	case len(value) > maxEnvValue:
		return fmt.Errorf("environment variable %s: value longer than %d bytes", name, maxEnvValue)
	case strings.ContainsRune(value, 0):
		return fmt.Errorf("environment variable %s: value contains NUL", name)
	}
	return nil
}

// checkPattern validates a PassEnv entry.
func checkPattern(p string) error {
	name := strings.TrimSuffix(p, "*")
	if strings.Contains(name, "*") {
		return fmt.Errorf("pass-through pattern %q: '*' is only allowed at the end", p)
	}
	if name == "" {
		return fmt.Errorf("pass-through pattern %q matches every variable", p)
	}
	if strings.ContainsAny(name, "=\x00") {
		return fmt.Errorf("pass-through pattern %q contains '=' or NUL", p)
	}
	if !strings.HasSuffix(p, "*") {
		// Exact names get the same refusal as Spec.Env; patterns merely skip
		// such names, so "CAPSEM_*" stays usable.
		if reserved(name) {
			return fmt.Errorf("pass-through name %s is reserved for the sandbox", name)
		}
		if dangerous(name) {
			return fmt.Errorf("pass-through name %s is not allowed (loader or shell start-up)", name)
		}
	}
	return nil
}

func matchPattern(p, name string) bool {
	if prefix, ok := strings.CutSuffix(p, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return p == name
}

// buildEnv computes the child's allowlisted environment (without the private
// stage variables) from spec and the parent's environment, given as
// os.Environ() returns it.
func buildEnv(spec Spec, parent []string) (map[string]string, error) {
	patterns := append(DefaultPassEnv(), spec.PassEnv...)
	for _, p := range spec.PassEnv {
		if err := checkPattern(p); err != nil {
			return nil, err
		}
	}
	env := make(map[string]string)
	for _, kv := range parent {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || name == "" || reserved(name) || dangerous(name) || strings.ContainsRune(value, 0) {
			continue
		}
		if slices.ContainsFunc(patterns, func(p string) bool { return matchPattern(p, name) }) {
			env[name] = value
		}
	}
	env["PATH"] = SafePath
	env["HOME"] = spec.Scratch
	env["TMPDIR"] = spec.Scratch
	if spec.CacheDir != "" {
		env["XDG_CACHE_HOME"] = spec.CacheDir
		env["npm_config_cache"] = filepath.Join(spec.CacheDir, "npm")
	}
	for name, value := range spec.Env {
		if err := checkEnvEntry(name, value); err != nil {
			return nil, err
		}
		env[name] = value
	}
	return env, nil
}

// envList renders env as sorted NAME=value entries; sorting makes the
// child's environment (and tests) deterministic.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for name, value := range env {
		out = append(out, name+"="+value)
	}
	slices.Sort(out)
	return out
}
