package guestfs

import (
	"bytes"
	"crypto/sha512"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// A Recipe says what goes into a root image: Debian packages, npm tarballs
// unpacked at given paths, files and symlinks, the environment of every
// command in the VM, and the smoke checks the finished tree must pass. It
// is data (recipes/*.toml); its bytes are part of the image's cache key.
type Recipe struct {
	// Name names the image (refs/<name>).
	Name string `toml:"name"`
	// Suite is the Debian release; the host's apt sources must carry it.
	Suite string `toml:"suite"`
	// Packages are installed on top of Essential and apt.
	Packages []string          `toml:"packages"`
	Env      map[string]string `toml:"env"`
	NPM      []NPMPackage      `toml:"npm"`
	Files    []RecipeFile      `toml:"files"`
	Checks   []RecipeCheck     `toml:"checks"`

	// File names the recipe in errors; Source is its bytes.
	File   string `toml:"-"`
	Source []byte `toml:"-"`
}

// NPMPackage is one npm tarball, pinned by exact version and integrity.
type NPMPackage struct {
	// Spec is name@version with an exact version.
	Spec string `toml:"spec"`
	// Integrity is the registry's dist.integrity, "sha512-<base64>".
	Integrity string    `toml:"integrity"`
	Copy      []NPMCopy `toml:"copy"`
}

// NPMCopy puts one path of the tarball (a file or a directory) at To.
type NPMCopy struct {
	From string `toml:"from"`
	To   string `toml:"to"`
	// Mode, octal, overrides a copied file's mode (files only).
	Mode string `toml:"mode"`
}

// RecipeFile is a file with Content or, when Target is set, a symlink.
type RecipeFile struct {
	Path    string `toml:"path"`
	Mode    string `toml:"mode"`
	Content string `toml:"content"`
	Target  string `toml:"target"`
}

// RecipeCheck is a command run in the finished tree; it must exit 0 and,
// when Expect is set, print it.
type RecipeCheck struct {
	Run    []string `toml:"run"`
	Expect string   `toml:"expect"`
}

// GuestEnvironmentFile is where the image keeps Recipe.Env, one sorted
// KEY=VALUE a line, for the guest agent to give every command.
const GuestEnvironmentFile = "/etc/capsem/environment"

// DefaultRecipe names the embedded recipe images are built from by default.
const DefaultRecipe = "full"

//go:embed recipes/*.toml
var embeddedRecipes embed.FS

// RecipeNames lists the embedded recipes.
func RecipeNames() []string {
	ents, _ := fs.ReadDir(embeddedRecipes, "recipes")
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".toml"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// LoadRecipe parses the embedded recipe of that name.
func LoadRecipe(name string) (*Recipe, error) {
	file := "recipes/" + name + ".toml"
	data, err := embeddedRecipes.ReadFile(file)
	if err != nil || !recipeNameRE.MatchString(name) {
		return nil, fmt.Errorf("guestfs: no recipe %q (have %s)", name, strings.Join(RecipeNames(), ", "))
	}
	return ParseRecipe(file, data)
}

// ParseRecipe decodes and validates a recipe; file names it in errors.
// Unknown keys are errors, so a misspelt key cannot be silently ignored.
func ParseRecipe(file string, data []byte) (*Recipe, error) {
	var r Recipe
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, fmt.Errorf("%s: unknown key %s", file, strings.Join(keys, ", "))
	}
	r.File, r.Source = file, slices.Clone(data)
	if err := r.validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

var (
	recipeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)
	suiteRE      = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)
	// Debian policy 5.6.1; apt patterns and version pins are not accepted,
	// so the closure the cache key hashes is exactly what apt resolves.
	debPackageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	envKeyRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// name@version: an optional @scope/, then an exact semver version.
	npmSpecRE = regexp.MustCompile(`^((?:@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*)@` +
		`((?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?)$`)
)

// Guest directories the VM mounts over at boot: anything the image put
// there would be hidden.
var mountedOver = []string{"/dev", "/proc", "/sys", "/run", "/tmp"}

// errorf makes an error naming the file, the key and the reason.
func (r *Recipe) errorf(key, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %s", r.File, key, fmt.Sprintf(format, args...))
}

