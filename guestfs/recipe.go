package guestfs

import (
	"bytes"
	"crypto/sha512"
	"debug/elf"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// A Recipe says what one artefact of the store is made of, as data
// (recipes/*.toml) whose bytes are part of the artefact's key. Its kind
// says which: a kernel (the Debian kernel package's kernel and the
// modules the guest needs), an initramfs (the minimal root: busybox, the
// guest binary as /init and the kernel artefact's modules) or a root
// image (Debian packages, npm tarballs unpacked at given paths, files
// and symlinks, the environment of every command in the VM, and the
// smoke checks the finished tree must pass). Each kind has its own keys;
// a key of another kind is an error.
type Recipe struct {
	// Name names the artefact (refs/<name>).
	Name string `toml:"name"`
	// Kind is KindKernel, KindInitramfs or KindRoot.
	Kind string `toml:"kind"`
	// Arch is the guest's Debian architecture.
	Arch string `toml:"arch"`

	// Kernel is the kernel recipe's own part.
	Kernel *KernelSpec `toml:"kernel"`
	// Initramfs is the initramfs recipe's own part.
	Initramfs *InitramfsSpec `toml:"initramfs"`

	// Suite is a root image's Debian release; the host's apt sources must
	// carry it.
	Suite string `toml:"suite"`
	// Packages are installed on top of Essential and apt.
	Packages []string          `toml:"packages"`
	Env      map[string]string `toml:"env"`
	NPM      []NPMPackage      `toml:"npm"`
	// Files go into a root image or an initramfs.
	Files  []RecipeFile  `toml:"files"`
	Checks []RecipeCheck `toml:"checks"`

	// File names the recipe in errors; Source is its bytes.
	File   string `toml:"-"`
	Source []byte `toml:"-"`
}

// Recipe kinds.
const (
	KindKernel    = "kernel"
	KindInitramfs = "initramfs"
	KindRoot      = "root"
)

// KernelSpec is what a kernel recipe takes from Debian.
type KernelSpec struct {
	// Package is the kernel's metapackage: its Depends names the ABI
	// package (linux-image-6.1.0-NN-amd64) whose files are used.
	Package string `toml:"package"`
	// Modules are the kernel modules the guest may need, by module name;
	// their dependencies are added from the modules' own metadata.
	Modules []string `toml:"modules"`
}

// InitramfsSpec is what an initramfs recipe puts together besides its
// files.
type InitramfsSpec struct {
	// Kernel names the kernel recipe whose artefact gives the modules (and
	// whose key is part of this artefact's key).
	Kernel string `toml:"kernel"`
	// Busybox is the Debian package with a static /bin/busybox; every
	// applet it lists (busybox --list-full) gets a link to it.
	Busybox string `toml:"busybox"`
	// FallbackApplets are linked instead when busybox cannot run on the
	// build host to list its own.
	FallbackApplets []string `toml:"fallback_applets"`
	// Init is where the guest binary goes (mode 0755); InitLinks are
	// symlinks to it.
	Init      string   `toml:"init"`
	InitLinks []string `toml:"init_links"`
	// Dirs and Devices are made as listed (devices are character devices).
	Dirs    []InitramfsDir    `toml:"dirs"`
	Devices []InitramfsDevice `toml:"devices"`
}

// InitramfsDir is a directory of the initramfs.
type InitramfsDir struct {
	Path string `toml:"path"`
	Mode string `toml:"mode"`
}

// InitramfsDevice is a character device node of the initramfs.
type InitramfsDevice struct {
	Path  string `toml:"path"`
	Mode  string `toml:"mode"`
	Major int64  `toml:"major"`
	Minor int64  `toml:"minor"`
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

// The embedded recipes the rest of capsem builds: the kernel, the minimal
// root (the initramfs every VM boots) and the default root image.
const (
	KernelRecipe  = "kernel"
	MinimalRecipe = "minimal"
	DefaultRecipe = "full"
)

//go:embed recipes/*.toml
var embeddedRecipes embed.FS

// RecipeNames lists the embedded recipes of every kind.
func RecipeNames() []string { return RecipeNamesOfKind("") }

// RecipeNamesOfKind lists the embedded recipes of one kind ("" for all).
func RecipeNamesOfKind(kind string) []string {
	ents, _ := fs.ReadDir(embeddedRecipes, "recipes")
	var names []string
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".toml")
		if !ok {
			continue
		}
		if kind != "" {
			if r, err := LoadRecipe(n); err != nil || r.Kind != kind {
				continue
			}
		}
		names = append(names, n)
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

// loadRecipeOfKind is LoadRecipe for a recipe that must be of kind.
func loadRecipeOfKind(name, kind string) (*Recipe, error) {
	r, err := LoadRecipe(name)
	if err != nil {
		return nil, err
	}
	return r, r.mustBe(kind)
}

// mustBe fails when the recipe is not of kind.
func (r *Recipe) mustBe(kind string) error {
	if r.Kind != kind {
		return fmt.Errorf("guestfs: %s: recipe %q is of kind %q, not %q", r.File, r.Name, r.Kind, kind)
	}
	return nil
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

// supportedArchs maps the Debian architectures the builder makes guests
// for to the ELF machine of their programs. Another architecture (arm64)
// is a new entry here, the builder's kernel and boot handling for it, and
// its own recipes.
var supportedArchs = map[string]elf.Machine{"amd64": elf.EM_X86_64}

// Guest directories the VM mounts over at boot: anything a root image put
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
	if _, ok := supportedArchs[r.Arch]; !ok {
		return r.errorf("arch", "%q is not an architecture the builder makes guests for (%s)", r.Arch, strings.Join(slices.Sorted(maps.Keys(supportedArchs)), ", "))
	}
	// The keys each kind has; any other kind's key is an error.
	present := map[string]bool{
		"kernel": r.Kernel != nil, "initramfs": r.Initramfs != nil,
		"suite": r.Suite != "", "packages": r.Packages != nil, "env": r.Env != nil,
		"npm": r.NPM != nil, "files": r.Files != nil, "checks": r.Checks != nil,
	}
	allowed := map[string][]string{
		KindKernel:    {"kernel"},
		KindInitramfs: {"initramfs", "files"},
		KindRoot:      {"suite", "packages", "env", "npm", "files", "checks"},
	}
	own, ok := allowed[r.Kind]
	if !ok {
		return r.errorf("kind", "%q is not a recipe kind (%s, %s or %s)", r.Kind, KindKernel, KindInitramfs, KindRoot)
	}
	for _, key := range slices.Sorted(maps.Keys(present)) {
		if present[key] && !slices.Contains(own, key) {
			return r.errorf(key, "not a key of %s recipes (another kind has it)", r.Kind)
		}
	}
	switch r.Kind {
	case KindKernel:
		return r.validateKernel()
	case KindInitramfs:
		return r.validateInitramfs()
	}
	return r.validateRoot()
}

func (r *Recipe) validateKernel() error {
	k := r.Kernel
	if k == nil {
		return r.errorf("kernel", "missing: the kernel package and the modules")
	}
	if !debPackageRE.MatchString(k.Package) {
		return r.errorf("kernel.package", "%q is not a Debian package name", k.Package)
	}
	if len(k.Modules) == 0 {
		return r.errorf("kernel.modules", "missing: the modules the guest needs")
	}
	seen := map[string]bool{}
	for i, m := range k.Modules {
		key := fmt.Sprintf("kernel.modules[%d]", i)
		if !isModuleName(modName(m)) {
			return r.errorf(key, "%q is not a kernel module name", m)
		}
		if seen[modName(m)] {
			return r.errorf(key, "%q is listed twice", m)
		}
		seen[modName(m)] = true
	}
	return nil
}

// busyboxPath is where an initramfs has busybox; its applets link to it.
const busyboxPath = "/bin/busybox"

func (r *Recipe) validateInitramfs() error {
	in := r.Initramfs
	if in == nil {
		return r.errorf("initramfs", "missing: the kernel recipe, busybox and the guest binary's place")
	}
	if !recipeNameRE.MatchString(in.Kernel) {
		return r.errorf("initramfs.kernel", "%q is not a recipe name", in.Kernel)
	}
	if !debPackageRE.MatchString(in.Busybox) {
		return r.errorf("initramfs.busybox", "%q is not a Debian package name", in.Busybox)
	}
	written := map[string]string{}
	claim := func(key, p string) error {
		if err := checkCleanPath(p); err != nil {
			return r.errorf(key, "%v", err)
		}
		if prev, ok := written[p]; ok {
			return r.errorf(key, "%s is already written by %s", p, prev)
		}
		written[p] = key
		return nil
	}
	if err := claim("initramfs.busybox", busyboxPath); err != nil {
		return err
	}
	if err := claim("initramfs.init", in.Init); err != nil {
		return err
	}
	for i, l := range in.InitLinks {
		if err := claim(fmt.Sprintf("initramfs.init_links[%d]", i), l); err != nil {
			return err
		}
	}
	for i, d := range in.Dirs {
		key := fmt.Sprintf("initramfs.dirs[%d]", i)
		if err := claim(key+".path", d.Path); err != nil {
			return err
		}
		if _, err := parseMode(d.Mode); err != nil {
			return r.errorf(key+".mode", "%v", err)
		}
	}
	for i, d := range in.Devices {
		key := fmt.Sprintf("initramfs.devices[%d]", i)
		if err := claim(key+".path", d.Path); err != nil {
			return err
		}
		if m, err := parseMode(d.Mode); err != nil || m&^fs.ModePerm != 0 {
			return r.errorf(key+".mode", "%q is not a permission such as \"0600\"", d.Mode)
		}
		// The kernel's dev_t: 12 bits of major, 20 of minor.
		if d.Major < 0 || d.Major >= 1<<12 {
			return r.errorf(key+".major", "%d is not a device major number (0 to 4095)", d.Major)
		}
		if d.Minor < 0 || d.Minor >= 1<<20 {
			return r.errorf(key+".minor", "%d is not a device minor number (0 to 1048575)", d.Minor)
		}
	}
	if err := r.validateFiles(claim); err != nil {
		return err
	}
	// Nothing may lie under a file, link or device: the archive could not
	// be unpacked.
	isDir := map[string]bool{}
	for _, d := range in.Dirs {
		isDir[d.Path] = true
	}
	for _, p := range slices.Sorted(maps.Keys(written)) {
		for a := path.Dir(p); a != "/"; a = path.Dir(a) {
			if key, ok := written[a]; ok && !isDir[a] {
				return r.errorf(written[p], "%s is under %s, which %s makes and is no directory", p, a, key)
			}
		}
	}
	// Applets are linked where nothing else is (as busybox's own list is).
	seen := map[string]bool{}
	for i, a := range in.FallbackApplets {
		key := fmt.Sprintf("initramfs.fallback_applets[%d]", i)
		if err := checkCleanPath(a); err != nil {
			return r.errorf(key, "%v", err)
		}
		if seen[a] {
			return r.errorf(key, "%s is listed twice", a)
		}
		seen[a] = true
	}
	return nil
}

func (r *Recipe) validateRoot() error {
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
	if err := r.validateFiles(claim); err != nil {
		return err
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

// validateFiles checks the files and symlinks; claim refuses a path the
// kind does not allow or another key writes already.
func (r *Recipe) validateFiles(claim func(key, p string) error) error {
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

// checkCleanPath accepts clean absolute paths other than / with no
// control characters.
func checkCleanPath(p string) error {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return fmt.Errorf("%q is not a clean absolute path", p)
	}
	if strings.ContainsFunc(p, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return fmt.Errorf("%q holds a control character", p)
	}
	return nil
}

// checkGuestPath accepts a root image's paths: clean, absolute and outside
// what the VM mounts over.
func checkGuestPath(p string) error {
	if err := checkCleanPath(p); err != nil {
		return err
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
