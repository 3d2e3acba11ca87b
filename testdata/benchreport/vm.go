package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/qemu"
)

// vmBench measures the VM path: `capsem process` create → exec-ready,
// resumed from a saved boot (the default) and booted, beside a bare QEMU
// boot of the same kernel and initramfs; exec round trips on a warm VM,
// channel throughput and the per-VM process's RSS.
func vmBench(capsem string, runs int) error {
	home := benchHome()
	guest := filepath.Join(filepath.Dir(capsem), "capsem-guest")
	assets, err := guestfs.Ensure(context.Background(), guestfs.Options{Dir: filepath.Join(home, "assets"), GuestBinary: guest, Progress: os.Stderr})
	if err != nil {
		return fmt.Errorf("assets: %w", err)
	}
	accel, err := accelBench(home, assets)
	if err != nil {
		return err
	}

	// Saved boots of this run only: the first VM always boots and saves.
	states, err := os.MkdirTemp("", "capsem-bench-states-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(states)
	resumeArgs := func(c *vmhost.ProcessConfig) { c.BootStateDir = states }
	bootArgs := func(c *vmhost.ProcessConfig) { c.NoBootState = true }
	first, firstTotal, firstTimings, err := capsemCycle(capsem, home, guest, resumeArgs, "booted_saved")
	if err != nil {
		return fmt.Errorf("first VM (boots and saves): %w", err)
	}
	stateBytes := int64(0)
	if saved, _ := filepath.Glob(filepath.Join(states, "*.state")); len(saved) == 1 {
		// The devices' state, and the RAM's data beside it.
		ram, _ := vmimage.Usage(vmm.MemoryPath(saved[0]))
		stateBytes = fileSize(saved[0]) + ram.Allocated
	}

	type series struct {
		ready, total []time.Duration
		phases       map[string][]int64
	}
	resumed, booted := series{phases: map[string][]int64{}}, series{phases: map[string][]int64{}}
	var bare, runTrue []time.Duration
	// capsem run goes through a service in a run directory of its own,
	// stopped at the end. The first run starts it (and boots and saves
	// when the home has no saved boot of the configuration yet), apart.
	runDir, err := os.MkdirTemp("", "csv-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(runDir)
	runEnv := append(os.Environ(), "CAPSEM_HOME="+home, "CAPSEM_RUN_DIR="+runDir, "CAPSEM_NO_AUTODETECT=1")
	defer func() {
		stop := exec.Command(capsem, "service", "stop")
		stop.Env = runEnv
		stop.Run()
	}()
	runOnce := func() (time.Duration, error) {
		t := time.Now()
		run := exec.Command(capsem, "--log-level", "warn", "run", "--", "true")
		run.Env = runEnv
		if out, err := run.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("capsem run -- true: %w: %s", err, out)
		}
		return time.Since(t), nil
	}
	firstRun, err := runOnce()
	if err != nil {
		return err
	}
	for i := 0; i < runs; i++ {
		d, err := bareBoot(assets, accel)
		if err != nil {
			return fmt.Errorf("bare boot: %w", err)
		}
		bare = append(bare, d)
		d, err = runOnce()
		if err != nil {
			return err
		}
		runTrue = append(runTrue, d)
		for _, m := range []struct {
			s     *series
			args  func(*vmhost.ProcessConfig)
			start string
		}{{&resumed, resumeArgs, "restored"}, {&booted, bootArgs, "booted"}} {
			r, tot, timings, err := capsemCycle(capsem, home, guest, m.args, m.start)
			if err != nil {
				return err
			}
			m.s.ready, m.s.total = append(m.s.ready, r), append(m.s.total, tot)
			for k, v := range timings {
				m.s.phases[k] = append(m.s.phases[k], v)
			}
		}
	}
	fw := qemu.PreferredFirmware()
	if fw == "" {
		fw = "SeaBIOS"
	}
	ratio := func(d time.Duration) float64 { return float64(d) / float64(median(bare)) }
	fmt.Printf("\nVM start under %s (-cpu %s), %d runs each, interleaved, medians (kernel %s, initramfs %d MB, firmware %s)\n", accel.Name, accel.CPU, runs, filepath.Base(assets.Kernel), fileSize(assets.Initramfs)>>20, filepath.Base(fw))
	fmt.Printf("  bare QEMU boot, same kernel+initramfs, start → first userspace print:      %s\n", ms(median(bare)))
	fmt.Printf("  capsem create → exec-ready, resumed from the saved boot:                   %s   (%.2f× bare; target ≤ 1.2×)\n", ms(median(resumed.ready)), ratio(median(resumed.ready)))
	fmt.Printf("  capsem create → exec-ready, booted (--no-boot-state):                      %s   (%.2f× bare)\n", ms(median(booted.ready)), ratio(median(booted.ready)))
	fmt.Printf("  first VM of a configuration, boots and saves (once): create → exec-ready   %s   (save %d ms, state %d MB)\n", ms(first), firstTimings["save_state"], stateBytes>>20)
	fmt.Printf("  capsem run -- true (the CLI through the service: boot, exec, remove), resumed from the saved boot: %s   (%.2f× bare; the first, which started the service: %s)\n", ms(median(runTrue)), ratio(median(runTrue)), ms(firstRun))
	fmt.Printf("  capsem create → exec `true` → stopped: resumed %s, booted %s (first VM %s)\n", ms(median(resumed.total)), ms(median(booted.total)), ms(firstTotal))
	keys := []string{"assets", "asset_hash", "state_hash", "disk", "qemu_start", "kernel_to_hello", "guest_kernel_to_init", "guest_modules", "guest_storage", "guest_channel", "guest_after_wake", "boot_config", "gateway", "ready", "exec", "shutdown"}
	for _, m := range []struct {
		name string
		s    series
	}{{"resumed", resumed}, {"booted", booted}} {
		fmt.Printf("  phases, %s (ms; the guest_ stages overlap, in guest clock):", m.name)
		for _, k := range keys {
			if v := m.s.phases[k]; len(v) > 0 {
				slices.Sort(v)
				fmt.Printf(" %s %d", k, v[len(v)/2])
			}
		}
		fmt.Println()
	}
	if err := tcgCacheBench(capsem, home, guest, accel, resumeArgs); err != nil {
		return err
	}
	if err := warmVM(capsem, home, guest); err != nil {
		return err
	}
	if err := netBench(capsem, home, guest, runs); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := ramApartBench(assets, accel); err != nil {
		return fmt.Errorf("RAM apart: %w", err)
	}
	return serviceBench(capsem, home, guest, assets.BootStateDir, runs)
}

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }

