package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/vmhost"
)

// serviceBench measures the service and capsem mcp: list and info round
// trips through capsem mcp beside the service's own HTTP latency, create →
// exec-ready through the service beside a per-VM process launched
// directly, and 8 VMs created at once (time to the last ready, host RSS
// per VM outside guest RAM).
func serviceBench(capsem, home, guest, bootStates string, runs int) error {
	runDir, err := os.MkdirTemp("", "csb-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(runDir)
	env := append(os.Environ(), "CAPSEM_HOME="+home, "CAPSEM_RUN_DIR="+runDir, "CAPSEM_NO_AUTODETECT=1", "CAPSEM_LOG_LEVEL=warn")
	ctx := context.Background()
	cmd := exec.Command(capsem, "mcp")
	cmd.Env = env
	s, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		return err
	}
	defer s.Close()
	svc := apiclient.NewServiceClient(filepath.Join(runDir, "service.sock"), nil)
	defer func() {
		svc.Purge(ctx, true)
		svc.StopService(ctx)
	}()
	callTool := func(name string, args map[string]any) error {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err == nil && res.IsError {
			err = fmt.Errorf("%s: %v", name, res.Content)
		}
		return err
	}
	if err := callTool("capsem_version", map[string]any{}); err != nil { // starts the service
		return err
	}
	// One VM first, so that the saved boot of the configuration exists
	// (it boots and saves once) and every create below resumes.
	warm, err := svc.Create(ctx, api.CreateRequest{Name: "warm", VMConfig: api.VMConfig{RAMMB: 1024, CPUs: 2}})
	if err != nil {
		return err
	}

	fmt.Printf("\nService and capsem mcp (%s)\n", runDir)
	lat := func(n int, f func() error) ([]time.Duration, error) {
		var out []time.Duration
		for i := 0; i < n+20; i++ {
			t := time.Now()
			if err := f(); err != nil {
				return nil, err
			}
			if i >= 20 {
				out = append(out, time.Since(t))
			}
		}
		slices.Sort(out)
		return out, nil
	}
	p := func(d []time.Duration) string {
		return fmt.Sprintf("p50 %s p99 %s", us(d[len(d)/2]), us(d[len(d)*99/100]))
	}
	for _, m := range []struct {
		name      string
		mcp, http func() error
	}{
		{"list", func() error { return callTool("capsem_list", map[string]any{}) }, func() error { _, err := svc.List(ctx); return err }},
		{"info", func() error { return callTool("capsem_info", map[string]any{"id": "warm"}) }, func() error { _, err := svc.Info(ctx, "warm"); return err }},
	} {
		viaMCP, err := lat(300, m.mcp)
		if err != nil {
			return err
		}
		viaHTTP, err := lat(300, m.http)
		if err != nil {
			return err
		}
		fmt.Printf("  capsem_%s through capsem mcp: %s   service HTTP on its socket: %s\n", m.name, p(viaMCP), p(viaHTTP))
	}
	if err := cpBench(ctx, capsem, env, runDir, svc); err != nil {
		return err
	}
	if err := forkBench(ctx, svc, home); err != nil {
		return err
	}
	if err := svc.Delete(ctx, warm.ID); err != nil {
		return err
	}

	// create → exec-ready: through the service, and a per-VM process
	// launched directly (vmhost.Launch, as the service does), interleaved,
	// both resuming the saved boot in the assets' directory.
	var viaService, direct []time.Duration
	for range runs {
		t := time.Now()
		v, err := svc.Create(ctx, api.CreateRequest{VMConfig: api.VMConfig{RAMMB: 1024, CPUs: 2}})
		if err != nil {
			return err
		}
		viaService = append(viaService, time.Since(t))
		if _, err := svc.Exec(ctx, v.ID, api.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
		if err := svc.Delete(ctx, v.ID); err != nil {
			return err
		}
		h, took, _, err := startProcess(capsem, home, guest, func(c *vmhost.ProcessConfig) { c.NoAutodetect = true }, "restored")
		if err != nil {
			return fmt.Errorf("direct: %w", err)
		}
		direct = append(direct, took)
		h.stop()
	}
	added := median(viaService) - median(direct)
	fmt.Printf("  create → exec-ready through the service: %s   launched directly: %s   added %s (%.0f%%; target ≤ 10%% or ≤ 30 ms), %d runs, medians\n",
		ms(median(viaService)), ms(median(direct)), ms(added), 100*float64(added)/float64(median(direct)), runs)

	// 8 VMs at once, twice: of a configuration not saved yet (one of
	// them boots to save it, the others wait and resume from it), then of
	// the same configuration again, saved.
	for i, round := range []string{"cold: no saved boot yet", "warm: resumed from the saved boot"} {
		if i == 0 {
			if err := os.RemoveAll(bootStates); err != nil {
				return err
			}
		}
		if err := manyAtOnce(ctx, svc, round); err != nil {
			return err
		}
	}
	return nil
}

// manyAtOnce creates 8 VMs at once, checks that each answers exec, prints
// the time to the first and last ready and their memory, and deletes them.
func manyAtOnce(ctx context.Context, svc *apiclient.ServiceClient, round string) error {
	const n = 8
	var wg sync.WaitGroup
	ready := make([]time.Duration, n)
	ids := make([]string, n)
	errs := make([]error, n)
	t := time.Now()
	for i := range n {
		wg.Go(func() {
			v, err := svc.Create(ctx, api.CreateRequest{VMConfig: api.VMConfig{RAMMB: 512, CPUs: 1}})
			ready[i], ids[i], errs[i] = time.Since(t), v.ID, err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("8 at once: %w", err)
		}
	}
	for _, id := range ids {
		if r, err := svc.Exec(ctx, id, api.ExecRequest{Argv: []string{"true"}}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("8 at once: exec on %s: %v %+v", id, err, r)
		}
	}
	slices.Sort(ready)
	var ours, qemuOwn, guestRAM, rssAll []int64
	byRole := map[string][]int64{}
	for _, id := range ids {
		info, err := svc.Info(ctx, id)
		if err != nil {
			return err
		}
		m := vmMemory(info.PID, info.Process.QEMUPID, 512)
		ours, qemuOwn, guestRAM, rssAll = append(ours, m.ours), append(qemuOwn, m.qemuOwn), append(guestRAM, m.guest), append(rssAll, m.rss)
		for r, kb := range m.byRole {
			byRole[r] = append(byRole[r], kb)
		}
	}
	fmt.Printf("  %d VMs created at once (512 MB, 1 CPU each), %s: all answering exec; first ready %s, last %s\n", n, round, ms(ready[0]), ms(ready[n-1]))
	fmt.Printf("  host memory per VM outside guest RAM, proportional (PSS: the shared capsem and QEMU text counted once across VMs): %d MB (target ≤ 40 MB) =\n", (medianInt(ours)+medianInt(qemuOwn))>>10)
	fmt.Printf("    the floor, QEMU's own memory (its TCG translation cache included; see the TCG cache figures above for what bounding it costs): %d MB\n", medianInt(qemuOwn)>>10)
	var roles []string
	for _, r := range slices.Sorted(maps.Keys(byRole)) {
		roles = append(roles, fmt.Sprintf("%s %.1f", r, float64(medianInt(byRole[r]))/1024))
	}
	fmt.Printf("    + what capsem adds, per-VM process + aggregator + builtin (three Go processes): %d MB (%s MB)\n", medianInt(ours)>>10, strings.Join(roles, ", "))
	fmt.Printf("    guest RAM touched %d MB; plain RSS of the tree outside guest RAM %d MB\n", medianInt(guestRAM)>>10, medianInt(rssAll)>>10)
	for _, id := range ids {
		if err := svc.Delete(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func medianInt(v []int64) int64 {
	slices.Sort(v)
	return v[len(v)/2]
}

type memFigures struct {
	ours, qemuOwn, guest, rss int64 // kB
	byRole                    map[string]int64
}

// vmMemory measures the process tree of one VM (per-VM process pid, its
// QEMU qemuPID with ramMB of guest RAM): PSS of capsem's processes, PSS of
// QEMU apart from its guest RAM mapping, the guest RAM's PSS, and the
// tree's plain RSS outside guest RAM.
func vmMemory(pid, qemuPID, ramMB int) memFigures {
	m := memFigures{byRole: map[string]int64{}}
	for _, p := range append([]int{pid}, descendants(pid)...) {
		if p == qemuPID {
			own, guest, ownRSS := qemuMemory(p, ramMB)
			m.qemuOwn, m.guest, m.rss = m.qemuOwn+own, m.guest+guest, m.rss+ownRSS
			continue
		}
		pss := rollupKB(p, "Pss")
		m.ours += pss
		m.rss += rollupKB(p, "Rss")
		m.byRole[role(p)] += pss
	}
	return m
}

// role names one of a VM's capsem processes by its personality.
func role(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	args := strings.Split(string(b), "\x00")
	if len(args) > 1 {
		return args[1]
	}
	return "other"
}

func descendants(pid int) []int {
	var out []int
	for _, c := range children(pid) {
		out = append(out, c)
		out = append(out, descendants(c)...)
	}
	return out
}

func rollupKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb
		}
	}
	return 0
}

// qemuMemory splits QEMU's PSS (kB) into its guest RAM mapping (exactly
// ramMB) and the rest, and gives the rest's plain RSS too.
func qemuMemory(pid, ramMB int) (own, guest, ownRSS int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, 0
	}
	defer f.Close()
	var size int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		isGuest := size == int64(ramMB)<<10
		switch fields[0] {
		case "Size:":
			size = v
		case "Pss:":
			if isGuest {
				guest += v
			} else {
				own += v
			}
		case "Rss:":
			if !isGuest {
				ownRSS += v
			}
		}
	}
	return own, guest, ownRSS
}

