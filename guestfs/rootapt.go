package guestfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// The root image's Debian side: which archive it is built from and which
// exact packages it gets, both read from the host's apt without network.

// debianComponents are the Debian archive's own components; a source with
// any other (a vendor's "stable", say) is not the Debian archive.
var debianComponents = []string{"main", "contrib", "non-free", "non-free-firmware"}

// aptSource is one deb source: a URI, suites, components and keyring.
type aptSource struct {
	URIs       []string
	Suites     []string
	Components []string
	SignedBy   string
}

// debianSources reads the host's apt sources (deb822 *.sources, then the
// one-line sources.list and *.list files) and keeps the Debian archive for
// suite: the suite itself, its -updates and -security, with Debian's
// components and, when a keyring is named, Debian's archive keyring. It
// returns them as one deb822 file for mmdebstrap to paste into the image,
// so the VM's apt uses the same archive. Third-party repositories the host
// may have (a vendor's packages) stay out of the image.
func debianSources(etcApt, suite string) ([]byte, error) {
	files := map[string][]byte{}
	var names []string
	add := func(p string) {
		if data, err := os.ReadFile(p); err == nil {
			files[p] = data
			names = append(names, p)
		}
	}
	add(filepath.Join(etcApt, "sources.list"))
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		sort.Strings(m)
		for _, p := range m {
			add(p)
		}
	}
	var all []aptSource
	for _, p := range names {
		var got []aptSource
		var err error
		if strings.HasSuffix(p, ".sources") {
			got, err = parseDeb822Sources(files[p])
		} else {
			got, err = parseOneLineSources(files[p])
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		all = append(all, got...)
	}
	kept := filterDebianSources(all, suite)
	if len(kept) == 0 {
		return nil, fmt.Errorf("no Debian archive for %s in the host's apt sources (%s): the root image is built from the archive the host itself uses",
			suite, strings.Join(names, ", "))
	}
	return formatDeb822(kept), nil
}

// parseDeb822Sources parses a deb822 .sources file (sources.list(5)),
// returning its enabled "deb" entries.
func parseDeb822Sources(data []byte) ([]aptSource, error) {
	// parseStanzas knows no comments; drop them first.
	var clean bytes.Buffer
	for line := range strings.SplitSeq(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		clean.WriteString(line)
		clean.WriteByte('\n')
	}
	stanzas, err := parseStanzas(&clean)
	if err != nil {
		return nil, err
	}
	var out []aptSource
	for _, s := range stanzas {
		field := func(k string) string {
			for key, v := range s {
				if strings.EqualFold(key, k) {
					return v
				}
			}
			return ""
		}
		if !slices.Contains(strings.Fields(field("Types")), "deb") || strings.EqualFold(field("Enabled"), "no") {
			continue
		}
		src := aptSource{
			URIs:       strings.Fields(field("URIs")),
			Suites:     strings.Fields(field("Suites")),
			Components: strings.Fields(field("Components")),
			SignedBy:   strings.TrimSpace(field("Signed-By")),
		}
		if len(src.URIs) == 0 || len(src.Suites) == 0 {
			return nil, errors.New("a deb entry without URIs or Suites")
		}
		out = append(out, src)
	}
	return out, nil
}

// parseOneLineSources parses "deb [opts] uri suite components..." lines.
func parseOneLineSources(data []byte) ([]aptSource, error) {
	var out []aptSource
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		src := aptSource{}
		if len(f) > 0 && strings.HasPrefix(f[0], "[") {
			// Options run to the first token ending in "]".
			end := slices.IndexFunc(f, func(t string) bool { return strings.HasSuffix(t, "]") })
			if end < 0 {
				return nil, fmt.Errorf("line %d: options without a closing ]", n)
			}
			opts := strings.Trim(strings.Join(f[:end+1], " "), "[]")
			for o := range strings.FieldsSeq(opts) {
				if v, ok := strings.CutPrefix(o, "signed-by="); ok {
					src.SignedBy = v
				}
			}
			f = f[end+1:]
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: want deb URI SUITE [COMPONENT...]", n)
		}
		src.URIs, src.Suites, src.Components = f[:1], f[1:2], f[2:]
		out = append(out, src)
	}
	return out, sc.Err()
}

// filterDebianSources keeps the entries that are the Debian archive for
// suite, with only that suite's own suites.
func filterDebianSources(all []aptSource, suite string) []aptSource {
	want := []string{suite, suite + "-updates", suite + "-security", suite + "/updates"}
	var out []aptSource
	for _, s := range all {
		if s.SignedBy != "" && !isDebianKeyring(s.SignedBy) {
			continue
		}
		if len(s.Components) == 0 || slices.ContainsFunc(s.Components, func(c string) bool { return !slices.Contains(debianComponents, c) }) {
			continue
		}
		var suites []string
		for _, su := range s.Suites {
			if slices.Contains(want, su) {
				suites = append(suites, su)
			}
		}
		if len(suites) == 0 {
			continue
		}
		s.Suites = suites
		out = append(out, s)
	}
	return out
}