// bareBoot times QEMU start → the first userspace print of the same kernel
// and initramfs (busybox's shell as init, qemu.MarkerBoot): the earliest
// userspace can speak. Same machine type, firmware, CPUs, memory,
// accelerator and kernel parameters as capsem.
func bareBoot(a *guestfs.Assets, accel qemu.Accel) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return qemu.MarkerBoot{Files: qemu.BootFiles{Kernel: a.Kernel, Initramfs: a.Initramfs, Firmware: qemu.PreferredFirmware()},
		Accel: accel, CPUs: 2, MemoryMiB: 1024}.Run(ctx)
}

// accelBench prints what the accelerator decision costs: the proof of KVM
// the first time on this host boot (a verdict cache of its own), then the
// cached decision every VM start makes; and returns the decision.
func accelBench(home string, a *guestfs.Assets) (qemu.Accel, error) {
	fresh, err := os.MkdirTemp("", "capsem-bench-accel-")
	if err != nil {
		return qemu.Accel{}, err
	}
	defer os.RemoveAll(fresh)
	files := qemu.BootFiles{Kernel: a.Kernel, Initramfs: a.Initramfs, Firmware: qemu.PreferredFirmware()}
	ctx := context.Background()
	t := time.Now()
	if _, err := (&qemu.Backend{VerdictPath: filepath.Join(fresh, "accel.json")}).ChooseAccelFor(ctx, "", files); err != nil {
		return qemu.Accel{}, err
	}
	first := time.Since(t)
	b := &qemu.Backend{VerdictPath: filepath.Join(home, "run", "accel.json")}
	accel, err := b.ChooseAccelFor(ctx, "", files) // warms the cache a capsem VM uses
	if err != nil {
		return qemu.Accel{}, err
	}
	var cached []time.Duration
	for range 20 {
		t := time.Now()
		if _, err := b.ChooseAccelFor(ctx, "", files); err != nil {
			return qemu.Accel{}, err
		}
		cached = append(cached, time.Since(t))
	}
	fmt.Printf("\nAccelerator decision: %s -cpu %s (%s)\n", accel.Name, accel.CPU, accel.Reason)
	fmt.Printf("  first decision on this host boot (proves KVM where /dev/kvm opens): %s\n", ms(first))
	fmt.Printf("  cached decision, every later VM start: p50 %.2f ms (20 runs)\n", float64(median(cached).Microseconds())/1000)
	return accel, nil
}

