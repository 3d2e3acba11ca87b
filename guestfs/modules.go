package guestfs

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/capsem/capsem/core/modorder"
)

// LoadOrderPath is where the initramfs lists the modules to load (format:
// core/modorder): dependencies first, each with the devices it is for, in
// chains that share no module. The agent loads a chain in its order and
// the chains side by side.
const LoadOrderPath = modorder.Path

// modName normalizes a module name the way the kernel does (KBUILD_MODNAME
// turns dashes into underscores): file crc32c-intel.ko is module crc32c_intel.
func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// moduleExts are the file endings of module files, longest first.
var moduleExts = []string{".ko.xz", ".ko.gz", ".ko.zst", ".ko"}

// splitModuleFile returns the module name of a file name and whether it is
// a module at all.
func splitModuleFile(file string) (string, bool) {
	base := path.Base(file)
	for _, ext := range moduleExts {
		if s, ok := strings.CutSuffix(base, ext); ok {
			name := modName(s)
			return name, isModuleName(name)
		}
	}
	return "", false
}

// isModuleName reports whether s can be a kernel module's name: the
// kernel derives it from the file name with only letters, digits and '_'.
func isModuleName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// plainModulePath drops a compression suffix: the guest loads plain .ko.
func plainModulePath(rel string) string {
	for _, ext := range []string{".xz", ".gz", ".zst"} {
		if s, ok := strings.CutSuffix(rel, ext); ok && strings.HasSuffix(s, ".ko") {
			return s
		}
	}
	return rel
}

// modInfo is the part of a module's .modinfo section that ordering needs.
type modInfo struct {
	Depends []string // hard dependencies, module names
	SoftPre []string // "softdep=pre: ..." names or aliases
	Aliases []string
}

// parseModinfo reads the NUL-separated key=value strings of .modinfo.
func parseModinfo(data []byte) modInfo {
	var mi modInfo
	for _, kv := range bytes.Split(data, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "depends":
			for d := range strings.SplitSeq(v, ",") {
				if d = strings.TrimSpace(d); d != "" {
					mi.Depends = append(mi.Depends, modName(d))
				}
			}
		case "softdep":
			mi.SoftPre = append(mi.SoftPre, parseSoftdep(v)...)
		case "alias":
			mi.Aliases = append(mi.Aliases, v)
		}
	}
	return mi
}

// parseSoftdep returns the "pre:" entries of "pre: a b post: c". Post soft
// dependencies are left out: nothing the guest needs uses them, and loading
// them early could invert an order the module relies on.
func parseSoftdep(v string) []string {
	var pre []string
	section := ""
	for _, f := range strings.Fields(v) {
		switch f {
		case "pre:", "post:":
			section = f
			continue
		}
		if section == "pre:" {
			pre = append(pre, f)
		}
	}
	return pre
}

// parseModulesDep parses depmod's modules.dep ("kernel/a.ko: kernel/b.ko
// kernel/c.ko"), returning module name to dependency names. Debian's
// linux-image packages do not ship it (depmod runs at install time), so it
// is used only when present.
func parseModulesDep(r io.Reader) (map[string][]string, error) {
	deps := map[string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		mod, rest, ok := strings.Cut(text, ":")
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: missing ':'", line)
		}
		name, ok := splitModuleFile(strings.TrimSpace(mod))
		if !ok {
			return nil, fmt.Errorf("modules.dep line %d: %q is not a module file", line, mod)
		}
		list := []string{}
		for _, d := range strings.Fields(rest) {
			dn, ok := splitModuleFile(d)
			if !ok {
				return nil, fmt.Errorf("modules.dep line %d: %q is not a module file", line, d)
			}
			list = append(list, dn)
		}
		deps[name] = list
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading modules.dep: %w", err)
	}
	return deps, nil
}

