package privsep

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// Spec describes one sandboxed child. It is plain data; the caller connects
// stdin/stdout/stderr on the *exec.Cmd that [Command] returns.
type Spec struct {
	// Executable is the absolute path of the program to run, normally
	// os.Executable() of capsem. It is granted read+execute, because the
	// first stage re-executes it.
	Executable string
	// Args are argv[1:]; argv[0] is Executable.
	Args []string
	// Run, when set, is the program the sandboxed child becomes: the first
	// stage (Executable, which must call [Enter]) applies the restrictions
	// and then execs Run instead of re-executing itself. Run[0] is an
	// absolute path; it is granted read+execute. This is how a sandboxed
	// process starts a program that is not capsem (an external stdio MCP
	// server) in a sandbox of its own, nested in the caller's.
	Run []string
	// Env holds extra variables, e.g. a server's configured env. It wins
	// over everything else; see the package documentation for what it may
	// not contain.
	Env map[string]string
	// PassEnv lists further names copied from the parent's environment when
	// set, in addition to [DefaultPassEnv]. A trailing "*" matches a prefix.
	PassEnv []string
	// Scratch is a private directory for the child (required). HOME and
	// TMPDIR point at it, it is the working directory, and it is granted
	// read/write/create. It is created (0700) when missing.
	Scratch string
	// CacheDir is a package cache shared between children of different
	// VMs (optional), granted read/write/create/execute and advertised as
	// XDG_CACHE_HOME and npm_config_cache. Anything a child writes there
	// can run in another VM's child: share it only among servers you would
	// trust with each other. It is created (0700) when missing.
	CacheDir string
	// ReadOnly, ReadWrite and Exec are extra grants: read; read, write and
	// create; read and execute. Every path must exist.
	ReadOnly, ReadWrite, Exec []string
	// Protect lists paths that must stay unreachable (session directory,
	// session.db, service socket). Command fails when a grant contains one
	// of them or lies inside one.
	Protect []string
	// LandlockBestEffort lets the child run without Landlock when the kernel
	// lacks it (an error is logged). The default fails closed: the child
	// exits with an error naming the problem.
	LandlockBestEffort bool
}

// access is a named set of filesystem rights; the first stage maps it to
// Landlock bits for the kernel's ABI.
type access string

const (
	accessRead      access = "r"   // read files, list directories
	accessReadExec  access = "rx"  // plus execute
	accessReadWrite access = "rw"  // read, write, create, remove, rename, truncate
	accessRWExec    access = "rwx" // read-write plus execute
	accessDevice    access = "dev" // read, write and truncate a device file; no ioctl
)

func (a access) valid() bool {
	switch a {
	case accessRead, accessReadExec, accessReadWrite, accessRWExec, accessDevice:
		return true
	}
	return false
}

// rule grants access beneath Path. Optional rules are skipped when the path
// does not exist (system defaults differ between distributions); the others
// make the first stage fail.
type rule struct {
	Path     string `json:"path"`
	Access   access `json:"access"`
	Optional bool   `json:"optional,omitempty"`
}

// policy is what the parent hands the first stage, in an environment
// variable. The parent computes the full list so the child only applies it.
type policy struct {
	Version    int    `json:"v"`
	Rules      []rule `json:"rules"`
	BestEffort bool   `json:"best_effort,omitempty"`
	// Run is Spec.Run: what the first stage execs (empty: itself).
	Run []string `json:"run,omitempty"`
}

const (
	policyVersion = 1
	// maxEncodedPolicy keeps the variable well under the kernel's 128 KiB
	// limit on one environment string.
	maxEncodedPolicy = 64 << 10
	maxRules         = 512
	maxPathLen       = 4096
	maxRunArgs       = 1024
)

var policyEncoding = base64.RawURLEncoding.Strict()

