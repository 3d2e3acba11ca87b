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
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// pkgInfo is one package version as apt's lists describe it.
type pkgInfo struct {
	Name     string `json:"name"`
	Version  string `json:"version"`
	SHA256   string `json:"sha256"`
	Size     int64  `json:"size"`
	Filename string `json:"filename"` // pool path; its base names the cached .deb
}

// aptQuery asks apt for one package; Meta follows a kernel metapackage's
// Depends to the ABI package it names (linux-image-amd64 to
// linux-image-6.1.0-NN-amd64 at the version it pins).
type aptQuery struct {
	Name string
	Meta bool
}

func (q aptQuery) memoKey() string {
	if q.Meta {
		return "meta:" + q.Name
	}
	return q.Name
}

// aptMemo caches apt's answers against the state of its lists, because
// apt-cache takes about a second per call where its binary cache is off
// (Debian container images), which would dominate every boot's asset check.
type aptMemo struct {
	Fingerprint string             `json:"fingerprint"`
	Packages    map[string]pkgInfo `json:"packages"`
}

// aptMemoFile is the memo in the asset directory.
const aptMemoFile = "apt-resolution.json"

// parseStanzas parses apt-cache show output: RFC 822-style records
// separated by blank lines; continuation lines start with a space.
func parseStanzas(r io.Reader) ([]map[string]string, error) {
	var out []map[string]string
	cur := map[string]string{}
	last := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			if len(cur) > 0 {
				out = append(out, cur)
				cur = map[string]string{}
			}
			last = ""
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				cur[last] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				return nil, fmt.Errorf("apt record line without a colon: %q", line)
			}
			last = k
			cur[k] = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading apt records: %w", err)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out, nil
}

func stanzaPkg(s map[string]string) (pkgInfo, error) {
	p := pkgInfo{
		Name:     s["Package"],
		Version:  s["Version"],
		SHA256:   strings.ToLower(s["SHA256"]),
		Filename: s["Filename"],
	}
	if p.Name == "" || p.Version == "" {
		return p, errors.New("apt record lacks Package or Version")
	}
	if len(p.SHA256) != 64 {
		return p, fmt.Errorf("apt record for %s %s has no SHA256", p.Name, p.Version)
	}
	if p.Filename == "" || strings.Contains(path.Base(p.Filename), "..") || !strings.HasSuffix(p.Filename, ".deb") {
		return p, fmt.Errorf("apt record for %s %s has no usable Filename", p.Name, p.Version)
	}
	size, err := strconv.ParseInt(s["Size"], 10, 64)
	if err != nil {
		return p, fmt.Errorf("apt record for %s %s: bad Size: %w", p.Name, p.Version, err)
	}
	p.Size = size
	return p, nil
}

// kernelDependency returns the ABI kernel package and exact version the
// metapackage depends on: "linux-image-6.1.0-48-amd64 (= 6.1.172-1)".
func kernelDependency(depends string) (name, version string, err error) {
	for dep := range strings.SplitSeq(depends, ",") {
		// Take the first alternative of each dependency.
		alt, _, _ := strings.Cut(dep, "|")
		alt = strings.TrimSpace(alt)
		n, rest, _ := strings.Cut(alt, " ")
		n, _, _ = strings.Cut(n, ":") // drop an arch qualifier
		if !strings.HasPrefix(n, "linux-image-") {
			continue
		}
		rest = strings.TrimSpace(rest)
		if v, ok := strings.CutPrefix(rest, "(="); ok {
			version = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), ")"))
		}
		return n, version, nil
	}
	return "", "", fmt.Errorf("no linux-image-* package in Depends %q", depends)
}

// kernelRelease turns linux-image-6.1.0-48-amd64 into 6.1.0-48-amd64 (uname -r).
func kernelRelease(pkg string) string {
	return strings.TrimSuffix(strings.TrimPrefix(pkg, "linux-image-"), "-unsigned")
}