type vmHandle struct {
	proc   *vmhost.Process
	client *apiclient.ProcessClient
	dir    string
}

// startProcess starts `capsem process` as the service does (vmhost.Launch), configured as edit says, and waits until it is ready;
// wantStart, when not "", is how the VM must have started.
func startProcess(capsem, home, guest string, edit func(*vmhost.ProcessConfig), wantStart string) (*vmHandle, time.Duration, map[string]int64, error) {
	dir, err := os.MkdirTemp("", "capsem-bench-vm-")
	if err != nil {
		return nil, 0, nil, err
	}
	cfg := vmhost.ProcessConfig{SessionDir: filepath.Join(dir, "s"), Socket: filepath.Join(dir, "p.sock"), Name: "bench",
		GuestBin: guest, VMConfig: api.VMConfig{CPUs: 2, RAMMB: 1024}}
	if edit != nil {
		edit(&cfg)
	}
	start := time.Now()
	proc, err := vmhost.Launch(cfg, vmhost.LaunchOptions{Executable: capsem, Env: append(os.Environ(), "CAPSEM_HOME="+home, "CAPSEM_LOG_LEVEL=warn")})
	if err != nil {
		return nil, 0, nil, err
	}
	h := &vmHandle{proc: proc, client: proc.Client, dir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	info, err := proc.WaitReady(ctx, nil)
	if err != nil {
		proc.Kill()
		return nil, 0, nil, err
	}
	took := time.Since(start)
	if wantStart != "" && info.Start != wantStart {
		h.stop()
		return nil, 0, nil, fmt.Errorf("the VM started %q, want %q", info.Start, wantStart)
	}
	return h, took, info.BootTimings, nil
}

func (h *vmHandle) stop() time.Duration {
	t := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h.proc.Stop(ctx)
	os.RemoveAll(h.dir)
	return time.Since(t)
}

func capsemCycle(capsem, home, guest string, extra func(*vmhost.ProcessConfig), wantStart string) (ready, total time.Duration, timings map[string]int64, err error) {
	start := time.Now()
	h, ready, timings, err := startProcess(capsem, home, guest, extra, wantStart)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("capsem process: %w", err)
	}
	t := time.Now()
	if _, err := h.client.Exec(context.Background(), &api.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
		h.stop()
		return 0, 0, nil, err
	}
	timings["exec"] = time.Since(t).Milliseconds()
	timings["shutdown"] = h.stop().Milliseconds()
	return ready, time.Since(start), timings, nil
}

