package guestfs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// rootEpoch is the fixed time of every root image (SOURCE_DATE_EPOCH for
// mmdebstrap, every file's mtime in the EROFS image), 2024-01-01 UTC, so
// two builds of the same inputs differ as little as mmdebstrap allows.
const rootEpoch = 1704067200

// dpkgExcludes keep documentation, manual pages and translations out of
// the image (copyright files stay), as mmdebstrap's manual suggests.
var dpkgExcludes = []string{
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/locale/*",
	"path-include=/usr/share/locale/locale.alias",
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
}

// smokeCheckTimeout bounds one smoke check; a CLI that hangs (waiting for
// network it cannot have) fails the build instead of stalling it.
const smokeCheckTimeout = 5 * time.Minute

// debianHost builds images on a Debian host with mmdebstrap, npm and
// mkfs.erofs.
type debianHost struct{}

// hostTools names each tool the build runs and the Debian package that
// has it, for the error when one is missing.
var hostTools = map[string]string{
	"mmdebstrap": "mmdebstrap",
	"mkfs.erofs": "erofs-utils",
	"apt-get":    "apt",
	"npm":        "npm",
	"unshare":    "util-linux",
	"chroot":     "coreutils",
	"mount":      "mount",
}

func lookTool(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found: the root image build needs it (apt-get install %s; make deps does)", name, hostTools[name])
	}
	return p, nil
}

func (debianHost) toolVersions(ctx context.Context, b *rootBuilder) (string, string, error) {
	memo := loadRootMemo(b.s.dir)
	changed := false
	version := func(name string, ask func(bin string) (string, error)) (string, error) {
		bin, err := lookTool(name)
		if err != nil {
			return "", err
		}
		st, err := os.Stat(bin)
		if err != nil {
			return "", err
		}
		if m, ok := memo.Tools[bin]; ok && m.Size == st.Size() && m.MtimeNS == st.ModTime().UnixNano() && m.Version != "" {
			return m.Version, nil
		}
		v, err := ask(bin)
		if err != nil {
			return "", fmt.Errorf("asking %s its version: %w", bin, err)
		}
		memo.Tools[bin] = toolMemo{Size: st.Size(), MtimeNS: st.ModTime().UnixNano(), Version: v}
		changed = true
		return v, nil
	}
	mm, err := version("mmdebstrap", func(bin string) (string, error) {
		out, err := runTool(ctx, b.log, "", bin, "--version")
		return firstLine(out, "mmdebstrap "), err
	})
	if err != nil {
		return "", "", err
	}
	// mkfs.erofs has no --version; it names itself first when it runs.
	mk, err := version("mkfs.erofs", func(bin string) (string, error) {
		tmp, err := os.MkdirTemp("", "capsem-mkfs-version-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(tmp)
		empty := filepath.Join(tmp, "empty")
		if err := os.Mkdir(empty, 0o755); err != nil {
			return "", err
		}
		out, err := runTool(ctx, b.log, "", bin, filepath.Join(tmp, "probe.img"), empty)
		return firstLine(out, "mkfs.erofs "), err
	})
	if err != nil {
		return "", "", err
	}
	if mm == "" || mk == "" {
		return "", "", fmt.Errorf("unexpected version output (mmdebstrap %q, mkfs.erofs %q)", mm, mk)
	}
	if changed {
		if err := memo.save(b.s.dir); err != nil {
			b.log.Warn("could not save the root image memo", "err", err)
		}
	}
	return mm, mk, nil
}

// firstLine is out's first line when it starts with prefix, else "".
func firstLine(out []byte, prefix string) string {
	line, _, _ := strings.Cut(string(out), "\n")
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, prefix) {
		return ""
	}
	return line
}

func (debianHost) sources(suite string) ([]byte, error) { return debianSources("/etc/apt", suite) }

// closure asks apt for the recipe's exact packages, reusing the memo while
// apt's lists are unchanged; fresh asks apt regardless.
func (debianHost) closure(ctx context.Context, b *rootBuilder, fresh bool) ([]string, error) {
	memo := loadRootMemo(b.s.dir)
	mkey := closureMemoKey(b.recipe.Suite, b.recipe.Packages)
	fp, fpErr := aptFingerprint()
	if fpErr == nil && !fresh {
		if m, ok := memo.Closures[mkey]; ok && m.Fingerprint == fp && len(m.Closure) > 0 {
			return m.Closure, nil
		}
	}
	closure, err := aptClosure(ctx, b, b.recipe.Packages)
	if err != nil && !b.updated {
		// The lists may be missing or stale: refresh them once.
		b.log.Info("apt lookup failed; running apt-get update once", "err", err)
		if uerr := b.aptUpdate(ctx); uerr != nil {
			return nil, fmt.Errorf("%w (and apt-get update failed: %v)", err, uerr)
		}
		fp, fpErr = aptFingerprint()
		closure, err = aptClosure(ctx, b, b.recipe.Packages)
	}
	if err != nil {
		return nil, err
	}
	if fpErr == nil {
		memo = loadRootMemo(b.s.dir)
		for k, m := range memo.Closures {
			if m.Fingerprint != fp {
				delete(memo.Closures, k)
			}
		}
		memo.Closures[mkey] = closureMemo{Fingerprint: fp, Closure: closure}
		if err := memo.save(b.s.dir); err != nil {
			b.log.Warn("could not save the root image memo", "err", err)
		}
	}
	return closure, nil
}

func (b *rootBuilder) aptUpdate(ctx context.Context) error {
	b.updated = true
	b.progress("updating apt package lists (apt-get update)…")
	_, err := runTool(ctx, b.log, "", "apt-get", "update", "-q")
	return err
}

// makeImage runs the build steps: the Debian tree, the npm tarballs, the
// recipe's files, the smoke checks, then the EROFS image.
func (h debianHost) makeImage(ctx context.Context, b *rootBuilder, in RootInputs, work, out string) (RootInputs, error) {
	if os.Geteuid() != 0 {
		return in, errors.New("building a root image needs root (mmdebstrap, chroot, the tree's owners)")
	}
	tree := filepath.Join(work, "tree")
	sources := filepath.Join(work, "debian.sources")
	if err := os.WriteFile(sources, []byte(in.Sources), 0o644); err != nil {
		return in, err
	}
	useNamespaces := canUnshare(ctx)

	start := time.Now()
	mode := "unshare"
	if !useNamespaces {
		mode = "root"
		b.progress("root image %s: unshare cannot make namespaces here; mmdebstrap runs with --mode=root and the smoke checks mount /proc and /dev in the host's namespace", b.recipe.Name)
	}
	if err := b.mmdebstrap(ctx, mode, tree, sources); err != nil {
		return in, err
	}
	b.manifest.Mode = mode
	status, err := os.ReadFile(filepath.Join(tree, "var/lib/dpkg/status"))
	if err != nil {
		return in, fmt.Errorf("reading the image's dpkg status: %w", err)
	}
	installed, err := installedPackages(status)
	if err != nil {
		return in, fmt.Errorf("the image's dpkg status: %w", err)
	}
	if !slices.Equal(installed, in.Closure) {
		// mmdebstrap fetched fresh lists; the host's were older. Refresh
		// them and key the image by what apt now says, if that is what got
		// installed.
		if b.updated {
			return in, fmt.Errorf("mmdebstrap installed other packages than apt's lists name: %s", closureDiff(in.Closure, installed))
		}
		b.progress("root image %s: the host's apt lists are older than the archive (%s); refreshing them", b.recipe.Name, closureDiff(in.Closure, installed))
		if err := b.aptUpdate(ctx); err != nil {
			return in, err
		}
		fresh, err := h.closure(ctx, b, true)
		if err != nil {
			return in, err
		}
		if !slices.Equal(installed, fresh) {
			return in, fmt.Errorf("mmdebstrap installed other packages than apt's lists name, even after apt-get update: %s", closureDiff(fresh, installed))
		}
		in.Closure = fresh
	}
	b.step("Debian userland", start, fmt.Sprintf("mmdebstrap --mode=%s, %d packages, %s", mode, len(installed), humanBytes(treeSize(tree))))

	root, err := os.OpenRoot(tree)
	if err != nil {
		return in, err
	}
	defer root.Close()
	// The VM's identity (host name, machine id, resolver) comes from capsem
	// at boot, not from the build host.
	for _, p := range []string{"etc/hostname", "etc/machine-id", "etc/resolv.conf"} {
		if _, err := writeTreeFile(root, p, strings.NewReader(""), 0o644); err != nil {
			return in, fmt.Errorf("emptying /%s: %w", p, err)
		}
	}

	start = time.Now()
	tarballs, fetched, err := b.fetchNPM(ctx)
	if err != nil {
		return in, err
	}
	b.step("npm tarballs", start, fmt.Sprintf("%d fetched, %d cached", fetched, len(tarballs)-fetched))

	start = time.Now()
	stats, err := b.unpackAll(root, tarballs)
	if err != nil {
		return in, err
	}
	b.step("npm unpack", start, fmt.Sprintf("%d files, %s", stats.Files, humanBytes(stats.Bytes)))

	start = time.Now()
	if err := b.writeRecipeFiles(root); err != nil {
		return in, err
	}
	b.step("files", start, fmt.Sprintf("%d files and links, %d environment variables", len(b.recipe.Files), len(b.recipe.Env)))

	start = time.Now()
	stripped, err := stripSetID(tree)
	if err != nil {
		return in, err
	}
	b.step("no set-ID files", start, fmt.Sprintf("%d set-ID bits cleared", stripped))

	start = time.Now()
	if err := b.smokeChecks(ctx, tree, root, useNamespaces); err != nil {
		return in, err
	}
	b.step("smoke checks", start, fmt.Sprintf("%d passed", len(b.recipe.Checks)))

	start = time.Now()
	if err := b.mkfs(ctx, tree, out, in.Key()); err != nil {
		return in, err
	}
	st, err := os.Stat(out)
	if err != nil {
		return in, err
	}
	b.step("EROFS image", start, fmt.Sprintf("mkfs.erofs -zlz4 -C65536, %s", humanBytes(st.Size())))
	return in, nil
}

// canUnshare says whether private mount, PID and network namespaces can be
// made here (root on a normal host; not in every container).
func canUnshare(ctx context.Context) bool {
	bin, err := exec.LookPath("unshare")
	if err != nil {
		return false
	}
	return exec.CommandContext(ctx, bin, "--mount", "--pid", "--net", "--fork", "--kill-child", "true").Run() == nil
}

// mmdebstrap makes the Debian tree, relaying its "I:" lines as progress.
func (b *rootBuilder) mmdebstrap(ctx context.Context, mode, tree, sources string) error {
	bin, err := lookTool("mmdebstrap")
	if err != nil {
		return err
	}
	args := []string{"--mode=" + mode, "--variant=apt", "--format=directory", "--architectures=" + b.recipe.Arch}
	if len(b.recipe.Packages) > 0 {
		args = append(args, "--include="+strings.Join(b.recipe.Packages, ","))
	}
	for _, o := range dpkgExcludes {
		args = append(args, "--dpkgopt="+o)
	}
	args = append(args, b.recipe.Suite, tree, sources)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "SOURCE_DATE_EPOCH="+strconv.Itoa(rootEpoch))
	var lines []string
	var mu sync.Mutex
	relay := newLineWriter(func(line string) {
		mu.Lock()
		lines = append(lines, line)
		mu.Unlock()
		b.log.Debug("mmdebstrap", "line", line)
		if strings.HasPrefix(line, "I: ") || strings.HasPrefix(line, "W: ") {
			b.progress("  mmdebstrap: %s", line[3:])
		}
	})
	cmd.Stdout, cmd.Stderr = relay, relay
	b.log.Debug("running", "cmd", bin, "args", args)
	err = cmd.Run()
	relay.Close()
	if err != nil {
		mu.Lock()
		defer mu.Unlock()
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		return fmt.Errorf("mmdebstrap %s: %w:\n%s", strings.Join(args, " "), err, strings.Join(lines, "\n"))
	}
	return nil
}

// lineWriter calls fn for each complete, non-blank line written to it;
// Close passes on an unterminated last line.
type lineWriter struct {
	fn  func(string)
	buf []byte
}

func newLineWriter(fn func(string)) *lineWriter { return &lineWriter{fn: fn} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.emit(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *lineWriter) Close() {
	w.emit(w.buf)
	w.buf = nil
}

func (w *lineWriter) emit(line []byte) {
	if l := strings.TrimSpace(string(line)); l != "" {
		w.fn(l)
	}
}

// npmCacheName is the tarball's file name in <Dir>/npm, as npm pack names
// it: "@scope/name@1.2.3" becomes "scope-name-1.2.3.tgz".
func npmCacheName(spec string) string {
	name, version, _ := npmSpecParts(spec)
	return strings.ReplaceAll(strings.TrimPrefix(name, "@"), "/", "-") + "-" + version + ".tgz"
}

// fetchNPM returns each recipe tarball's path in <Dir>/npm, fetching the
// missing ones with npm pack into a throwaway npm cache (so no second
// copy is kept) and refusing any whose sha512 is not the pinned one.
func (b *rootBuilder) fetchNPM(ctx context.Context) (paths []string, fetched int, err error) {
	cache := filepath.Join(b.s.dir, rootNPMDir)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, 0, err
	}
	var missing []NPMPackage
	for _, n := range b.recipe.NPM {
		p := filepath.Join(cache, npmCacheName(n.Spec))
		paths = append(paths, p)
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		if err := b.npmPack(ctx, cache, missing); err != nil {
			return nil, 0, err
		}
	}
	// The tarballs no recipe names any more go (a bumped pin leaves one).
	wanted := map[string]bool{}
	for _, name := range RecipeNames() {
		if r, err := LoadRecipe(name); err == nil {
			for _, n := range r.NPM {
				wanted[npmCacheName(n.Spec)] = true
			}
		}
	}
	for _, n := range b.recipe.NPM {
		wanted[npmCacheName(n.Spec)] = true
	}
	ents, _ := os.ReadDir(cache)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".tgz") && !wanted[e.Name()] {
			if os.Remove(filepath.Join(cache, e.Name())) == nil {
				b.log.Info("removed an npm tarball no recipe names", "file", e.Name())
			}
		}
	}
	return paths, len(missing), nil
}

// npmPack fetches pkgs in one npm pack run and moves each verified tarball
// into the cache.
func (b *rootBuilder) npmPack(ctx context.Context, cache string, pkgs []NPMPackage) error {
	bin, err := lookTool("npm")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(cache, ".fetch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var specs []string
	for _, n := range pkgs {
		specs = append(specs, n.Spec)
	}
	b.progress("root image %s: fetching %s…", b.recipe.Name, strings.Join(specs, ", "))
	args := append([]string{"pack", "--json", "--pack-destination", tmp, "--cache", filepath.Join(tmp, "npm-cache")}, specs...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm %s: %w: %s", strings.Join(args, " "), err, tail(stderr.String(), 2000))
	}
	packed, err := parseNPMPack(stdout.Bytes())
	if err != nil {
		return fmt.Errorf("npm pack: %w", err)
	}
	for _, n := range pkgs {
		file, ok := packed[n.Spec]
		if !ok {
			return fmt.Errorf("npm pack did not report %s", n.Spec)
		}
		got := filepath.Join(tmp, file)
		if err := checkIntegrity(got, n.Integrity); err != nil {
			return fmt.Errorf("npm %s: the registry's tarball is not the one the recipe pins (%w); refusing it", n.Spec, err)
		}
		if err := os.Rename(got, filepath.Join(cache, npmCacheName(n.Spec))); err != nil {
			return err
		}
	}
	return nil
}

// parseNPMPack maps each packed spec (npm's "id", name@version) to the
// tarball file name from npm pack --json.
func parseNPMPack(out []byte) (map[string]string, error) {
	var res []struct {
		ID       string `json:"id"`
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("reading npm pack --json output: %w", err)
	}
	m := map[string]string{}
	for _, r := range res {
		if r.Filename == "" || r.Filename != filepath.Base(r.Filename) || strings.HasPrefix(r.Filename, ".") {
			return nil, fmt.Errorf("npm pack reports an unusable file name %q for %s", r.Filename, r.ID)
		}
		m[r.ID] = r.Filename
	}
	return m, nil
}

// unpackAll verifies each tarball against its pin and unpacks it, two at a
// time (gzip is single-threaded; the copies go to distinct paths).
func (b *rootBuilder) unpackAll(root *os.Root, tarballs []string) (unpackStats, error) {
	var total unpackStats
	var mu sync.Mutex
	errs := make([]error, len(tarballs))
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, p := range tarballs {
		pkg := b.recipe.NPM[i]
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			st, err := unpackTarball(p, pkg, root)
			if err != nil {
				errs[i] = err
				return
			}
			mu.Lock()
			total.Files += st.Files
			total.Dirs += st.Dirs
			total.Symlinks += st.Symlinks
			total.Bytes += st.Bytes
			mu.Unlock()
		})
	}
	wg.Wait()
	return total, errors.Join(errs...)
}

// unpackTarball checks the cached tarball against the pin, then unpacks
// it. A cached tarball that no longer matches is removed, so the next
// build fetches it again.
func unpackTarball(p string, pkg NPMPackage, root *os.Root) (unpackStats, error) {
	if err := checkIntegrity(p, pkg.Integrity); err != nil {
		if errors.Is(err, errIntegrity) {
			os.Remove(p)
			return unpackStats{}, fmt.Errorf("npm %s: the cached tarball is not the one the recipe pins (%w); removed it, build again to fetch it anew", pkg.Spec, err)
		}
		return unpackStats{}, fmt.Errorf("npm %s: %w", pkg.Spec, err)
	}
	f, err := os.Open(p)
	if err != nil {
		return unpackStats{}, err
	}
	defer f.Close()
	return unpackNPM(bufio.NewReaderSize(f, 1<<20), pkg, root)
}

// writeRecipeFiles writes the recipe's files and symlinks and the
// environment file.
func (b *rootBuilder) writeRecipeFiles(root *os.Root) error {
	for _, f := range b.recipe.Files {
		rel := strings.TrimPrefix(f.Path, "/")
		if f.Target != "" {
			if err := mkdirAllMode(root, path.Dir(rel)); err != nil {
				return fmt.Errorf("%s: %w", f.Path, err)
			}
			if err := replaceSymlink(root, rel, f.Target); err != nil {
				return fmt.Errorf("%s: %w", f.Path, err)
			}
			continue
		}
		if err := writeRecipeFile(root, f); err != nil {
			return err
		}
	}
	env := strings.TrimPrefix(GuestEnvironmentFile, "/")
	if _, err := writeTreeFile(root, env, bytes.NewReader(b.recipe.EnvironmentFile()), 0o644); err != nil {
		return fmt.Errorf("%s: %w", GuestEnvironmentFile, err)
	}
	return nil
}

func writeRecipeFile(root *os.Root, f RecipeFile) error {
	mode := fs.FileMode(0o644)
	if f.Mode != "" {
		var err error
		if mode, err = parseMode(f.Mode); err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
	}
	if _, err := writeTreeFile(root, strings.TrimPrefix(f.Path, "/"), strings.NewReader(f.Content), mode); err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	return nil
}

// smokeChecks runs each recipe check in the tree: a chroot with its own
// /proc, the host's /dev bound in, no network, the recipe's environment
// and HOME=/root. Whatever a check leaves behind (a CLI's first-run files
// in /root) is removed and recipe files it rewrote are written again, so
// the image holds exactly what the recipe says; a check that changes
// anything else fails the build.
func (b *rootBuilder) smokeChecks(ctx context.Context, tree string, root *os.Root, namespaces bool) error {
	env := []string{"HOME=/root"}
	for _, k := range b.recipe.sortedEnvKeys() {
		if k != "HOME" {
			env = append(env, k+"="+b.recipe.Env[k])
		}
	}
	chroot, err := lookTool("chroot")
	if err != nil {
		return err
	}
	mount, err := lookTool("mount")
	if err != nil {
		return err
	}
	if !namespaces {
		unmount, err := mountForChecks(ctx, b.log, mount, tree)
		if err != nil {
			return err
		}
		defer unmount()
	}
	recipeFiles := map[string]RecipeFile{}
	for _, f := range b.recipe.Files {
		recipeFiles[strings.TrimPrefix(f.Path, "/")] = f
	}
	for _, c := range b.recipe.Checks {
		before, err := snapshotTree(tree)
		if err != nil {
			return err
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, smokeCheckTimeout)
		var cmd *exec.Cmd
		if namespaces {
			unshare, err := lookTool("unshare")
			if err != nil {
				cancel()
				return err
			}
			// A private mount namespace (its /proc and /dev mounts vanish
			// with it), a PID namespace (nothing a CLI starts outlives the
			// check) and a network namespace with nothing in it.
			script := `m=$1; c=$2; t=$3; shift 3; "$m" --rbind /dev "$t/dev" && exec "$c" "$t" "$@"`
			args := append([]string{"--mount", "--pid", "--net", "--fork", "--kill-child", "--mount-proc=" + filepath.Join(tree, "proc"),
				"/bin/sh", "-c", script, "sh", mount, chroot, tree}, c.Run...)
			cmd = exec.CommandContext(cctx, unshare, args...)
		} else {
			cmd = exec.CommandContext(cctx, chroot, append([]string{tree}, c.Run...)...)
		}
		cmd.Env = env
		cmd.Dir = "/"
		var outBuf bytes.Buffer
		cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
		runErr := cmd.Run()
		cancel()
		output := strings.TrimSpace(outBuf.String())
		if len(output) > 4000 {
			output = output[:4000] + "…"
		}
		cmdline := strings.Join(c.Run, " ")
		if runErr != nil {
			return fmt.Errorf("smoke check `%s` failed: %w:\n%s", cmdline, runErr, tail(output, 2000))
		}
		if c.Expect != "" && !strings.Contains(output, c.Expect) {
			return fmt.Errorf("smoke check `%s` did not print %q:\n%s", cmdline, c.Expect, tail(output, 2000))
		}
		after, err := snapshotTree(tree)
		if err != nil {
			return err
		}
		if err := restoreTree(root, before, after, recipeFiles, b.log); err != nil {
			return fmt.Errorf("smoke check `%s`: %w", cmdline, err)
		}
		b.manifest.Checks = append(b.manifest.Checks, RootCheck{Run: c.Run, Output: output, Seconds: roundSeconds(time.Since(start))})
		b.progress("  check `%s`: %s (%.1f s)", cmdline, firstOutputLine(output), time.Since(start).Seconds())
	}
	return nil
}

func firstOutputLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// mountForChecks mounts /proc and binds /dev into the tree in the host's
// namespace (when unshare cannot make one); the returned func undoes it.
func mountForChecks(ctx context.Context, log *slog.Logger, mount, tree string) (func(), error) {
	undo := func() {
		unmountUnder(tree, log)
	}
	if _, err := runTool(ctx, log, "", mount, "-t", "proc", "proc", filepath.Join(tree, "proc")); err != nil {
		return nil, err
	}
	if _, err := runTool(ctx, log, "", mount, "--rbind", "--make-rslave", "/dev", filepath.Join(tree, "dev")); err != nil {
		undo()
		return nil, err
	}
	return undo, nil
}

// treeEntry is what a smoke check could change about one path.
type treeEntry struct {
	mode        fs.FileMode
	size        int64
	mtime, ctim int64
	ino         uint64
}

// snapshotTree records every path in the tree but the kernel's
// (proc, sys, dev).
func snapshotTree(tree string) (map[string]treeEntry, error) {
	snap := map[string]treeEntry{}
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() && (rel == "proc" || rel == "sys" || rel == "dev") {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := treeEntry{mode: info.Mode()}
		if !info.IsDir() {
			e.size, e.mtime = info.Size(), info.ModTime().UnixNano()
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				e.ctim, e.ino = st.Ctim.Nano(), st.Ino
			}
		}
		snap[rel] = e
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the tree: %w", err)
	}
	return snap, nil
}

// restoreTree undoes a smoke check: new paths are removed, recipe files it
// changed or removed are written again, and any other change is an error.
func restoreTree(root *os.Root, before, after map[string]treeEntry, recipeFiles map[string]RecipeFile, log *slog.Logger) error {
	var added []string
	for p := range after {
		if _, ok := before[p]; !ok {
			added = append(added, p)
		}
	}
	sort.Strings(added)
	for i, p := range added {
		// A child of an added directory goes with it.
		if i > 0 && slices.ContainsFunc(added[:i], func(q string) bool { return strings.HasPrefix(p, q+"/") }) {
			continue
		}
		log.Debug("removing what a smoke check left", "path", "/"+p)
		if err := root.RemoveAll(p); err != nil {
			return fmt.Errorf("removing /%s, which it created: %w", p, err)
		}
	}
	var changed []string
	for p, was := range before {
		now, ok := after[p]
		if ok && (now == was || was.mode.IsDir() && now.mode == was.mode) {
			continue
		}
		if f, isRecipe := recipeFiles[p]; isRecipe && f.Target == "" {
			log.Debug("rewriting a recipe file a smoke check changed", "path", "/"+p)
			if err := writeRecipeFile(root, f); err != nil {
				return err
			}
			continue
		}
		changed = append(changed, "/"+p)
	}
	if len(changed) > 0 {
		sort.Strings(changed)
		return fmt.Errorf("it changed %s, which would end up in the image", strings.Join(changed, ", "))
	}
	return nil
}

// mkfs packs the tree into an EROFS image at out (via a temporary name):
// lz4 in 64 KiB clusters, every mtime rootEpoch, a UUID from the key.
func (b *rootBuilder) mkfs(ctx context.Context, tree, out, key string) error {
	bin, err := lookTool("mkfs.erofs")
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".tmp")
	defer os.Remove(tmp)
	args := []string{"-zlz4", "-C65536", "-T" + strconv.Itoa(rootEpoch), "-U" + uuidFromKey(key), "--quiet", tmp, tree}
	if _, err := runTool(ctx, b.log, "", bin, args...); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// uuidFromKey formats the key's first 16 bytes as a (version 4, RFC 4122
// variant) UUID: fixed for a key, distinct between images.
func uuidFromKey(key string) string {
	u := []byte(key[:32])
	u[12] = '4'
	u[16] = "89ab"[strings.IndexByte("0123456789abcdef", u[16])%4]
	s := string(u)
	return s[0:8] + "-" + s[8:12] + "-" + s[12:16] + "-" + s[16:20] + "-" + s[20:32]
}

// treeSize adds up the regular files' sizes.
func treeSize(tree string) int64 {
	var n int64
	filepath.WalkDir(tree, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// removeWorkDir removes a build's work directory, first detaching any
// mount left under it (a build killed while mmdebstrap --mode=root or the
// smoke checks had /proc or /dev mounted there), so the removal can never
// reach into the host's /dev.
func removeWorkDir(dir string, log *slog.Logger) {
	if left := unmountUnder(dir, log); left > 0 {
		log.Error("mounts remain under a build directory; not removing it", "dir", dir)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		log.Warn("removing a build directory", "dir", dir, "err", err)
	}
}

// unmountUnder detaches every mount below dir, deepest first, and returns
// how many remain.
func unmountUnder(dir string, log *slog.Logger) int {
	points := mountsUnder(dir)
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
			log.Warn("unmounting a leftover build mount", "path", p, "err", err)
		}
	}
	if len(points) == 0 {
		return 0
	}
	return len(mountsUnder(dir))
}

// mountsUnder lists the mount points below dir from /proc/self/mountinfo,
// deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	return parseMountsUnder(data, dir)
}

func parseMountsUnder(mountinfo []byte, dir string) []string {
	dir = filepath.Clean(dir)
	var out []string
	for line := range strings.SplitSeq(string(mountinfo), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMountinfo(f[4])
		if strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return slices.Compact(out)
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// stripSetID clears the set-user-ID and set-group-ID bits of every file in
// tree: in a VM everything runs as root already, and a set-ID file would
// let any process that drops its privileges gain them back (su, passwd,
// mount, …). It returns how many files had one.
func stripSetID(tree string) (int, error) {
	n := 0
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if mode := info.Mode(); mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
			n++
			if err := os.Chmod(p, mode.Perm()|(mode&fs.ModeSticky)); err != nil {
				return fmt.Errorf("clearing the set-ID bits of %s: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("guestfs: %w", err)
	}
	return n, nil
}