// aptFingerprint summarizes what apt's candidate choice depends on: the
// package lists and the sources/preferences, by name, size and mtime.
func aptFingerprint() (string, error) {
	h := sha256.New()
	found := false
	for _, dir := range []string{"/var/lib/apt/lists", "/etc/apt/sources.list.d", "/etc/apt/preferences.d"} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			info, err := e.Info()
			if err != nil || !info.Mode().IsRegular() {
				continue
			}
			found = true
			fmt.Fprintf(h, "%s/%s %d %d\n", dir, e.Name(), info.Size(), info.ModTime().UnixNano())
		}
	}
	for _, f := range []string{"/etc/apt/sources.list", "/etc/apt/preferences"} {
		if info, err := os.Stat(f); err == nil {
			fmt.Fprintf(h, "%s %d %d\n", f, info.Size(), info.ModTime().UnixNano())
		}
	}
	if !found {
		return "", errors.New("no apt package lists found (is this a Debian host with apt?)")
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// runTool runs a host tool with a stable locale and returns stdout; the
// error carries the tail of stderr, which is where such tools explain
// themselves.
func runTool(ctx context.Context, log *slog.Logger, dir, name string, args ...string) ([]byte, error) {
	if os.Geteuid() == 0 && name == "apt-get" {
		// As root, apt drops to _apt for downloads and warns when that user
		// cannot write the target directory; downloading as root is fine.
		args = append([]string{"-o", "APT::Sandbox::User=root"}, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	log.Debug("running", "cmd", name, "args", args)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(stderr.String(), 2000))
	}
	return stdout.Bytes(), nil
}

// tail is the last n bytes of a command's output, trimmed.
func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// resolveFresh asks apt for each query's package: one apt-cache call for
// them all, and one more for the ABI packages metapackages name.
func resolveFresh(ctx context.Context, log *slog.Logger, queries []aptQuery) (map[string]pkgInfo, error) {
	var names []string
	for _, q := range queries {
		if !slices.Contains(names, q.Name) {
			names = append(names, q.Name)
		}
	}
	out, err := runTool(ctx, log, "", "apt-cache", append([]string{"show", "--no-all-versions"}, names...)...)
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", strings.Join(names, ", "), err)
	}
	recs, err := parseStanzas(bytes.NewReader(out))
	if err != nil {
		return nil, err
	}
	byName := map[string]map[string]string{}
	for _, r := range recs {
		byName[r["Package"]] = r
	}
	res := map[string]pkgInfo{}
	var abi []string
	metaOf := map[string]string{} // ABI package name -> the memo key of its metapackage
	for _, q := range queries {
		r, ok := byName[q.Name]
		if !ok {
			return nil, fmt.Errorf("apt knows no %s", q.Name)
		}
		if !q.Meta {
			if res[q.memoKey()], err = stanzaPkg(r); err != nil {
				return nil, err
			}
			continue
		}
		kpkg, kver, err := kernelDependency(r["Depends"])
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", q.Name, r["Version"], err)
		}
		query := kpkg
		if kver != "" {
			query += "=" + kver
		}
		abi = append(abi, query)
		metaOf[kpkg] = q.memoKey()
	}
	if len(abi) == 0 {
		return res, nil
	}
	if out, err = runTool(ctx, log, "", "apt-cache", append([]string{"show", "--no-all-versions"}, abi...)...); err != nil {
		return nil, fmt.Errorf("looking up %s: %w", strings.Join(abi, ", "), err)
	}
	if recs, err = parseStanzas(bytes.NewReader(out)); err != nil {
		return nil, err
	}
	for _, r := range recs {
		key, ok := metaOf[r["Package"]]
		if _, done := res[key]; !ok || done {
			continue
		}
		if res[key], err = stanzaPkg(r); err != nil {
			return nil, err
		}
	}
	for kpkg, key := range metaOf {
		if _, ok := res[key]; !ok {
			return nil, fmt.Errorf("apt knows no %s", kpkg)
		}
	}
	return res, nil
}