// loadOrder returns the modules to load, dependencies first: a depth-first
// walk from each wanted module in the given order. depsOf returns a
// module's dependencies that must be loaded before it (already filtered to
// loadable modules). A cycle is an error: no order could load it.
func loadOrder(wanted []string, depsOf func(name string) ([]string, error)) ([]string, error) {
	const (
		unseen = iota
		visiting
		done
	)
	state := map[string]int{}
	var order, stack []string
	var visit func(name string) error
	visit = func(name string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			i := slices.Index(stack, name)
			cycle := append(slices.Clone(stack[i:]), name)
			return fmt.Errorf("module dependency cycle: %s", strings.Join(cycle, " -> "))
		}
		state[name] = visiting
		stack = append(stack, name)
		deps, err := depsOf(name)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		state[name] = done
		order = append(order, name)
		return nil
	}
	for _, w := range wanted {
		if err := visit(w); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// modTree is a kernel's module directory, lib/modules/<version>, as
// unpacked from the linux-image package.
type modTree struct {
	root    string
	log     *slog.Logger
	paths   map[string]string // module name -> path relative to root
	builtin map[string]bool
	// builtinAliases are aliases of built-in modules, from
	// modules.builtin.modinfo, so a softdep on a built-in alias is met.
	builtinAliases map[string][]string
	depFile        map[string][]string // from modules.dep, nil when absent
	info           map[string]modInfo
	aliasIndex     map[string][]string // lazily built: alias pattern -> module names
	indexed        map[string]bool     // modules already in aliasIndex
}

func openModTree(root string, log *slog.Logger) (*modTree, error) {
	t := &modTree{
		root:           root,
		log:            log,
		paths:          map[string]string{},
		builtin:        map[string]bool{},
		builtinAliases: map[string][]string{},
		info:           map[string]modInfo{},
	}
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if _, ok := splitModuleFile(p); ok {
				rel, _ := filepath.Rel(root, p)
				files = append(files, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("indexing kernel modules in %s: %w", root, err)
	}
	sort.Strings(files)
	for _, rel := range files {
		name, _ := splitModuleFile(rel)
		if prev, dup := t.paths[name]; dup {
			log.Warn("two files for one module name; keeping the first", "module", name, "kept", prev, "ignored", rel)
			continue
		}
		t.paths[name] = rel
	}
	if data, err := os.ReadFile(filepath.Join(root, "modules.builtin")); err == nil {
		for l := range strings.SplitSeq(string(data), "\n") {
			if name, ok := splitModuleFile(strings.TrimSpace(l)); ok {
				t.builtin[name] = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading modules.builtin: %w", err)
	}
	if data, err := os.ReadFile(filepath.Join(root, "modules.builtin.modinfo")); err == nil {
		for _, kv := range bytes.Split(data, []byte{0}) {
			key, val, ok := strings.Cut(string(kv), "=")
			mod, field, ok2 := strings.Cut(key, ".")
			if ok && ok2 && field == "alias" {
				t.builtinAliases[val] = append(t.builtinAliases[val], modName(mod))
			}
		}
	}
	if f, err := os.Open(filepath.Join(root, "modules.dep")); err == nil {
		t.depFile, err = parseModulesDep(f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return t, nil
}

// has reports whether name is a loadable module file in this tree.
func (t *modTree) has(name string) bool { _, ok := t.paths[name]; return ok }

// readModule returns a module's bytes as the guest should load them:
// decompressed, since the guest agent hands plain .ko to finit_module.
func (t *modTree) readModule(name string) ([]byte, error) {
	rel, ok := t.paths[name]
	if !ok {
		return nil, fmt.Errorf("module %s: not in the kernel package", name)
	}
	data, err := os.ReadFile(filepath.Join(t.root, rel))
	if err != nil {
		return nil, fmt.Errorf("reading module %s: %w", name, err)
	}
	switch {
	case strings.HasSuffix(rel, ".ko.xz"):
		data, err = decodeXZ(data, 256<<20)
	case strings.HasSuffix(rel, ".ko.gz"):
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(data)); err == nil {
			data, err = io.ReadAll(io.LimitReader(zr, 256<<20))
		}
	case strings.HasSuffix(rel, ".ko.zst"):
		err = errors.New("zstd-compressed modules are not supported")
	}
	if err != nil {
		return nil, fmt.Errorf("decompressing module %s: %w", rel, err)
	}
	if data, err = stripModuleSignature(data); err != nil {
		return nil, fmt.Errorf("module %s: %w", rel, err)
	}
	return data, nil
}

// moduleSigMarker ends a module signed by the kernel's sign-file:
// [ELF][PKCS#7 signature][struct module_signature, 12 bytes][marker].
var moduleSigMarker = []byte("~Module signature appended~\n")

// moduleSigInfoLen is the size of struct module_signature.
const moduleSigInfoLen = 12

// stripModuleSignature returns data without its appended signature (data
// itself when it has none). The guest kernel does not enforce signatures
// (no sig_enforce, no lockdown), so a signature protects nothing there:
// root in the guest may load any module. Checking it costs a SHA-256 over
// the whole module and an RSA verification on every load, about a third of
// ext4's load time under TCG. The bytes are vouched for on the host
// instead: apt verified the package, and every boot re-hashes the
// initramfs. The kernel notes the unsigned module once and taints itself
// 'E', which is harmless.
func stripModuleSignature(data []byte) ([]byte, error) {
	if !bytes.HasSuffix(data, moduleSigMarker) {
		return data, nil
	}
	end := len(data) - len(moduleSigMarker)
	if end < moduleSigInfoLen {
		return nil, errors.New("appended signature: too short for its header")
	}
	info := data[end-moduleSigInfoLen : end]
	// The kernel's own checks (mod_check_sig): PKCS#7 (id type 2), with
	// the algorithm, hash, signer, key id and padding all left zero.
	if info[2] != 2 || !bytes.Equal(info[:2], []byte{0, 0}) || !bytes.Equal(info[3:8], make([]byte, 5)) {
		return nil, fmt.Errorf("appended signature: not a plain PKCS#7 signature (header % x)", info[:8])
	}
	sigLen := int64(binary.BigEndian.Uint32(info[8:]))
	body := int64(end-moduleSigInfoLen) - sigLen
	if sigLen == 0 || body < 4 {
		return nil, fmt.Errorf("appended signature: length %d does not fit a %d-byte module", sigLen, len(data))
	}
	if !bytes.HasPrefix(data, []byte("\x7fELF")) {
		return nil, errors.New("appended signature: the module is not an ELF file")
	}
	return data[:body], nil
}

// modinfo reads (and caches) a module's .modinfo section.
func (t *modTree) modinfo(name string) (modInfo, error) {
	if mi, ok := t.info[name]; ok {
		return mi, nil
	}
	var sec []byte
	rel := t.paths[name]
	if strings.HasSuffix(rel, ".ko") {
		// Plain modules: read only the section, not the whole file, since
		// alias lookups may touch every module in the tree.
		f, err := elf.Open(filepath.Join(t.root, rel))
		if err != nil {
			return modInfo{}, fmt.Errorf("module %s: %w", rel, err)
		}
		sec, err = modinfoSection(f)
		f.Close()
		if err != nil {
			return modInfo{}, fmt.Errorf("module %s: %w", rel, err)
		}
	} else {
		data, err := t.readModule(name)
		if err != nil {
			return modInfo{}, err
		}
		f, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return modInfo{}, fmt.Errorf("module %s: %w", rel, err)
		}
		sec, err = modinfoSection(f)
		if err != nil {
			return modInfo{}, fmt.Errorf("module %s: %w", rel, err)
		}
	}
	mi := parseModinfo(sec)
	t.info[name] = mi
	return mi, nil
}

func modinfoSection(f *elf.File) ([]byte, error) {
	s := f.Section(".modinfo")
	if s == nil {
		return nil, errors.New("no .modinfo section")
	}
	return s.Data()
}

// resolveAlias finds the module a soft dependency names: the name itself,
// else modules declaring a matching alias. Among several implementations
// (crypto-crc32c: crc32c_generic, crc32c_intel) the portable one wins,
// because an arch-optimized one may refuse the CPU QEMU emulates.
// builtin is true when a built-in module already provides it.
func (t *modTree) resolveAlias(alias string) (mod string, builtin bool, err error) {
	n := modName(alias)
	if t.has(n) {
		return n, false, nil
	}
	if t.builtin[n] || len(t.builtinAliases[alias]) > 0 {
		return "", true, nil
	}
	for pattern := range t.builtinAliases {
		if ok, _ := path.Match(pattern, alias); ok {
			return "", true, nil
		}
	}
	// Reading aliases means reading every module (decompressing each in
	// .ko.xz trees), so look where soft dependencies point in practice
	// first: crypto-* aliases live in the crypto directories.
	tiers := []func(rel string) bool{func(string) bool { return true }}
	if strings.HasPrefix(alias, "crypto-") {
		tiers = append([]func(string) bool{func(rel string) bool { return strings.Contains(rel, "/crypto/") }}, tiers...)
	}
	for _, tier := range tiers {
		t.indexAliases(tier)
		if cands := t.aliasCandidates(alias); len(cands) > 0 {
			return cands[0], false, nil
		}
	}
	return "", false, nil
}

// aliasCandidates returns the indexed modules providing alias, the
// portable ones (outside kernel/arch/) first, then by path.
func (t *modTree) aliasCandidates(alias string) []string {
	var cands []string
	for pattern, mods := range t.aliasIndex {
		if ok, _ := path.Match(pattern, alias); ok || pattern == alias {
			for _, m := range mods {
				if !slices.Contains(cands, m) {
					cands = append(cands, m)
				}
			}
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		ai := strings.HasPrefix(t.paths[cands[i]], "kernel/arch/")
		aj := strings.HasPrefix(t.paths[cands[j]], "kernel/arch/")
		if ai != aj {
			return !ai
		}
		return t.paths[cands[i]] < t.paths[cands[j]]
	})
	return cands
}

// indexAliases adds the aliases of the modules whose path passes filter
// and that are not indexed yet.
func (t *modTree) indexAliases(filter func(rel string) bool) {
	if t.aliasIndex == nil {
		t.aliasIndex, t.indexed = map[string][]string{}, map[string]bool{}
	}
	names := make([]string, 0, len(t.paths))
	for n, rel := range t.paths {
		if !t.indexed[n] && filter(rel) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		t.indexed[n] = true
		_, had := t.info[n]
		mi, err := t.modinfo(n)
		if err != nil {
			// One unreadable module should not block resolving others.
			t.log.Debug("skipping module while indexing aliases", "module", n, "err", err)
			continue
		}
		for _, a := range mi.Aliases {
			t.aliasIndex[a] = append(t.aliasIndex[a], n)
		}
		if !had {
			// Keep memory small: the alias index is all we need of most.
			delete(t.info, n)
		}
	}
}

// depsOf returns what must be loaded before name: hard dependencies
// (modules.dep when present, else .modinfo depends=) and pre soft
// dependencies, minus built-ins. A missing hard dependency is an error.
func (t *modTree) depsOf(name string) ([]string, error) {
	mi, err := t.modinfo(name)
	if err != nil {
		return nil, err
	}
	hard := mi.Depends
	if t.depFile != nil {
		if d, ok := t.depFile[name]; ok {
			hard = d
		}
	}
	var out []string
	for _, d := range hard {
		switch {
		case t.has(d):
			out = append(out, d)
		case t.builtin[d]:
		default:
			return nil, fmt.Errorf("module %s depends on %s, which is neither a module nor built in", name, d)
		}
	}
	for _, s := range mi.SoftPre {
		mod, builtin, err := t.resolveAlias(s)
		if err != nil {
			return nil, err
		}
		switch {
		case builtin:
		case mod == "":
			t.log.Warn("soft dependency not found; continuing without it", "module", name, "softdep", s)
		case mod != name && !slices.Contains(out, mod):
			out = append(out, mod)
		}
	}
	return out, nil
}

// deviceConditions says which modules of order the guest loads only when a
// device is there: a wanted driver whose aliases name bus devices (virtio,
// PCI, ACPI …) loads only when a present device matches one, and a
// dependency only when some module that needs it would load. Wanted
// modules without device aliases (filesystems, crypto) always load, and so
// does everything they need. Modules absent from the map always load.
func (t *modTree) deviceConditions(wanted, order []string) (map[string][]string, error) {
	always := map[string]bool{}
	devices := map[string][]string{}
	for _, w := range wanted {
		root := modName(w)
		if !t.has(root) {
			continue
		}
		mi, err := t.modinfo(root)
		if err != nil {
			return nil, err
		}
		var own []string
		for _, a := range mi.Aliases {
			if modorder.IsDeviceAlias(a) {
				own = append(own, a)
			}
		}
		// root and everything it needs, transitively.
		seen := map[string]bool{}
		stack := []string{root}
		for len(stack) > 0 {
			m := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[m] {
				continue
			}
			seen[m] = true
			deps, err := t.depsOf(m)
			if err != nil {
				return nil, err
			}
			stack = append(stack, deps...)
			if len(own) == 0 {
				always[m] = true
				continue
			}
			for _, a := range own {
				if !slices.Contains(devices[m], a) {
					devices[m] = append(devices[m], a)
				}
			}
		}
	}
	out := map[string][]string{}
	for _, m := range order {
		if !always[m] && len(devices[m]) > 0 {
			out[m] = devices[m]
		}
	}
	return out, nil
}

// chains splits a load order into groups that share no dependency (the
// connected components of the dependency graph), each keeping order's
// relative order, so the guest can load them at the same time. weight
// ranks them, heaviest first, so the agent starts the longest chain first.
func (t *modTree) chains(order []string, weight func(name string) int64) ([][]string, error) {
	parent := map[string]string{}
	var find func(string) string
	find = func(m string) string {
		if p, ok := parent[m]; ok && p != m {
			r := find(p)
			parent[m] = r
			return r
		}
		parent[m] = m
		return m
	}
	for _, m := range order {
		find(m)
		deps, err := t.depsOf(m)
		if err != nil {
			return nil, err
		}
		for _, d := range deps {
			parent[find(d)] = find(m)
		}
	}
	index := map[string]int{}
	var out [][]string
	var weights []int64
	for _, m := range order {
		root := find(m)
		i, ok := index[root]
		if !ok {
			i = len(out)
			index[root] = i
			out = append(out, nil)
			weights = append(weights, 0)
		}
		out[i] = append(out[i], m)
		weights[i] += weight(m)
	}
	idx := make([]int, len(out))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return weights[idx[a]] > weights[idx[b]] })
	sorted := make([][]string, len(out))
	for i, j := range idx {
		sorted[i] = out[j]
	}
	return sorted, nil
}

// selectModules returns the load order for wanted: modules that exist as
// files, with their dependencies. Wanted names built into the kernel are
// returned in builtin; names the kernel lacks entirely in absent (and
// logged), since a kernel without, say, vsock still boots for 9p users.
func (t *modTree) selectModules(wanted []string) (order, builtin, absent []string, err error) {
	var roots []string
	for _, w := range wanted {
		n := modName(w)
		switch {
		case t.has(n):
			roots = append(roots, n)
		case t.builtin[n]:
			builtin = append(builtin, n)
		default:
			t.log.Warn("module not in this kernel; skipping", "module", n)
			absent = append(absent, n)
		}
	}
	order, err = loadOrder(roots, t.depsOf)
	return order, builtin, absent, err
}