// isDebianKeyring accepts the keyrings of the debian-archive-keyring
// package (in /usr/share/keyrings, named debian-archive-*).
func isDebianKeyring(p string) bool {
	return filepath.Dir(p) == "/usr/share/keyrings" && strings.HasPrefix(filepath.Base(p), "debian-archive-")
}

func formatDeb822(srcs []aptSource) []byte {
	var b bytes.Buffer
	for i, s := range srcs {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n",
			strings.Join(s.URIs, " "), strings.Join(s.Suites, " "), strings.Join(s.Components, " "))
		if s.SignedBy != "" {
			fmt.Fprintf(&b, "Signed-By: %s\n", s.SignedBy)
		}
	}
	return b.Bytes()
}

// debVersionRE is Debian policy 5.6.12's version syntax, loosely.
var debVersionRE = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~:-]*$`)

// parseAptSimulation turns apt-get -s output into sorted name=version
// lines, one per "Inst" line.
func parseAptSimulation(out []byte) ([]string, error) {
	var closure []string
	for line := range strings.SplitSeq(string(out), "\n") {
		rest, ok := strings.CutPrefix(line, "Inst ")
		if !ok {
			continue
		}
		// "Inst name (version release [arch])", or with "[old]" before the
		// parenthesis when upgrading.
		name, after, _ := strings.Cut(rest, " ")
		_, after, ok = strings.Cut(after, "(")
		version, _, _ := strings.Cut(after, " ")
		version = strings.TrimSuffix(version, ")")
		name, _, _ = strings.Cut(name, ":")
		if !ok || !debPackageRE.MatchString(name) || !debVersionRE.MatchString(version) {
			return nil, fmt.Errorf("unexpected apt-get -s line %q", line)
		}
		closure = append(closure, name+"="+version)
	}
	if len(closure) == 0 {
		return nil, errors.New("apt-get -s installs nothing (no Inst lines)")
	}
	sort.Strings(closure)
	return slices.Compact(closure), nil
}

// installedPackages reads a tree's dpkg status into sorted name=version
// lines, for comparing with the closure the cache key was made from.
func installedPackages(status []byte) ([]string, error) {
	stanzas, err := parseStanzas(bytes.NewReader(status))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range stanzas {
		if s["Status"] != "install ok installed" {
			continue
		}
		if s["Package"] == "" || s["Version"] == "" {
			return nil, errors.New("a dpkg status record without Package or Version")
		}
		out = append(out, s["Package"]+"="+s["Version"])
	}
	sort.Strings(out)
	return slices.Compact(out), nil
}

// closureDiff describes how two closures differ, briefly.
func closureDiff(want, got []string) string {
	var missing, extra []string
	for _, w := range want {
		if !slices.Contains(got, w) {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if !slices.Contains(want, g) {
			extra = append(extra, g)
		}
	}
	short := func(l []string) string {
		if len(l) > 5 {
			return strings.Join(l[:5], " ") + fmt.Sprintf(" and %d more", len(l)-5)
		}
		return strings.Join(l, " ")
	}
	return fmt.Sprintf("expected but not installed: [%s]; installed but not expected: [%s]", short(missing), short(extra))
}

// rootMemo remembers, in <Dir>/root-memo.json, what is slow to ask again:
// tool versions (by the binary's size and mtime) and Debian closures (by
// apt's lists fingerprint), so a cache hit costs no subprocess.
type rootMemo struct {
	Tools    map[string]toolMemo    `json:"tools"`
	Closures map[string]closureMemo `json:"closures"`
}

type toolMemo struct {
	Size    int64  `json:"size"`
	MtimeNS int64  `json:"mtime_ns"`
	Version string `json:"version"`
}

type closureMemo struct {
	Fingerprint string   `json:"fingerprint"`
	Closure     []string `json:"closure"`
}

const rootMemoFile = "root-memo.json"

func loadRootMemo(dir string) *rootMemo {
	m := &rootMemo{}
	if data, err := os.ReadFile(filepath.Join(dir, rootMemoFile)); err == nil {
		_ = json.Unmarshal(data, m) // a corrupt memo only means asking again
	}
	if m.Tools == nil {
		m.Tools = map[string]toolMemo{}
	}
	if m.Closures == nil {
		m.Closures = map[string]closureMemo{}
	}
	return m
}

func (m *rootMemo) save(dir string) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, rootMemoFile), data, 0o644)
}

// closureMemoKey names a closure question: the suite and the packages.
func closureMemoKey(suite string, pkgs []string) string {
	data, _ := json.Marshal(append([]string{suite}, pkgs...))
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:12])
}

// aptClosure asks apt, from the host's lists and without network, which
// exact packages mmdebstrap's apt variant plus pkgs installs.
func aptClosure(ctx context.Context, b *rootBuilder, pkgs []string) ([]string, error) {
	args := []string{"-s", "-o", "Dir::State::Status=/dev/null", "-o", "APT::Install-Recommends=false",
		"install", "?essential", "apt"}
	out, err := runTool(ctx, b.log, "", "apt-get", append(args, pkgs...)...)
	if err != nil {
		return nil, err
	}
	return parseAptSimulation(out)
}