func (r *Recipe) validate() error {
	if !recipeNameRE.MatchString(r.Name) {
		return r.errorf("name", "%q is not a recipe name (lower-case letters, digits and -, at most 32)", r.Name)
	}
	if !suiteRE.MatchString(r.Suite) {
		return r.errorf("suite", "%q is not a Debian suite name", r.Suite)
	}
	seenPkg := map[string]bool{}
	for i, p := range r.Packages {
		key := fmt.Sprintf("packages[%d]", i)
		if !debPackageRE.MatchString(p) {
			return r.errorf(key, "%q is not a Debian package name (no versions or apt patterns)", p)
		}
		if seenPkg[p] {
			return r.errorf(key, "%q is listed twice", p)
		}
		seenPkg[p] = true
	}
	if r.Env["PATH"] == "" {
		return r.errorf("env.PATH", "missing: the smoke checks and every command in the VM need it")
	}
	for _, k := range r.sortedEnvKeys() {
		if !envKeyRE.MatchString(k) {
			return r.errorf("env."+k, "%q is not an environment variable name", k)
		}
		if strings.ContainsAny(r.Env[k], "\x00\n\r") {
			return r.errorf("env."+k, "the value holds a newline or NUL (the file has one KEY=VALUE a line)")
		}
	}
	// Every path the recipe writes, to refuse two writers of one path.
	written := map[string]string{GuestEnvironmentFile: "the environment file"}
	claim := func(key, p string) error {
		if err := checkGuestPath(p); err != nil {
			return r.errorf(key, "%v", err)
		}
		if prev, ok := written[p]; ok {
			return r.errorf(key, "%s is already written by %s", p, prev)
		}
		written[p] = key
		return nil
	}
	for i, n := range r.NPM {
		key := fmt.Sprintf("npm[%d]", i)
		if !npmSpecRE.MatchString(n.Spec) {
			return r.errorf(key+".spec", "%q is not name@exact-version", n.Spec)
		}
		if _, err := decodeIntegrity(n.Integrity); err != nil {
			return r.errorf(key+".integrity", "%v", err)
		}
		if len(n.Copy) == 0 {
			return r.errorf(key+".copy", "missing: say which paths of the tarball go where")
		}
		for j, c := range n.Copy {
			ckey := fmt.Sprintf("%s.copy[%d]", key, j)
			if c.From == "" || path.IsAbs(c.From) || path.Clean(c.From) != c.From || !fs.ValidPath(c.From) {
				return r.errorf(ckey+".from", "%q is not a clean relative path in the tarball", c.From)
			}
			if c.Mode != "" {
				if _, err := parseMode(c.Mode); err != nil {
					return r.errorf(ckey+".mode", "%v", err)
				}
			}
			if err := claim(ckey+".to", c.To); err != nil {
				return err
			}
		}
	}
	for i, f := range r.Files {
		key := fmt.Sprintf("files[%d]", i)
		if err := claim(key+".path", f.Path); err != nil {
			return err
		}
		if f.Target != "" {
			if f.Content != "" || f.Mode != "" {
				return r.errorf(key, "a symlink (target) has no content or mode")
			}
			if strings.ContainsAny(f.Target, "\x00") {
				return r.errorf(key+".target", "holds a NUL")
			}
			continue
		}
		if f.Mode != "" {
			if _, err := parseMode(f.Mode); err != nil {
				return r.errorf(key+".mode", "%v", err)
			}
		}
		if err := checkContent(f.Path, f.Content); err != nil {
			return r.errorf(key+".content", "%v", err)
		}
	}
	for i, c := range r.Checks {
		key := fmt.Sprintf("checks[%d]", i)
		if len(c.Run) == 0 || c.Run[0] == "" {
			return r.errorf(key+".run", "missing: the command and its arguments")
		}
		for _, a := range c.Run {
			if strings.Contains(a, "\x00") {
				return r.errorf(key+".run", "an argument holds a NUL")
			}
		}
	}
	return nil
}

func (r *Recipe) sortedEnvKeys() []string {
	keys := make([]string, 0, len(r.Env))
	for k := range r.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// EnvironmentFile is the content of GuestEnvironmentFile: one KEY=VALUE a
// line, sorted, unquoted.
func (r *Recipe) EnvironmentFile() []byte {
	var b bytes.Buffer
	for _, k := range r.sortedEnvKeys() {
		fmt.Fprintf(&b, "%s=%s\n", k, r.Env[k])
	}
	return b.Bytes()
}

// checkGuestPath accepts clean absolute paths outside what the VM mounts
// over.
func checkGuestPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("%q is not a clean absolute path", p)
	}
	if strings.ContainsFunc(p, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return fmt.Errorf("%q holds a control character", p)
	}
	for _, m := range mountedOver {
		if p == m || strings.HasPrefix(p, m+"/") {
			return fmt.Errorf("%s is under %s, which the VM mounts over at boot", p, m)
		}
	}
	return nil
}

// checkContent parses JSON and TOML files, so a typo in a CLI's settings
// fails the recipe rather than the CLI in every VM.
func checkContent(p, content string) error {
	switch path.Ext(p) {
	case ".json":
		var v any
		if err := json.Unmarshal([]byte(content), &v); err != nil {
			return fmt.Errorf("not valid JSON: %v", err)
		}
	case ".toml":
		var v map[string]any
		if _, err := toml.Decode(content, &v); err != nil {
			return fmt.Errorf("not valid TOML: %v", err)
		}
	}
	return nil
}

// parseMode parses an octal permission string such as "0755".
func parseMode(s string) (fs.FileMode, error) {
	if len(s) < 3 || len(s) > 5 {
		return 0, fmt.Errorf("%q is not an octal mode such as \"0644\"", s)
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, fmt.Errorf("%q is not an octal mode such as \"0644\"", s)
	}
	m := fs.FileMode(v & 0o777)
	if v&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m, nil
}

// decodeIntegrity returns the sha512 an npm integrity string names.
func decodeIntegrity(s string) ([]byte, error) {
	b64, ok := strings.CutPrefix(s, "sha512-")
	if !ok {
		return nil, fmt.Errorf("%q is not a sha512 integrity (\"sha512-<base64>\", from npm view <spec> dist.integrity)", s)
	}
	sum, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || len(sum) != sha512.Size {
		return nil, fmt.Errorf("%q is not a sha512 integrity: want %d bytes of base64", s, sha512.Size)
	}
	return sum, nil
}

// npmSpecParts splits a spec into its name and version.
func npmSpecParts(spec string) (name, version string, err error) {
	m := npmSpecRE.FindStringSubmatch(spec)
	if m == nil {
		return "", "", errors.New("not name@exact-version")
	}
	return m[1], m[2], nil
}