// warmVM measures exec round trips, channel throughput and RSS on one VM.
func warmVM(capsem, home, guest string) error {
	h, _, _, err := startProcess(capsem, home, guest, nil, "")
	if err != nil {
		return err
	}
	defer h.stop()
	ctx := context.Background()
	idleRSS := rss(h.proc.PID(), "VmRSS")
	var lat []time.Duration
	for i := 0; i < 220; i++ {
		t := time.Now()
		if _, err := h.client.Exec(ctx, &api.ExecRequest{Argv: []string{"true"}}, nil, nil); err != nil {
			return err
		}
		if i >= 20 {
			lat = append(lat, time.Since(t))
		}
	}
	slices.Sort(lat)
	fmt.Printf("  exec `true` round trip on a warm VM: p50 %s p99 %s (target p50 ≤ 20 ms; reference 108 ms on KVM)\n",
		fmt.Sprintf("%.1f ms", float64(lat[len(lat)/2].Microseconds())/1000), fmt.Sprintf("%.1f ms", float64(lat[len(lat)*99/100].Microseconds())/1000))

	// guest → host: 10 MiB of exec output (just under the output cap).
	var sink countWriter
	t := time.Now()
	if _, err := h.client.Exec(ctx, &api.ExecRequest{Command: "head -c 10485760 /dev/zero"}, &sink, nil); err != nil {
		return err
	}
	out := float64(sink.n) / time.Since(t).Seconds() / (1 << 20)
	// host → guest: a 32 MiB file write.
	blob := make([]byte, 32<<20)
	t = time.Now()
	if err := h.client.WriteFile(ctx, "/tmp/bench.bin", blob, 0o600); err != nil {
		return err
	}
	in := float64(len(blob)) / time.Since(t).Seconds() / (1 << 20)
	fmt.Printf("  channel throughput through the API: guest→host %.0f MiB/s (exec output: the channel with no file behind it), host→guest %.0f MiB/s (a 32 MiB file write)\n", out, in)
	fmt.Printf("    (baseline from DESIGN §2: raw virtio-serial 49 MiB/s each way)\n")

	// Files stream in bounded chunks: 1 GiB each way, onto the guest's
	// disk, with the peak memory of both ends.
	const big = 1 << 30
	t = time.Now()
	if _, err := h.client.WriteFileFrom(ctx, "/root/bench-1g.bin", 0o600, io.LimitReader(zeros{}, big)); err != nil {
		return err
	}
	up := float64(big) / time.Since(t).Seconds() / (1 << 20)
	var back countWriter
	t = time.Now()
	if _, _, err := h.client.ReadFileTo(ctx, "/root/bench-1g.bin", false, 0, &back); err != nil {
		return err
	}
	down := float64(back.n) / time.Since(t).Seconds() / (1 << 20)
	var pid1 bytes.Buffer
	if _, err := h.client.Exec(ctx, &api.ExecRequest{Command: "grep VmHWM /proc/1/status; rm /root/bench-1g.bin"}, &pid1, nil); err != nil {
		return err
	}
	fmt.Printf("  a 1 GiB file through the per-VM API, streamed: host→guest %.0f MiB/s, guest→host %.0f MiB/s (same run, exec output above: %.0f MiB/s)\n", up, down, out)
	fmt.Printf("    peak memory: per-VM process %s, guest PID 1 %s\n", rss(h.proc.PID(), "VmHWM"), strings.TrimSpace(strings.TrimPrefix(pid1.String(), "VmHWM:")))

	if err := workspaceBench(ctx, h, out); err != nil {
		return err
	}

	// What the pending exec_events row adds to every exec: one more
	// durable ledger write before the command starts, timed alone on a
	// ledger of this machine's disk.
	pending, err := pendingRowCost()
	if err != nil {
		return err
	}
	fmt.Printf("  the pending exec_events row each exec now writes first: p50 %s per durable write (exec round trip above includes it; before it: about p50 − this)\n", us(pending))
	fmt.Printf("  per-VM process RSS: %s idle after boot, %s after the transfers, peak %s (QEMU itself is separate)\n",
		idleRSS, rss(h.proc.PID(), "VmRSS"), rss(h.proc.PID(), "VmHWM"))
	return nil
}