// bootHost is what the boot builder asks of the host: apt's answers, the
// packages' files and apt-get update.
type bootHost interface {
	// resolve answers the queries (fresh: from apt, not the memo).
	resolve(ctx context.Context, b *bootBuilder, fresh bool, queries []aptQuery) (map[string]pkgInfo, error)
	// fetchDeb returns the path of p's .deb, verified against its SHA256.
	fetchDeb(ctx context.Context, b *bootBuilder, p pkgInfo) (string, error)
	// unpackDeb extracts a .deb's files into dir.
	unpackDeb(ctx context.Context, b *bootBuilder, deb, dir string) error
	aptUpdate(ctx context.Context, b *bootBuilder) error
}

// debianBoot is the bootHost of a Debian host: apt-cache, apt-get
// download and dpkg-deb.
type debianBoot struct{}

// resolvePackages returns the kernel's ABI package (from the kernel
// recipe's metapackage) and busybox's, reusing the memo while apt's lists
// are unchanged; fresh asks apt regardless.
func (b *bootBuilder) resolvePackages(ctx context.Context, fresh bool) (kernel, busybox pkgInfo, err error) {
	kq := aptQuery{Name: b.kernel.Kernel.Package, Meta: true}
	bq := aptQuery{Name: b.minimal.Initramfs.Busybox}
	res, err := b.host.resolve(ctx, b, fresh, []aptQuery{kq, bq})
	if err != nil {
		return kernel, busybox, err
	}
	return res[kq.memoKey()], res[bq.memoKey()], nil
}

// resolve answers the queries from the memo while apt's lists are
// unchanged, else from apt (running apt-get update once when apt does not
// know them), and remembers the answers.
func (h debianBoot) resolve(ctx context.Context, b *bootBuilder, fresh bool, queries []aptQuery) (map[string]pkgInfo, error) {
	memoPath := filepath.Join(b.s.dir, aptMemoFile)
	var memo aptMemo
	if data, err := os.ReadFile(memoPath); err == nil {
		_ = json.Unmarshal(data, &memo) // a corrupt memo only means asking apt
	}
	fp, fpErr := aptFingerprint()
	if fpErr == nil && !fresh && memo.Fingerprint == fp {
		res := map[string]pkgInfo{}
		for _, q := range queries {
			if p, ok := memo.Packages[q.memoKey()]; ok && p.Name != "" {
				res[q.memoKey()] = p
			}
		}
		if len(res) == len(queries) {
			return res, nil
		}
	}
	res, err := resolveFresh(ctx, b.log, queries)
	if err != nil && !b.updated {
		// Not found: the lists may be missing or stale. Refresh them once.
		b.log.Info("apt lookup failed; running apt-get update once", "err", err)
		if uerr := h.aptUpdate(ctx, b); uerr != nil {
			return nil, fmt.Errorf("%w (and apt-get update failed: %v)", err, uerr)
		}
		fp, fpErr = aptFingerprint()
		res, err = resolveFresh(ctx, b.log, queries)
	}
	if err != nil {
		return nil, err
	}
	if fpErr == nil {
		if memo.Fingerprint != fp || memo.Packages == nil {
			memo = aptMemo{Fingerprint: fp, Packages: map[string]pkgInfo{}}
		}
		maps.Copy(memo.Packages, res)
		if data, err := json.MarshalIndent(memo, "", "  "); err == nil {
			if err := writeFileAtomic(memoPath, data, 0o644); err != nil {
				b.log.Warn("could not save the apt resolution", "err", err)
			}
		}
	}
	return res, nil
}

func (debianBoot) aptUpdate(ctx context.Context, b *bootBuilder) error {
	b.updated = true
	b.s.progress("updating apt package lists (apt-get update)…")
	_, err := runTool(ctx, b.log, "", "apt-get", "update", "-q")
	return err
}