// Default grants; see the package documentation for why each is there.
var (
	defaultExecDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}
	// defaultEtc is deliberately not /etc: see the package documentation.
	defaultEtc = []string{
		"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ld.so.preload",
		"/etc/nsswitch.conf", "/etc/host.conf", "/etc/hosts", "/etc/resolv.conf", "/etc/gai.conf",
		"/etc/services", "/etc/protocols", "/etc/networks", "/etc/hostname",
		"/etc/passwd", "/etc/group",
		"/etc/localtime", "/etc/timezone",
		"/etc/ssl", "/etc/ca-certificates", "/etc/ca-certificates.conf", "/etc/pki", "/etc/crypto-policies",
		"/etc/mime.types", "/etc/os-release", "/etc/lsb-release", "/etc/debian_version",
		"/etc/npmrc", "/etc/gitconfig", "/etc/locale.alias",
	}
	defaultReadDirs = []string{
		"/proc",
		"/sys/devices/system/cpu", "/sys/devices/system/node", "/sys/fs/cgroup",
		"/sys/kernel/mm/transparent_hugepage",
	}
	defaultDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"}
)

// buildPolicy turns spec into the full rule list. It checks that every
// caller path is absolute and exists, so that mistakes surface in the
// parent rather than as a child that dies at start.
func buildPolicy(spec Spec) (policy, error) {
	p := policy{Version: policyVersion, BestEffort: spec.LandlockBestEffort}
	for _, d := range defaultExecDirs {
		p.Rules = append(p.Rules, rule{Path: d, Access: accessReadExec, Optional: true})
	}
	for _, f := range defaultEtc {
		p.Rules = append(p.Rules, rule{Path: f, Access: accessRead, Optional: true})
	}
	for _, d := range defaultReadDirs {
		p.Rules = append(p.Rules, rule{Path: d, Access: accessRead, Optional: true})
	}
	for _, d := range defaultDevices {
		p.Rules = append(p.Rules, rule{Path: d, Access: accessDevice, Optional: true})
	}
	add := func(what string, paths []string, a access) error {
		for _, path := range paths {
			if err := checkPath(path); err != nil {
				return fmt.Errorf("%s: %w", what, err)
			}
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("%s %s: %w", what, path, err)
			}
			p.Rules = append(p.Rules, rule{Path: filepath.Clean(path), Access: a})
		}
		return nil
	}
	if err := add("executable", []string{spec.Executable}, accessReadExec); err != nil {
		return policy{}, err
	}
	if len(spec.Run) > 0 {
		if err := checkRun(spec.Run); err != nil {
			return policy{}, err
		}
		if err := add("program", spec.Run[:1], accessReadExec); err != nil {
			return policy{}, err
		}
		p.Run = spec.Run
	}
	if err := add("scratch directory", []string{spec.Scratch}, accessReadWrite); err != nil {
		return policy{}, err
	}
	if spec.CacheDir != "" {
		if err := add("cache directory", []string{spec.CacheDir}, accessRWExec); err != nil {
			return policy{}, err
		}
	}
	if err := add("read-only path", spec.ReadOnly, accessRead); err != nil {
		return policy{}, err
	}
	if err := add("read-write path", spec.ReadWrite, accessReadWrite); err != nil {
		return policy{}, err
	}
	if err := add("executable path", spec.Exec, accessReadExec); err != nil {
		return policy{}, err
	}
	if len(p.Rules) > maxRules {
		return policy{}, fmt.Errorf("sandbox policy has %d rules, more than %d", len(p.Rules), maxRules)
	}
	if err := checkProtected(p.Rules, spec.Protect); err != nil {
		return policy{}, err
	}
	return p, nil
}

// checkRun validates the argv the first stage execs.
func checkRun(argv []string) error {
	if len(argv) > maxRunArgs {
		return fmt.Errorf("program has %d arguments, more than %d", len(argv), maxRunArgs)
	}
	if err := checkPath(argv[0]); err != nil {
		return fmt.Errorf("program: %w", err)
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("program argument %d contains NUL", i)
		}
	}
	return nil
}