// workspaceBench times the workspace (served by the per-VM process over
// the channel, within its bound) beside the guest's own disk: bulk writes
// and reads of 256 MiB, and creating 500 small files, each timed in the
// guest.
func workspaceBench(ctx context.Context, h *vmHandle, channelMiBs float64) error {
	timed := func(script string) (time.Duration, error) {
		var out, errOut bytes.Buffer
		ev, err := h.client.Exec(ctx, &api.ExecRequest{Command: script}, &out, &errOut)
		if err != nil {
			return 0, err
		}
		if ev.ExitCode != 0 {
			return 0, fmt.Errorf("%q: exit %d: %s", script, ev.ExitCode, errOut.String())
		}
		return time.Duration(ev.DurationMS) * time.Millisecond, nil
	}
	type figures struct{ write, read, creates float64 }
	measure := func(dir string) (figures, error) {
		var f figures
		const mib = 256
		d, err := timed("mkdir -p " + dir + "/bench && dd if=/dev/zero of=" + dir + "/bench/big bs=1M count=256 conv=fsync 2>/dev/null")
		if err != nil {
			return f, err
		}
		f.write = mib / d.Seconds()
		// A fresh read: the disk's blocks leave the guest's page cache.
		if d, err = timed("sync; echo 3 > /proc/sys/vm/drop_caches; dd if=" + dir + "/bench/big of=/dev/null bs=1M 2>/dev/null"); err != nil {
			return f, err
		}
		f.read = mib / d.Seconds()
		if d, err = timed("cd " + dir + "/bench && i=0; while [ $i -lt 500 ]; do echo x > f$i; i=$((i+1)); done"); err != nil {
			return f, err
		}
		f.creates = 500 / d.Seconds()
		_, err = timed("rm -rf " + dir + "/bench")
		return f, err
	}
	ws, err := measure("/root/workspace")
	if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	disk, err := measure("/root")
	if err != nil {
		return fmt.Errorf("the guest's disk: %w", err)
	}
	fmt.Printf("  workspace (9p from the per-VM process over the channel, bounded): write %.0f MiB/s, read %.0f MiB/s, %.0f small files created/s\n", ws.write, ws.read, ws.creates)
	fmt.Printf("    beside: the guest's own disk (virtio-blk) write %.0f MiB/s, read %.0f MiB/s, %.0f files/s; the channel's floor (exec output above) %.0f MiB/s\n",
		disk.write, disk.read, disk.creates, channelMiBs)
	return nil
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// pendingRowCost is the median time of one durable exec_events write
// (what Exec waits for before the command starts).
func pendingRowCost() (time.Duration, error) {
	dir, err := os.MkdirTemp("", "capsem-bench-ledger-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	l, err := ledger.Open(ctx, filepath.Join(dir, "session.db"), ledger.Options{})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	var lat []time.Duration
	for i := 0; i < 220; i++ {
		t := time.Now()
		if err := l.Write(ctx, &ledger.ExecEvent{Command: "true", Pending: true}); err != nil {
			return 0, err
		}
		if i >= 20 {
			lat = append(lat, time.Since(t))
		}
	}
	return median(lat), nil
}

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// rss reads a memory figure (VmRSS, or VmHWM for the peak) of a process.
func rss(pid int, field string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// tcgCacheBench measures what bounding QEMU's TCG translation cache
// (vmm.Spec.TCGCacheMiB) buys and costs, on VMs resumed from the saved
// boot: the cache's resident size and QEMU's own memory outside guest RAM
// once the VM has run `true`, and the time of a Go program in the guest
// (capsem-doctor) once its code has been translated.
func tcgCacheBench(capsem, home, guest string, accel qemu.Accel, resume func(*vmhost.ProcessConfig)) error {
	if accel.Name != vmm.AccelTCG {
		fmt.Printf("\nTCG translation cache: not measured (VMs run under %s)\n", accel.Name)
		return nil
	}
	const ramMB = 1024
	fmt.Printf("\nTCG translation cache (QEMU tb-size), one VM (%d MB, 2 CPUs) resumed from the saved boot, 3 runs of capsem-doctor after one to translate it:\n", ramMB)
	var unbounded time.Duration
	for _, mib := range []int{0, 32, 16, 8} {
		h, _, _, err := startProcess(capsem, home, guest, func(c *vmhost.ProcessConfig) { resume(c); c.TCGCacheMiB = mib }, "restored")
		if err != nil {
			return fmt.Errorf("TCG cache %d MiB: %w", mib, err)
		}
		ctx := context.Background()
		run := func(command string) (time.Duration, error) {
			t := time.Now()
			_, err := h.client.Exec(ctx, &api.ExecRequest{Command: command}, nil, nil)
			return time.Since(t), err
		}
		info, err := h.client.Info(ctx)
		if err == nil {
			_, err = run("true")
		}
		if err != nil {
			h.stop()
			return err
		}
		idleCache := tcgResidentKB(info.QEMUPID)
		own, _, _ := qemuMemory(info.QEMUPID, ramMB)
		var times []time.Duration
		for i := range 4 {
			d, err := run("capsem-doctor --json >/dev/null")
			if err != nil {
				h.stop()
				return err
			}
			if i > 0 {
				times = append(times, d)
			}
		}
		busyCache := tcgResidentKB(info.QEMUPID)
		h.stop()
		label, slower := "unbounded (QEMU's default)", ""
		if mib == 0 {
			unbounded = median(times)
		} else {
			label = fmt.Sprintf("bounded to %d MiB", mib)
			slower = fmt.Sprintf(" (%.1f× unbounded)", float64(median(times))/float64(unbounded))
		}
		fmt.Printf("  %-27s after `true`: cache %d MB resident, QEMU's own %d MB; capsem-doctor %s%s, cache then %d MB\n",
			label+":", idleCache>>10, own>>10, ms(median(times)), slower, busyCache>>10)
	}
	return nil
}

// tcgResidentKB is the resident size of QEMU's translation cache: its one
// writable and executable mapping.
func tcgResidentKB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0
	}
	var kb int64
	inCache := false
	for _, l := range strings.Split(string(b), "\n") {
		fields := strings.Fields(l)
		switch {
		case len(fields) >= 2 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":"):
			inCache = fields[1] == "rwxp"
		case inCache && len(fields) >= 2 && fields[0] == "Rss:":
			v, _ := strconv.ParseInt(fields[1], 10, 64)
			kb += v
		}
	}
	return kb
}