// debPath is where a package's .deb is cached.
func (b *bootBuilder) debPath(p pkgInfo) string {
	return filepath.Join(b.s.dir, "debs", path.Base(p.Filename))
}

// fetchDeb returns the cached .deb for p, downloading it with apt-get
// download when missing or not matching apt's SHA256. Nothing is installed.
func (debianBoot) fetchDeb(ctx context.Context, b *bootBuilder, p pkgInfo) (string, error) {
	dst := b.debPath(p)
	if sum, err := fileSHA256(dst); err == nil {
		if sum == p.SHA256 {
			b.s.progress("using cached %s %s", p.Name, p.Version)
			return dst, nil
		}
		b.log.Warn("cached package does not match apt's hash; fetching it again", "deb", dst)
	}
	debs := filepath.Dir(dst)
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", fmt.Errorf("creating the package cache: %w", err)
	}
	tmp, err := os.MkdirTemp(debs, ".download-")
	if err != nil {
		return "", fmt.Errorf("creating a download directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	b.s.progress("fetching %s %s (%s)…", p.Name, p.Version, humanBytes(p.Size))
	if _, err := runTool(ctx, b.log, tmp, "apt-get", "download", "-q", p.Name+"="+p.Version); err != nil {
		return "", fmt.Errorf("downloading %s: %w", p.Name, err)
	}
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return "", fmt.Errorf("reading the download directory: %w", err)
	}
	var got string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".deb") {
			got = filepath.Join(tmp, e.Name())
		}
	}
	if got == "" {
		return "", fmt.Errorf("apt-get download %s left no .deb", p.Name)
	}
	sum, err := fileSHA256(got)
	if err != nil {
		return "", err
	}
	if sum != p.SHA256 {
		return "", fmt.Errorf("downloaded %s has sha256 %s, apt's lists say %s", p.Name, sum, p.SHA256)
	}
	if err := os.Rename(got, dst); err != nil {
		return "", fmt.Errorf("caching %s: %w", p.Name, err)
	}
	return dst, nil
}

// pruneDebs removes cached .debs other than keep (older kernels and
// busyboxes), so the cache holds one kernel package, not one per update.
func (b *bootBuilder) pruneDebs(keep ...string) {
	dir := filepath.Join(b.s.dir, "debs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if !strings.HasSuffix(e.Name(), ".deb") || slices.Contains(keep, p) {
			continue
		}
		if err := os.Remove(p); err == nil {
			b.log.Info("removed an outdated cached package", "deb", p)
		}
	}
}

// unpackDeb extracts a .deb into dir with dpkg-deb -x (files only; no
// maintainer scripts run, nothing is installed).
func (debianBoot) unpackDeb(ctx context.Context, b *bootBuilder, deb, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if _, err := runTool(ctx, b.log, "", "dpkg-deb", "-x", deb, dir); err != nil {
		return fmt.Errorf("unpacking %s: %w", filepath.Base(deb), err)
	}
	return nil
}

// busyboxApplets returns where busybox's applets belong (bin/sh,
// sbin/mke2fs, usr/bin/head, …), from the binary's own --list-full, or the
// recipe's fallback list when it cannot run here.
func (b *bootBuilder) busyboxApplets(ctx context.Context, bin string) []string {
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		b.log.Warn("cannot run busybox to list its applets; linking the recipe's fallback set", "err", err)
		return b.minimal.Initramfs.FallbackApplets
	}
	var applets []string
	for l := range strings.SplitSeq(string(out), "\n") {
		l = strings.TrimSpace(l)
		// Root-level entries (linuxrc) and busybox itself are skipped;
		// /init is ours.
		if !strings.Contains(l, "/") || l == "bin/busybox" || strings.Contains(l, "..") {
			continue
		}
		applets = append(applets, l)
	}
	sort.Strings(applets)
	return applets
}