// checkPath validates a path before it goes into a policy.
func checkPath(path string) error {
	switch {
	case path == "":
		return errors.New("empty path")
	case len(path) > maxPathLen:
		return fmt.Errorf("path longer than %d bytes", maxPathLen)
	case strings.ContainsRune(path, 0):
		return fmt.Errorf("path %q contains NUL", path)
	case !utf8.ValidString(path):
		// The policy travels as JSON, which would silently turn the bytes
		// into U+FFFD and so grant a different path.
		return fmt.Errorf("path %q is not valid UTF-8", path)
	case !filepath.IsAbs(path):
		return fmt.Errorf("path %q is not absolute", path)
	}
	return nil
}

// resolve returns path with symlinks resolved, as Landlock sees it (rules
// bind to the inode that opening the path reaches), or the cleaned path when
// it does not exist.
func resolve(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return filepath.Clean(path)
}

// within reports whether path is dir or lies beneath it.
func within(path, dir string) bool {
	if path == dir || dir == "/" {
		return true
	}
	return strings.HasPrefix(path, dir+"/")
}

// checkProtected refuses rules that would open a protected path: a grant on
// the path itself or on a directory above it exposes it, and a grant inside
// it exposes part of it.
func checkProtected(rules []rule, protect []string) error {
	for _, prot := range protect {
		if err := checkPath(prot); err != nil {
			return fmt.Errorf("protected path: %w", err)
		}
		pr := resolve(prot)
		for _, r := range rules {
			rr := resolve(r.Path)
			if within(pr, rr) || within(rr, pr) {
				return fmt.Errorf("sandbox grant %s (%s) overlaps protected path %s", r.Path, r.Access, prot)
			}
		}
	}
	return nil
}

// encodePolicy renders p for the environment.
func encodePolicy(p policy) (string, error) {
	raw, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode sandbox policy: %w", err)
	}
	s := policyEncoding.EncodeToString(raw)
	if len(s) > maxEncodedPolicy {
		return "", fmt.Errorf("encoded sandbox policy is %d bytes, more than %d", len(s), maxEncodedPolicy)
	}
	return s, nil
}

// decodePolicy parses and validates the policy the first stage received. It
// is strict (unknown fields, trailing data, relative paths, unknown rights
// are errors) because a policy it misreads would be a hole in the sandbox.
func decodePolicy(s string) (policy, error) {
	if s == "" {
		return policy{}, errors.New("sandbox policy is empty")
	}
	if len(s) > maxEncodedPolicy {
		return policy{}, fmt.Errorf("sandbox policy is %d bytes, more than %d", len(s), maxEncodedPolicy)
	}
	raw, err := policyEncoding.DecodeString(s)
	if err != nil {
		return policy{}, fmt.Errorf("sandbox policy is not base64url: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var p policy
	if err := dec.Decode(&p); err != nil {
		return policy{}, fmt.Errorf("sandbox policy is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return policy{}, errors.New("sandbox policy has trailing data")
	}
	if p.Version != policyVersion {
		return policy{}, fmt.Errorf("sandbox policy version %d, want %d", p.Version, policyVersion)
	}
	if len(p.Rules) > maxRules {
		return policy{}, fmt.Errorf("sandbox policy has %d rules, more than %d", len(p.Rules), maxRules)
	}
	for i, r := range p.Rules {
		if err := checkPath(r.Path); err != nil {
			return policy{}, fmt.Errorf("sandbox policy rule %d: %w", i, err)
		}
		if filepath.Clean(r.Path) != r.Path {
			return policy{}, fmt.Errorf("sandbox policy rule %d: path %q is not clean", i, r.Path)
		}
		if !r.Access.valid() {
			return policy{}, fmt.Errorf("sandbox policy rule %d: unknown access %q", i, r.Access)
		}
	}
	if len(p.Run) > 0 {
		if err := checkRun(p.Run); err != nil {
			return policy{}, fmt.Errorf("sandbox policy: %w", err)
		}
	}
	return p, nil
}

// ExistingPaths returns the paths that exist, logging each one dropped
// (for a grant to a path that is missing, the child that needs it then
// fails alone, with its own clear error, instead of its whole sandbox
// failing to start).
func ExistingPaths(log *slog.Logger, paths []string, attrs ...any) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			log.Warn("sandbox grant skipped", append(attrs, "path", p, "err", err)...)
			continue
		}
		out = append(out, p)
	}
	return out
}
