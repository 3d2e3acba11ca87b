package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/qemu"
)

// errRootNotCurrent: the full root's image is not built for the current
// recipe and packages, and the bench was not told to build it.
var errRootNotCurrent = errors.New("the full root image is not current")

// The size of every VM of the root image section: that of the VM
// section's VMs.
const (
	imageVMCPUs   = 2
	imageVMRAMMiB = 1024
)

// The read figures read readFile, a large file of the image, and its copy
// on the per-VM disk, with the guest program testdata/randread copied to
// readerPath.
const (
	readFile     = "/usr/local/bin/claude"
	readFileCopy = "/root/bench-read-copy"
	readerPath   = "/root/randread"
	randomReads  = 2000
)

// imageBench prints the "root image" section: each figure of a VM of the
// full root (the EROFS image under the per-VM disk) beside its baseline
// from the same run: create → exec-ready beside the minimal root's, the
// image's build (cold from its manifest, cached measured now) and size,
// the AI CLIs' start beside `true`, reads from the image beside the same
// bytes on the per-VM disk, files and exec output through the API beside
// the raw channel, and host memory per VM beside the minimal root's.
// With build false it builds no image: when the full root's image is not
// current it returns errRootNotCurrent.
func imageBench(capsem, home, guest string, runs int, build bool) error {
	ctx := context.Background()
	env, err := rootBenchEnv(ctx, home, guest, build)
	if err != nil {
		return err
	}
	fmt.Printf("\nRoot image: VMs of the full root (%s, EROFS, read-only under the per-VM disk) beside the minimal root (the busybox initramfs), same run, %s -cpu %s, %d CPUs, %d MB\n",
		env.root.Recipe, env.accel.Name, env.accel.CPU, imageVMCPUs, imageVMRAMMiB)
	printImage(env.root, env.builtNow, env.firstEnsure, env.cachedEnsure, env.ensureCalls)

	states, err := os.MkdirTemp("", "capsem-bench-image-states-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(states)
	minimal, full := env.configs(states)

	if err := imageStartBench(capsem, home, guest, states, runs, minimal, full); err != nil {
		return err
	}
	if err := commandsBench(capsem, home, guest, full); err != nil {
		return err
	}
	return apiBench(ctx, capsem, home, guest, env, states, "restored", false)
}

// apiOnlyBench prints only the data figures through the per-VM API beside
// the raw channel (-api-only, for working on the data path): one VM of
// each root, started however it can (no saved boot of this run).
func apiOnlyBench(capsem, home, guest string) error {
	ctx := context.Background()
	env, err := rootBenchEnv(ctx, home, guest, false)
	if err != nil {
		return err
	}
	fmt.Printf("\nData through the per-VM API (%s root and the minimal root), %s -cpu %s, %d CPUs, %d MB\n",
		env.root.Recipe, env.accel.Name, env.accel.CPU, imageVMCPUs, imageVMRAMMiB)
	states, err := os.MkdirTemp("", "capsem-bench-api-states-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(states)
	return apiBench(ctx, capsem, home, guest, env, states, "", true)
}

// rootEnv is what the root image section's VMs need: the assets, the full
// root's image, and the accelerator.
type rootEnv struct {
	assets                    *guestfs.Assets
	root                      *guestfs.Root
	accel                     qemu.Accel
	builtNow                  bool
	firstEnsure, cachedEnsure time.Duration
	ensureCalls               int
}

func rootBenchEnv(ctx context.Context, home, guest string, build bool) (*rootEnv, error) {
	assetsDir := filepath.Join(home, "assets")
	assets, err := guestfs.Ensure(ctx, guestfs.Options{Dir: assetsDir, GuestBinary: guest, Progress: os.Stderr})
	if err != nil {
		return nil, fmt.Errorf("assets: %w", err)
	}
	st, statusErr := guestfs.RootStatus(ctx, assetsDir, nil)
	if !build && (statusErr != nil || !st.Current) {
		why := "not built"
		switch {
		case statusErr != nil:
			why = statusErr.Error()
		case st.RefKey != "":
			why = fmt.Sprintf("%s is out of date (now %s)", short(st.RefKey), short(st.Key))
		}
		return nil, fmt.Errorf("%w in %s: %s (capsem image build makes it, in minutes; or -image-build)", errRootNotCurrent, assetsDir, why)
	}

	// The image: EnsureRoot as a VM start of base full calls it. Built
	// already, it is the cached figure; with -image-build and no current
	// image, the first call builds and is the cold figure, measured.
	env := &rootEnv{assets: assets}
	var ensure []time.Duration
	for i := range 6 {
		t := time.Now()
		r, err := guestfs.EnsureRoot(ctx, guestfs.RootOptions{Dir: assetsDir, Progress: io.Discard})
		if err != nil {
			return nil, fmt.Errorf("root image: %w", err)
		}
		ensure = append(ensure, time.Since(t))
		if i == 0 {
			env.root = r
			env.builtNow = st == nil || !st.Current
		}
	}
	env.firstEnsure, env.cachedEnsure, env.ensureCalls = ensure[0], median(ensure[1:]), len(ensure)-1

	env.accel, err = (&qemu.Backend{VerdictPath: filepath.Join(home, "run", "accel.json")}).ChooseAccelFor(ctx, "",
		qemu.BootFiles{Kernel: assets.Kernel, Initramfs: assets.Initramfs, Firmware: qemu.PreferredFirmware()})
	if err != nil {
		return nil, err
	}
	return env, nil
}

// configs are the edits of a VM of the minimal root and of the full root,
// saving their boots in states.
func (e *rootEnv) configs(states string) (minimal, full func(*vmhost.ProcessConfig)) {
	minimal = func(c *vmhost.ProcessConfig) {
		c.BootStateDir, c.NoAutodetect, c.CPUs, c.RAMMB = states, true, imageVMCPUs, imageVMRAMMiB
	}
	full = func(c *vmhost.ProcessConfig) { minimal(c); c.RootImage = e.root.Image }
	return minimal, full
}

// apiBench measures the data figures through the per-VM API of one VM of
// each root, then the raw channel with the CPUs to itself, and prints
// them. In the root image section the full root's VM also gives the reads;
// for -api-only (apiOnly) each figure's CPU time is measured instead.
func apiBench(ctx context.Context, capsem, home, guest string, env *rootEnv, states, wantStart string, apiOnly bool) error {
	minimal, full := env.configs(states)
	var apiRuns []apiFigures
	for _, b := range []struct {
		name string
		edit func(*vmhost.ProcessConfig)
	}{{"full", full}, {"minimal", minimal}} {
		vm, _, _, err := startProcess(capsem, home, guest, b.edit, wantStart)
		if err != nil {
			return fmt.Errorf("VM of the %s root: %w", b.name, err)
		}
		f, err := measureAPI(ctx, vm, b.name, apiOnly)
		if err == nil && !apiOnly && b.name == "full" {
			err = readBench(ctx, vm)
		}
		vm.stop()
		if err != nil {
			return fmt.Errorf("%s root: %w", b.name, err)
		}
		apiRuns = append(apiRuns, f)
	}
	raw, err := rawChannel(ctx, env.assets, env.accel, imageVMCPUs, imageVMRAMMiB)
	if err != nil {
		return fmt.Errorf("raw channel: %w", err)
	}
	printAPI(apiRuns, raw)
	if apiOnly {
		mib := float64(rawChannelBytes >> 20)
		fmt.Printf("    CPU, raw channel: QEMU %.1f ms/MiB host→guest, %.1f ms/MiB guest→host\n",
			float64(raw.cpu.up.Microseconds())/1000/mib, float64(raw.cpu.down.Microseconds())/1000/mib)
	}
	return nil
}

func short(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}

// printImage prints the image's size and its build: cold from the
// manifest (or measured, when this run built it), cached measured.
func printImage(root *guestfs.Root, builtNow bool, first, cached time.Duration, cachedRuns int) {
	fmt.Printf("  image: %.0f MB (%s, %s)\n", float64(root.ImageSize())/1e6, filepath.Base(root.Image), short(root.Key))
	var steps []string
	for _, s := range root.Steps {
		steps = append(steps, fmt.Sprintf("%s %.1f s (%s)", s.Name, s.Seconds, s.Detail))
	}
	source := fmt.Sprintf("from its manifest: built %s, not rebuilt by this run", root.BuiltAt.UTC().Format("2006-01-02 15:04 MST"))
	if builtNow {
		source = fmt.Sprintf("built by this run: EnsureRoot took %.1f s", first.Seconds())
	}
	fmt.Printf("  build, cold (%s): %.1f s =\n", source, root.BuildSeconds)
	for _, s := range steps {
		fmt.Printf("    %s\n", s)
	}
	fmt.Printf("    (cold for the image, not for the host: apt's and npm's downloads come from the home's caches when there, as the details say)\n")
	if builtNow {
		fmt.Printf("  build, cached: guestfs.EnsureRoot finding it in the store (what every VM create of base full calls), p50 %s of %d calls, beside the cold build's %.0f s\n", ms(cached), cachedRuns, root.BuildSeconds)
	} else {
		fmt.Printf("  build, cached: guestfs.EnsureRoot finding it in the store (what every VM create of base full calls), p50 %.1f ms of %d calls after a first of %s, beside the cold build's %.0f s\n",
			float64(cached.Microseconds())/1000, cachedRuns, ms(first), root.BuildSeconds)
		fmt.Printf("    (a call verifies the image through the sum cache: it hashes the %.0f MB again only when the cache does not know its identity)\n", float64(root.ImageSize())/1e6)
	}
}

// imageStartBench: create → exec-ready of the full root beside the
// minimal, through the per-VM process (vmhost.Launch, as the service
// starts it), resumed from a saved boot of this run (in states), in ABBA
// order so neither root always follows the other; and the host memory of
// each VM once it ran `true`.
func imageStartBench(capsem, home, guest, states string, runs int, minimal, full func(*vmhost.ProcessConfig)) error {
	type series struct {
		name       string
		edit       func(*vmhost.ProcessConfig)
		first      time.Duration
		firstStart string
		stateBytes int64
		ready      []time.Duration
		phases     map[string][]int64
		mem        []memFigures
	}
	bases := []*series{{name: "minimal", edit: minimal, phases: map[string][]int64{}}, {name: "full", edit: full, phases: map[string][]int64{}}}
	cycle := func(s *series, wantStart string) (time.Duration, string, error) {
		h, ready, timings, err := startProcess(capsem, home, guest, s.edit, wantStart)
		if err != nil {
			return 0, "", fmt.Errorf("%s root: %w", s.name, err)
		}
		defer h.stop()
		ctx := context.Background()
		if ev, err := h.client.Exec(ctx, &api.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil || ev.ExitCode != 0 {
			return 0, "", fmt.Errorf("%s root: exec true: %v %+v", s.name, err, ev)
		}
		info, err := h.client.Info(ctx)
		if err != nil {
			return 0, "", err
		}
		if wantStart != "" {
			s.ready = append(s.ready, ready)
			for k, v := range timings {
				s.phases[k] = append(s.phases[k], v)
			}
			mem, err := settledMemory(h.proc.PID(), info.QEMUPID)
			if err != nil {
				return 0, "", fmt.Errorf("%s root: %w", s.name, err)
			}
			s.mem = append(s.mem, mem)
		}
		return ready, info.Start, nil
	}
	// The first VM of each root boots and saves its boot: apart.
	for _, s := range bases {
		before, _ := filepath.Glob(filepath.Join(states, "*.state"))
		var err error
		if s.first, s.firstStart, err = cycle(s, ""); err != nil {
			return err
		}
		after, _ := filepath.Glob(filepath.Join(states, "*.state"))
		for _, f := range after {
			if !slices.Contains(before, f) {
				// The devices' state, and the RAM's data beside it.
				ram, _ := vmimage.Usage(vmm.MemoryPath(f))
				s.stateBytes = fileSize(f) + ram.Allocated
			}
		}
	}
	for i := range runs {
		order := []*series{bases[0], bases[1]}
		if i%2 == 1 {
			order = []*series{bases[1], bases[0]}
		}
		for _, s := range order {
			if _, _, err := cycle(s, "restored"); err != nil {
				return err
			}
		}
	}
	mini, fullS := bases[0], bases[1]
	m, f := median(mini.ready), median(fullS.ready)
	spread := func(d []time.Duration) string {
		return fmt.Sprintf("%s–%s", ms(slices.Min(d)), ms(slices.Max(d)))
	}
	fmt.Printf("  create → exec-ready, through the per-VM process (vmhost.Launch, as the service starts it), resumed from a saved boot of this run; %d runs each, interleaved ABBA, medians:\n", runs)
	fmt.Printf("    minimal root %s (%s), full root %s (%s): full/minimal %.2f× (%+.0f%%; target ≤ +10%%)\n",
		ms(m), spread(mini.ready), ms(f), spread(fullS.ready), float64(f)/float64(m), 100*(float64(f)/float64(m)-1))
	for _, s := range bases {
		fmt.Printf("    phases, %s (ms):", s.name)
		for _, k := range []string{"assets", "disk", "qemu_start", "kernel_to_hello", "guest_storage", "guest_after_wake", "boot_config", "gateway", "ready", "exec"} {
			if v := s.phases[k]; len(v) > 0 {
				fmt.Printf(" %s %d", k, medianInt(slices.Clone(v)))
			}
		}
		fmt.Printf("; saved boot %d MB\n", s.stateBytes>>20)
	}
	fmt.Printf("    the first VM of each (once, apart): minimal %s (%s), full %s (%s)\n", ms(mini.first), mini.firstStart, ms(fullS.first), fullS.firstStart)

	type memSummary struct {
		total, ours, qemuOwn, guestRAM int64
		roles                          []string
	}
	memOf := func(s *series) memSummary {
		var t, o, q, g []int64
		byRole := map[string][]int64{}
		for _, mf := range s.mem {
			t, o, q, g = append(t, mf.ours+mf.qemuOwn), append(o, mf.ours), append(q, mf.qemuOwn), append(g, mf.guest)
			for r, kb := range mf.byRole {
				byRole[r] = append(byRole[r], kb)
			}
		}
		out := memSummary{total: medianInt(t), ours: medianInt(o), qemuOwn: medianInt(q), guestRAM: medianInt(g)}
		for _, r := range slices.Sorted(maps.Keys(byRole)) {
			out.roles = append(out.roles, fmt.Sprintf("%s %.1f", r, float64(medianInt(byRole[r]))/1024))
		}
		return out
	}
	mm, fm := memOf(mini), memOf(fullS)
	fmt.Printf("  host memory per VM outside guest RAM (PSS, after exec `true` and once the gateway's processes are up; one VM running at a time, so the capsem and QEMU text is counted whole; medians of %d):\n", runs)
	fmt.Printf("    minimal root %d MB, full root %d MB: %+d MB\n", mm.total>>10, fm.total>>10, (fm.total-mm.total)>>10)
	for _, x := range []struct {
		name string
		m    memSummary
	}{{"minimal", mm}, {"full", fm}} {
		fmt.Printf("    %-7s: QEMU's own %d MB, capsem's processes %d MB (%s MB); guest RAM touched %d MB\n",
			x.name, x.m.qemuOwn>>10, x.m.ours>>10, strings.Join(x.m.roles, ", "), x.m.guestRAM>>10)
	}
	return nil
}

// gatewayRoles are the processes of a VM's MCP gateway, which the per-VM
// process starts once the VM is ready (vmhost's startGateway), so they
// may still be starting when exec `true` has answered.
var gatewayRoles = []string{"mcp-aggregator", "mcp-builtin"}

// settledMemory measures a VM's memory (vmMemory) once its gateway's
// processes are all there and their sum has stopped moving (two samples
// 250 ms apart within 512 kB: a process starting maps the capsem binary's
// text, which then moves in everyone's PSS), so every sample counts the
// same processes, started.
func settledMemory(pid, qemuPID int) (memFigures, error) {
	deadline := time.Now().Add(30 * time.Second)
	var last *memFigures
	for {
		m := vmMemory(pid, qemuPID, imageVMRAMMiB)
		missing := slices.DeleteFunc(slices.Clone(gatewayRoles), func(r string) bool { return m.byRole[r] > 0 })
		if len(missing) == 0 {
			if last != nil && max(m.ours-last.ours, last.ours-m.ours) < 512 {
				return m, nil
			}
			last = &m
		}
		if time.Now().After(deadline) {
			if len(missing) > 0 {
				return m, fmt.Errorf("the VM's %s did not start within 30 s", strings.Join(missing, " and "))
			}
			return m, errors.New("the VM's processes' memory did not settle within 30 s")
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// commandsBench times the AI CLIs' start in a fresh VM of the full root
// each, first run (cold: nothing of it in the guest's page cache) and then
// warm (median of the 10 after), beside `true` in a VM of its own as the
// floor: the wall time of the exec through the per-VM API, host clock.
func commandsBench(capsem, home, guest string, full func(*vmhost.ProcessConfig)) error {
	const warmRuns = 10
	type figure struct {
		cold, warm time.Duration
		out        string
	}
	commands := []struct{ label, command string }{
		{"true", "true"},
		{"node -e 0", "node -e 0"},
		{"claude --version", "claude --version"},
	}
	var figures []figure
	var trueIs string
	for _, c := range commands {
		h, _, _, err := startProcess(capsem, home, guest, full, "restored")
		if err != nil {
			return fmt.Errorf("VM for %s: %w", c.label, err)
		}
		var f figure
		var warm []time.Duration
		for i := range 1 + warmRuns {
			var out, errOut bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			t := time.Now()
			ev, err := h.client.Exec(ctx, &api.ExecRequest{Argv: strings.Fields(c.command)}, &out, &errOut)
			d := time.Since(t)
			cancel()
			if err == nil && ev.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", ev.ExitCode, strings.TrimSpace(errOut.String()))
			}
			if err != nil {
				h.stop()
				return fmt.Errorf("%s: %w", c.label, err)
			}
			if i == 0 {
				f.cold, f.out = d, strings.TrimSpace(out.String())
			} else {
				warm = append(warm, d)
			}
		}
		f.warm = median(warm)
		if c.label == "true" {
			var out bytes.Buffer
			if _, err := h.client.Exec(context.Background(), &api.ExecRequest{Command: "readlink -f $(which true)"}, &out, nil); err == nil {
				trueIs = strings.TrimSpace(out.String())
			}
		}
		h.stop()
		figures = append(figures, f)
	}
	floor := figures[0]
	fmt.Printf("  commands in a fresh VM of the full root each (exec wall time through the per-VM API, host clock): first run (cold: the guest has nothing of it cached; the host has the image in its page cache) / warm (median of the %d runs after)\n", warmRuns)
	for i, c := range commands {
		f := figures[i]
		label, extra := c.label, ""
		if i == 0 {
			label += " (the floor: " + trueIs + ")"
		} else {
			extra = fmt.Sprintf("   over the floor: +%s / +%s", ms(f.cold-floor.cold), ms(f.warm-floor.warm))
			if f.out != "" {
				extra += "   (" + firstLine(f.out) + ")"
			}
		}
		fmt.Printf("    %-38s %8s / %8s%s\n", label, ms(f.cold), ms(f.warm), extra)
	}
	return nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// readBench reads readFile in the guest from the image (through the
// overlay, from EROFS) and a copy of it on the per-VM disk (through the
// overlay, from ext4), with the guest's page cache dropped before each
// read, by testdata/randread: sequential 1 MiB reads of the whole file,
// and random 4 KiB reads. Each file is read once first, so the host's
// page cache holds both (QEMU reads them through it): the figures compare
// the guest's paths, not the host's disk. One warm-up, then 3 runs each,
// interleaved, medians.
func readBench(ctx context.Context, vm *vmHandle) error {
	reader, err := buildGuestProgram("./testdata/randread")
	if err != nil {
		return err
	}
	defer os.Remove(reader)
	bin, err := os.ReadFile(reader)
	if err != nil {
		return err
	}
	if err := vm.client.WriteFile(ctx, readerPath, bin, 0o755); err != nil {
		return err
	}
	_, sizeOut, err := guestTimed(vm, "stat -L -c %s "+readFile+" && cp "+readFile+" "+readFileCopy+" && sync")
	if err != nil {
		return fmt.Errorf("copying %s onto the per-VM disk: %w", readFile, err)
	}
	size, _ := strconv.ParseInt(strings.TrimSpace(sizeOut), 10, 64)
	read := func(mode, path string) (readFigures, error) {
		_, out, err := guestTimed(vm, fmt.Sprintf("%s -mode %s -n %d %s", readerPath, mode, randomReads, path))
		if err != nil {
			return readFigures{}, err
		}
		return parseReadFigures(out)
	}
	type pair struct{ image, disk []readFigures }
	results := map[string]*pair{"seq": {}, "random": {}}
	for i := range 4 {
		for _, mode := range []string{"seq", "random"} {
			for _, onImage := range []bool{true, false} {
				path := readFile
				if !onImage {
					path = readFileCopy
				}
				f, err := read(mode, path)
				if err != nil {
					return fmt.Errorf("reading %s (%s): %w", path, mode, err)
				}
				if i == 0 {
					continue // the warm-up: fills the host's page cache
				}
				p := results[mode]
				if onImage {
					p.image = append(p.image, f)
				} else {
					p.disk = append(p.disk, f)
				}
			}
		}
	}
	if _, _, err := guestTimed(vm, "rm -f "+readFileCopy+" "+readerPath); err != nil {
		return err
	}
	seqImage, seqDisk := medianRead(results["seq"].image), medianRead(results["seq"].disk)
	rndImage, rndDisk := medianRead(results["random"].image), medianRead(results["random"].disk)
	fmt.Printf("  reads in the guest, its page cache dropped before each (testdata/randread, a Go reader; host page cache warm for both files; 1 warm-up, then 3 runs each, interleaved, medians):\n")
	fmt.Printf("    sequential, 1 MiB reads of %s (%.0f MB): from the image (overlay → EROFS, lz4 in 64 KiB clusters) %.0f MiB/s; the same bytes on the per-VM disk (overlay → ext4) %.0f MiB/s: image/disk %.2f×\n",
		readFile, float64(size)/1e6, seqImage.mibs(), seqDisk.mibs(), seqImage.mibs()/seqDisk.mibs())
	fmt.Printf("    random 4 KiB reads (%d at random aligned offsets, readahead off): image %.0f reads/s (p50 %d µs, p99 %d µs); disk %.0f reads/s (p50 %d µs, p99 %d µs): image/disk %.2f×\n",
		randomReads, rndImage.perSec(), rndImage.p50us, rndImage.p99us, rndDisk.perSec(), rndDisk.p50us, rndDisk.p99us, rndImage.perSec()/rndDisk.perSec())
	return nil
}

type readFigures struct {
	bytes, reads, p50us, p99us int64
	seconds                    float64
}

func (r readFigures) mibs() float64   { return float64(r.bytes) / r.seconds / (1 << 20) }
func (r readFigures) perSec() float64 { return float64(r.reads) / r.seconds }

// parseReadFigures reads randread's line.
func parseReadFigures(out string) (readFigures, error) {
	var r readFigures
	if _, err := fmt.Sscanf(strings.TrimSpace(out), "bytes=%d seconds=%g reads=%d p50_us=%d p99_us=%d", &r.bytes, &r.seconds, &r.reads, &r.p50us, &r.p99us); err != nil {
		return r, fmt.Errorf("randread said %q: %w", out, err)
	}
	if r.seconds <= 0 {
		return r, fmt.Errorf("randread said %q: no time", out)
	}
	return r, nil
}

// medianRead is the run of median time.
func medianRead(rs []readFigures) readFigures {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b readFigures) int {
		switch {
		case a.seconds < b.seconds:
			return -1
		case a.seconds > b.seconds:
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

// buildGuestProgram builds a package of this module for the guest (no
// cgo, this machine's architecture) into a temporary file.
func buildGuestProgram(pkg string) (string, error) {
	f, err := os.CreateTemp("", "capsem-bench-guest-")
	if err != nil {
		return "", err
	}
	f.Close()
	cmd := exec.Command("go", "build", "-ldflags", "-s -w", "-o", f.Name(), pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("building %s: %v\n%s", pkg, err, out)
	}
	return f.Name(), nil
}

// apiFigures are the per-VM API's data figures of one VM, MiB/s.
type apiFigures struct {
	root                                    string
	execOut, fileIn, streamIn, streamOut    float64
	execTrueP50, execTrueP99                time.Duration
	execBytes, fileBytes, streamBytes, runs int
	// execPipe is the exec output's own floor, MiB/s: the same command
	// into cat in the guest, on the agent's clock (process start to exit).
	execPipe float64
	// cpu is, when measured (-api-only), the CPU time of each figure's
	// last run, by side.
	cpu map[string]cpuSnap
}

// measureAPI moves data through the per-VM API of a VM (exec output, a
// file written whole, files streamed each way) and times exec `true`
// round trips.
func measureAPI(ctx context.Context, vm *vmHandle, root string, cpu bool) (apiFigures, error) {
	f := apiFigures{root: root, execBytes: 10 << 20, fileBytes: 32 << 20, streamBytes: 256 << 20, runs: 3}
	var probe *cpuProbe
	if cpu {
		var err error
		if probe, err = newCPUProbe(ctx, vm); err != nil {
			return f, err
		}
		f.cpu = map[string]cpuSnap{}
	}
	var before cpuSnap
	mark := func() {
		if probe != nil {
			before = probe.snap(ctx)
		}
	}
	account := func(name string, bytes int) {
		if probe != nil {
			c := probe.snap(ctx).sub(before)
			c.mib = float64(bytes) / (1 << 20)
			f.cpu[name] = c
		}
	}
	rate := func(n int64, d time.Duration) float64 { return float64(n) / d.Seconds() / (1 << 20) }
	var lat []time.Duration
	for i := range 60 {
		t := time.Now()
		if _, err := vm.client.Exec(ctx, &api.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
			return f, err
		}
		if i >= 20 {
			lat = append(lat, time.Since(t))
		}
	}
	slices.Sort(lat)
	f.execTrueP50, f.execTrueP99 = lat[len(lat)/2], lat[len(lat)*99/100]
	var execOut, fileIn []float64
	blob := make([]byte, f.fileBytes)
	for range f.runs {
		var sink countWriter
		mark()
		t := time.Now()
		if _, err := vm.client.Exec(ctx, &api.ExecRequest{Command: fmt.Sprintf("head -c %d /dev/zero", f.execBytes)}, &sink, nil); err != nil {
			return f, err
		}
		if sink.n != int64(f.execBytes) {
			return f, fmt.Errorf("exec output: %d bytes of %d", sink.n, f.execBytes)
		}
		execOut = append(execOut, rate(sink.n, time.Since(t)))
		account("exec output", f.execBytes)
		mark()
		t = time.Now()
		if err := vm.client.WriteFile(ctx, "/root/bench-write.bin", blob, 0o600); err != nil {
			return f, err
		}
		fileIn = append(fileIn, rate(int64(f.fileBytes), time.Since(t)))
		account("file written whole", f.fileBytes)
	}
	f.execOut, f.fileIn = medianFloat(execOut), medianFloat(fileIn)
	var pipe []float64
	for range f.runs {
		d, _, err := guestTimed(vm, fmt.Sprintf("head -c %d /dev/zero | cat > /dev/null", f.execBytes))
		if err != nil {
			return f, err
		}
		pipe = append(pipe, rate(int64(f.execBytes), max(d, time.Millisecond)))
	}
	f.execPipe = medianFloat(pipe)
	mark()
	t := time.Now()
	if _, err := vm.client.WriteFileFrom(ctx, "/root/bench-stream.bin", 0o600, io.LimitReader(zeros{}, int64(f.streamBytes))); err != nil {
		return f, err
	}
	f.streamIn = rate(int64(f.streamBytes), time.Since(t))
	account("file streamed in", f.streamBytes)
	var back countWriter
	mark()
	t = time.Now()
	if _, _, err := vm.client.ReadFileTo(ctx, "/root/bench-stream.bin", false, 0, &back); err != nil {
		return f, err
	}
	if back.n != int64(f.streamBytes) {
		return f, fmt.Errorf("streamed read: %d bytes of %d", back.n, f.streamBytes)
	}
	f.streamOut = rate(back.n, time.Since(t))
	account("file streamed out", f.streamBytes)
	_, _, err := guestTimed(vm, "rm -f /root/bench-stream.bin /root/bench-write.bin")
	return f, err
}

func medianFloat(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// printAPI prints the API's figures of each root beside the raw channel.
func printAPI(figures []apiFigures, raw rawFigures) {
	cell := func(v, raw, floor float64) string {
		return fmt.Sprintf("%4.0f (%3.0f%% of raw, %3.0f%% of its floor)", v, 100*v/raw, 100*v/floor)
	}
	row := func(label, up, down string) { fmt.Printf("    %-56s %-36s %s\n", label, up, down) }
	fmt.Printf("  data through the per-VM API, one VM of each root, beside the raw channel measured now (a bare QEMU, same kernel, machine and virtio-serial device,\n")
	fmt.Printf("  busybox dd moving %d MiB over the port in 32 KiB blocks, one direction at a time); MiB/s, target ≥ 50%% of raw each way.\n", rawChannelBytes>>20)
	fmt.Printf("  Each figure's floor, what this guest does with nothing of ours: for files, the same bytes between the port and a virtio-blk disk of the\n")
	fmt.Printf("  bare QEMU (dd, 1 MiB blocks, O_DIRECT, as the agent's transfers); for exec output, the same command's output into cat in the guest (below):\n")
	row("", "host→guest", "guest→host")
	row("raw channel", fmt.Sprintf("%4.0f", raw.up), fmt.Sprintf("%4.0f", raw.down))
	row("raw channel and the guest's disk (the files' floor)", fmt.Sprintf("%4.0f", raw.diskUp), fmt.Sprintf("%4.0f", raw.diskDown))
	for _, f := range figures {
		row(fmt.Sprintf("%s root: exec output, %d MiB of head -c (median of %d)", f.root, f.execBytes>>20, f.runs), "", cell(f.execOut, raw.down, f.execPipe))
		row(fmt.Sprintf("%s root: a %d MiB file written whole (median of %d)", f.root, f.fileBytes>>20, f.runs), cell(f.fileIn, raw.up, raw.diskUp), "")
		row(fmt.Sprintf("%s root: a %d MiB file streamed each way", f.root, f.streamBytes>>20), cell(f.streamIn, raw.up, raw.diskUp), cell(f.streamOut, raw.down, raw.diskDown))
	}
	fmt.Printf("    (each figure includes its request's own start and end: for exec output about one exec round trip, below)\n")
	fmt.Printf("    exec output's floor in the guest itself, the same head -c into cat (the agent's clock, process start to exit, median of 3):")
	for i, f := range figures {
		if i > 0 {
			fmt.Printf(";")
		}
		fmt.Printf(" %s root %.0f MiB/s (%.0f%% of raw)", f.root, f.execPipe, 100*f.execPipe/raw.down)
	}
	fmt.Println()
	for _, f := range figures {
		for _, name := range slices.Sorted(maps.Keys(f.cpu)) {
			fmt.Printf("    CPU, %s root, %s: %s\n", f.root, name, f.cpu[name])
		}
	}
	fmt.Printf("  exec `true` round trip on a warm VM (p50 / p99 of 40 after 20):")
	for i, f := range figures {
		if i > 0 {
			fmt.Printf(";")
		}
		fmt.Printf(" %s root %.1f / %.1f ms", f.root, float64(f.execTrueP50.Microseconds())/1000, float64(f.execTrueP99.Microseconds())/1000)
	}
	fmt.Println()
}