// cpBench copies a 256 MiB file into the warm VM and back with capsem cp
// (through the service, streamed), beside the exec output stream of the
// same VM as the raw channel, with the peak memory of the CLI, the
// service and the VM's process.
func cpBench(ctx context.Context, capsem string, env []string, runDir string, svc *apiclient.ServiceClient) error {
	const size = 256 << 20
	src, dst := filepath.Join(runDir, "cp-src.bin"), filepath.Join(runDir, "cp-back.bin")
	f, err := os.Create(src)
	if err != nil {
		return err
	}
	_, err = io.CopyN(f, zeros{}, size)
	f.Close()
	if err != nil {
		return err
	}
	defer os.Remove(src)
	defer os.Remove(dst)
	cp := func(args ...string) (float64, int64, error) {
		cmd := exec.Command(capsem, append([]string{"cp"}, args...)...)
		cmd.Env = env
		t := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, 0, fmt.Errorf("capsem cp %v: %v: %s", args, err, out)
		}
		rate := float64(size) / time.Since(t).Seconds() / (1 << 20)
		return rate, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss, nil
	}
	up, upRSS, err := cp(src, "warm:/root/cp.bin")
	if err != nil {
		return err
	}
	down, downRSS, err := cp("warm:/root/cp.bin", dst)
	if err != nil {
		return err
	}
	t := time.Now()
	if _, err := svc.Exec(ctx, "warm", api.ExecRequest{Command: "head -c 10485760 /dev/zero; rm /root/cp.bin"}); err != nil {
		return err
	}
	raw := float64(10<<20) / time.Since(t).Seconds() / (1 << 20)
	ver, err := svc.Version(ctx)
	if err != nil {
		return err
	}
	vm, err := svc.Info(ctx, "warm")
	if err != nil {
		return err
	}
	fmt.Printf("  capsem cp of a 256 MiB file through the service, streamed: into the VM %.0f MiB/s, out %.0f MiB/s (the channel with no file behind it, exec output through the service: %.0f MiB/s)\n", up, down, raw)
	fmt.Printf("    peak memory: capsem cp %d / %d MB, the service %s, the VM's process %s\n", upRSS>>10, downRSS>>10, rss(ver.PID, "VmHWM"), rss(vm.PID, "VmHWM"))
	return nil
}
