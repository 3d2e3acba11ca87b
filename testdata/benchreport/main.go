// Command benchreport measures the guest MCP path end to end and prints each
// figure beside its baseline from the same run:
//
//	gateway: go-sdk client → capsem-mcp-server (relay) → frames → endpoint
//	         → policy → aggregator → stdio echo server, every call a ledger row
//	direct:  go-sdk client → the same stdio echo server
//
// at concurrency 1, 16 and 64 (p50, p99, calls/s), for two echo servers:
// a small Go one (the baseline) and one on the MCP SDK's server.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/guestfs"
	"github.com/capsem/capsem/vmm/qemu"
)

type result struct {
	calls    int
	p50, p99 time.Duration
	perSec   float64
}

// concurrencyLevels are the gateway section's levels (-levels).
var concurrencyLevels []int

func main() {
	duration := flag.Duration("duration", 3*time.Second, "measuring time per concurrency level")
	vmRuns := flag.Int("vm-runs", 5, "boots per VM figure (0 skips the VM section)")
	gatewaySection := flag.Bool("gateway", true, "run the MCP gateway section")
	levels := flag.String("levels", "1,16,64", "comma-separated concurrency levels of the gateway section (for profiling one)")
	netOnly := flag.Bool("net-only", false, "run only the guest network's figures (for working on it)")
	imageOnly := flag.Bool("image-only", false, "run only the root image's figures (the full root beside the minimal)")
	apiOnly := flag.Bool("api-only", false, "run only the data figures through the per-VM API beside the raw channel (for working on the data path)")
	forkOnly := flag.Bool("fork-only", false, "run only the fork, suspend and image figures (and the measure of RAM kept apart from device state)")
	imageBuild := flag.Bool("image-build", false, "build the full root image when it is not current (minutes; the cold build is then measured)")
	flag.Parse()
	for _, f := range strings.Split(*levels, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "benchreport: -levels: %q is not a concurrency level\n", f)
			os.Exit(2)
		}
		concurrencyLevels = append(concurrencyLevels, n)
	}
	if *netOnly {
		capsem := os.Getenv("CAPSEM_TEST_BIN")
		if err := netBench(capsem, benchHome(), filepath.Join(filepath.Dir(capsem), "capsem-guest"), *vmRuns); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: network:", err)
			os.Exit(1)
		}
		return
	}
	if *apiOnly {
		capsem := os.Getenv("CAPSEM_TEST_BIN")
		if err := apiOnlyBench(capsem, benchHome(), filepath.Join(filepath.Dir(capsem), "capsem-guest")); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: API data:", err)
			os.Exit(1)
		}
		return
	}
	if *forkOnly {
		capsem := os.Getenv("CAPSEM_TEST_BIN")
		assets, err := guestfs.Ensure(context.Background(), guestfs.Options{Dir: filepath.Join(benchHome(), "assets"),
			GuestBinary: filepath.Join(filepath.Dir(capsem), "capsem-guest"), Progress: os.Stderr})
		var accel qemu.Accel
		if err == nil {
			files := qemu.BootFiles{Kernel: assets.Kernel, Initramfs: assets.Initramfs, Firmware: qemu.PreferredFirmware()}
			accel, err = (&qemu.Backend{VerdictPath: filepath.Join(benchHome(), "run", "accel.json")}).ChooseAccelFor(context.Background(), "", files)
		}
		if err == nil {
			err = ramApartBench(assets, accel)
		}
		if err == nil {
			err = forkOnlyBench(capsem, benchHome())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: fork:", err)
			os.Exit(1)
		}
		return
	}
	if *imageOnly {
		capsem := os.Getenv("CAPSEM_TEST_BIN")
		if err := imageBench(capsem, benchHome(), filepath.Join(filepath.Dir(capsem), "capsem-guest"), *vmRuns, *imageBuild); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: root image:", err)
			os.Exit(1)
		}
		return
	}
	if *gatewaySection {
		if err := run(*duration); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			os.Exit(1)
		}
	}
	if *vmRuns > 0 {
		capsem := os.Getenv("CAPSEM_TEST_BIN")
		if err := vmBench(capsem, *vmRuns); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: VM:", err)
			os.Exit(1)
		}
		err := imageBench(capsem, benchHome(), filepath.Join(filepath.Dir(capsem), "capsem-guest"), *vmRuns, *imageBuild)
		if errors.Is(err, errRootNotCurrent) {
			fmt.Printf("\nRoot image: not measured: %v\n", err)
		} else if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: root image:", err)
			os.Exit(1)
		}
	}
}

// benchHome is the CAPSEM_HOME the VM figures use: the test home in
// .tools, or $CAPSEM_BENCH_HOME; by its real path, as the sum cache of the
// home's assets names files by path (a worktree's .tools is a symlink to
// the main checkout's: through it, every asset would look new and be
// hashed again).
func benchHome() string {
	home := os.Getenv("CAPSEM_BENCH_HOME")
	if home == "" {
		root, _ := os.Getwd()
		home = filepath.Join(root, ".tools", "capsem-home")
	}
	if real, err := filepath.EvalSymlinks(home); err == nil {
		return real
	}
	return home
}

// echoServer is one stdio MCP server both paths call.
type echoServer struct {
	name, pkg, about string
}

// echoServers: the small Go echo server, and one on the MCP SDK's
// server (whose JSON decoding allocates ~128 KiB per call, so its own CPU
// and collector compete with the gateway's processes for the same cores).
var echoServers = []echoServer{
	{"echoserver", "./testdata/echoserver", "a small Go echo server: one loop, no SDK"},
	{"mcpecho", "./testdata/mcpecho", "the same tool on the MCP SDK's server"},
}

func run(d time.Duration) error {
	capsem := os.Getenv("CAPSEM_TEST_BIN")
	if capsem == "" {
		return fmt.Errorf("CAPSEM_TEST_BIN is not set (run via make bench)")
	}
	dir, err := os.MkdirTemp("", "capsem-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	build := func(name, pkg string) (string, error) {
		bin := filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return "", fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
		return bin, nil
	}
	linecat, err := build("linecat", "./testdata/linecat")
	if err != nil {
		return err
	}
	hop, err := build("hop", "./testdata/hop")
	if err != nil {
		return err
	}
	floor, err := measureFloor(dir, linecat, 2000)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	for i, srv := range echoServers {
		bin, err := build(srv.name, srv.pkg)
		if err != nil {
			return err
		}
		// The policy comparison does not depend on the server: it runs once.
		if err := runServer(capsem, dir, bin, hop, srv, d, i == 0); err != nil {
			return fmt.Errorf("%s: %w", srv.name, err)
		}
	}
	printFloor(floor)
	return nil
}

// runServer prints the direct vs gateway table for one echo server, and
// with withPolicy the realistic policy vs allow-all.
//
// Beside them it runs the same calls through three do-nothing Go processes
// (testdata/hop) in front of the server: as many processes as the gateway
// path adds, so that column is this machine's floor for the design before
// any gateway work, measured at each level under the same load.
func runServer(capsem, dir, echo, hop string, srv echoServer, d time.Duration, withPolicy bool) error {
	plain, err := startGateway(capsem, dir, srv.name+"-plain", fmt.Sprintf("[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n", echo), true)
	if err != nil {
		return err
	}
	defer plain.close()
	var policy *gateway
	if withPolicy {
		if policy, err = startGateway(capsem, dir, srv.name+"-policy", realisticPolicy(echo), false); err != nil {
			return err
		}
		defer policy.close()
	}
	direct, err := connect(exec.Command(echo))
	if err != nil {
		return fmt.Errorf("direct session: %w", err)
	}
	defer direct.Close()
	chainCmd := exec.Command(hop, hop, hop, echo)
	chain, err := connect(chainCmd)
	if err != nil {
		return fmt.Errorf("3-hop session: %w", err)
	}
	defer chain.Close()
	hopProcs := chainProcesses(chainCmd.Process.Pid)

	fmt.Printf("MCP echo round trip to %s (%s), %s per level (go-sdk client; 2-core machine)\n", srv.name, srv.about, d)
	fmt.Printf("%-4s | %-28s | %-28s | %-16s | %s\n", "c", "direct p50 / p99 / calls/s", "gateway p50 / p99 / calls/s", "added p50", "gateway/direct calls/s")
	var floorLines []string
	total := 0
	// The aggregator starts its servers in the background: one call through
	// the gateway makes sure the echo server is there to be named.
	if _, err := plain.session.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo__echo", Arguments: map[string]any{"text": "ping"}}); err != nil {
		return fmt.Errorf("first gateway call: %w", err)
	}
	procs := processes(plain.cmd.Process.Pid, plain.relay.Process.Pid, filepath.Base(echo))
	var cpuLines, policyLines []string
	for _, c := range concurrencyLevels {
		base := measure(direct, "echo", c, d)
		hopsBefore, hopSwitchesBefore := cpuTimes(hopProcs), contextSwitches(hopProcs)
		hops := measure(chain, "echo", c, d)
		floorLine := fmt.Sprintf("%-4d | %7s %8s %9.0f | %16s | %4.0f%%  |", c,
			us(hops.p50), us(hops.p99), hops.perSec, us(hops.p50-base.p50), 100*hops.perSec/base.perSec)
		hopsAfter, hopSwitchesAfter := cpuTimes(hopProcs), contextSwitches(hopProcs)
		for _, p := range hopProcs {
			floorLine += fmt.Sprintf(" %s %.0fµs %.1fcs", p.name, float64((hopsAfter[p.pid]-hopsBefore[p.pid]).Microseconds())/float64(hops.calls),
				float64(hopSwitchesAfter[p.pid]-hopSwitchesBefore[p.pid])/float64(hops.calls))
		}
		floorLines = append(floorLines, floorLine)
		before, switchesBefore := cpuTimes(procs), contextSwitches(procs)
		gwr := measure(plain.session, "echo__echo", c, d)
		after, switchesAfter := cpuTimes(procs), contextSwitches(procs)
		total += gwr.calls
		fmt.Printf("%-4d | %7s %8s %9.0f | %7s %8s %9.0f | %16s | %.0f%%\n", c,
			us(base.p50), us(base.p99), base.perSec, us(gwr.p50), us(gwr.p99), gwr.perSec,
			us(gwr.p50-base.p50), 100*gwr.perSec/base.perSec)
		line := fmt.Sprintf("c=%-3d", c)
		for _, p := range procs {
			line += fmt.Sprintf("  %s %.0fµs %.1fcs", p.name, float64((after[p.pid]-before[p.pid]).Microseconds())/float64(gwr.calls),
				float64(switchesAfter[p.pid]-switchesBefore[p.pid])/float64(gwr.calls))
		}
		cpuLines = append(cpuLines, line)
		if policy != nil {
			pol := measure(policy.session, "echo__echo", c, d)
			policyLines = append(policyLines, fmt.Sprintf("%-4d | %7s %8s %9.0f | %7s %8s %9.0f | %+8s",
				c, us(gwr.p50), us(gwr.p99), gwr.perSec, us(pol.p50), us(pol.p99), pol.perSec, us(pol.p50-gwr.p50)))
		}
	}
	fmt.Println("Floor: the direct call through 3 do-nothing Go processes (hop hop hop server; as many processes as the gateway path adds):")
	fmt.Printf("%-4s | %-28s | %-16s | %-6s | %s\n", "c", "3 hops p50 / p99 / calls/s", "added p50", "/direct", "CPU and context switches per call, by hop")
	for _, l := range floorLines {
		fmt.Println(l)
	}
	fmt.Println("CPU time and context switches (cs, all threads) per gateway call, by process:")
	for _, l := range cpuLines {
		fmt.Println("  " + l)
	}
	if policy != nil {
		fmt.Println("Gateway with the realistic policy (20 servers, 200 per-tool entries, 50 rules; 6 rules read this call's arguments) vs allow-all:")
		fmt.Printf("%-4s | %-28s | %-28s | %s\n", "c", "allow-all p50 / p99 / calls/s", "policy p50 / p99 / calls/s", "policy added p50")
		for _, l := range policyLines {
			fmt.Println(l)
		}
	}
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(plain.sessionDir, "session.db")+"?mode=ro")
	if err != nil {
		return err
	}
	defer db.Close()
	var rows int
	// Rows commit before their answer leaves, so every call is already there.
	if err := db.QueryRow(`SELECT COUNT(*) FROM mcp_calls WHERE tool_name='echo__echo' AND decision='allowed'`).Scan(&rows); err != nil {
		return err
	}
	fmt.Printf("ledger: %d gateway calls answered, %d mcp_calls rows (+%d warm-up)\n\n", total, rows, rows-total)
	if rows < total {
		return fmt.Errorf("%d calls have no ledger row", total-rows)
	}
	return nil
}

type gateway struct {
	cmd, relay *exec.Cmd
	session    *mcp.ClientSession
	sessionDir string
}

func (g *gateway) close() {
	if g.session != nil {
		g.session.Close()
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	g.cmd.Wait()
}

// startGateway runs `capsem gateway` with the given configuration and
// connects a go-sdk client to it through the relay.
func startGateway(capsem, dir, name, config string, profile bool) (*gateway, error) {
	sock := filepath.Join(dir, name+".sock")
	cfg := filepath.Join(dir, name+".toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return nil, err
	}
	g := &gateway{sessionDir: filepath.Join(dir, name+"-session")}
	g.cmd = exec.Command(capsem, "--log-level", "error", "gateway", "--listen", "unix:"+sock, "--session-dir", g.sessionDir, "--config", cfg, "--no-autodetect")
	noCorp := filepath.Join(dir, "corp-none.toml") // no corp policy: an empty file
	if err := os.WriteFile(noCorp, nil, 0o600); err != nil {
		return nil, err
	}
	g.cmd.Env = append(os.Environ(), "CAPSEM_HOME="+filepath.Join(dir, "home"), "CAPSEM_CORP_CONFIG="+noCorp)
	if p := os.Getenv("CAPSEM_BENCH_GATEWAY_PROFILE"); p != "" && profile {
		g.cmd.Env = append(g.cmd.Env, "CAPSEM_CPUPROFILE="+p)
	}
	// For experiments: extra environment for the gateway process only
	// (say GOMAXPROCS=2), space-separated.
	g.cmd.Env = append(g.cmd.Env, strings.Fields(os.Getenv("CAPSEM_BENCH_GATEWAY_ENV"))...)
	g.cmd.Stderr = os.Stderr
	if err := g.cmd.Start(); err != nil {
		return nil, err
	}
	for i := 0; ; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			break
		}
		if i > 300 {
			g.close()
			return nil, fmt.Errorf("gateway %s did not start", name)
		}
		time.Sleep(20 * time.Millisecond)
	}
	g.relay = exec.Command(filepath.Join(filepath.Dir(capsem), "capsem-mcp-server"))
	g.relay.Env = append(os.Environ(), "CAPSEM_MCP_ENDPOINT=unix:"+sock)
	if p := os.Getenv("CAPSEM_BENCH_RELAY_PROFILE"); p != "" && profile {
		g.relay.Env = append(g.relay.Env, "CAPSEM_CPUPROFILE="+p)
	}
	var err error
	if g.session, err = connect(g.relay); err != nil {
		g.close()
		return nil, fmt.Errorf("gateway %s session: %w", name, err)
	}
	return g, nil
}

// realisticPolicy is the policy issue's benchmark policy as TOML: 20
// allowed servers, 200 per-tool entries, 50 content rules of every kind,
// with the echo server as one of the servers.
func realisticPolicy(echo string) string {
	var b strings.Builder
	servers := []string{"echo"}
	for i := 1; i < 20; i++ {
		servers = append(servers, fmt.Sprintf("server%02d", i))
	}
	fmt.Fprintf(&b, "[mcp]\ndefault = \"allow\"\nblocked_servers = [\"evil\"]\nallowed_servers = [%q", servers[0])
	for _, s := range servers[1:] {
		fmt.Fprintf(&b, ", %q", s)
	}
	b.WriteString("]\n[mcp.tools]\n")
	for _, s := range servers {
		for t := 0; t < 10; t++ {
			d := "allow"
			if t%3 == 0 {
				d = "warn"
			}
			fmt.Fprintf(&b, "%q = %q\n", fmt.Sprintf("%s__tool%02d", s, t), d)
		}
	}
	for i := 0; i < 50; i++ {
		b.WriteString("[[mcp.rules]]\n")
		switch i % 5 {
		case 0:
			fmt.Fprintf(&b, "action = \"block\"\ntool = %q\nargument = \"payload.field%d\"\nmatches = \"^sk-[A-Za-z0-9]{20,}$\"\n", servers[i%20]+"__*", i)
		case 1:
			fmt.Fprintf(&b, "action = \"block\"\nargument = \"auth.token\"\nequals = \"secret-%d\"\n", i)
		case 2:
			fmt.Fprintf(&b, "action = \"block\"\nresource_uri = \"capsem://%s/private/*\"\n", servers[i%20])
		case 3:
			fmt.Fprintf(&b, "action = \"block\"\ntool = \"*__tool%02d\"\nreturns = \"structuredContent.secret\"\n", i%10)
		case 4:
			fmt.Fprintf(&b, "action = \"allow\"\ntool = \"%s__tool%02d\"\n", servers[i%20], i%10)
		}
	}
	fmt.Fprintf(&b, "[[mcp.servers]]\nname = \"echo\"\ncommand = %q\n", echo)
	return b.String()
}

type proc struct {
	name string
	pid  int
}

// processes names the gateway path's processes: relay, gateway, aggregator
// and the echo server (the binary named server) under it.
func processes(gateway, relay int, server string) []proc {
	out := []proc{{"relay", relay}, {"gateway", gateway}}
	for _, agg := range children(gateway) {
		out = append(out, proc{"aggregator", agg})
		for _, srv := range children(agg) {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", srv))
			if strings.Contains(string(cmd), server) {
				out = append(out, proc{"echo-server", srv})
			}
		}
	}
	return out
}

// chainProcesses names the hops of `hop hop hop server` started as pid.
func chainProcesses(pid int) []proc {
	var out []proc
	for i := 1; i <= 3 && pid > 0; i++ {
		out = append(out, proc{fmt.Sprintf("hop%d", i), pid})
		next := children(pid)
		if len(next) == 0 {
			break
		}
		pid = next[0]
	}
	return out
}

func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		var child int
		if _, err := fmt.Sscanf(e.Name(), "%d", &child); err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 1 && f[1] == fmt.Sprint(pid) {
			out = append(out, child)
		}
	}
	return out
}

// cpuTimes reads utime+stime of each process (clock ticks of 10 ms).
func cpuTimes(procs []proc) map[int]time.Duration {
	out := map[int]time.Duration{}
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		var ut, st int64
		fmt.Sscanf(f[11], "%d", &ut)
		fmt.Sscanf(f[12], "%d", &st)
		out[p.pid] = time.Duration(ut+st) * 10 * time.Millisecond
	}
	return out
}

// contextSwitches sums the voluntary and involuntary context switches of
// every thread of each process: each wake-up of a thread costs one, so
// they show how many hand-offs a call takes, with far less noise than time.
func contextSwitches(procs []proc) map[int]int64 {
	out := map[int]int64{}
	for _, p := range procs {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.pid))
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", p.pid, t.Name()))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				for _, key := range []string{"voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"} {
					if v, ok := strings.CutPrefix(line, key); ok {
						var n int64
						fmt.Sscanf(strings.TrimSpace(v), "%d", &n)
						out[p.pid] += n
					}
				}
			}
		}
	}
	return out
}

func connect(cmd *exec.Cmd) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return client.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
}

func measure(s *mcp.ClientSession, tool string, concurrency int, d time.Duration) result {
	ctx := context.Background()
	// Warm up.
	for i := 0; i < 50; i++ {
		s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": "ping"}})
	}
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(stop) {
				t0 := time.Now()
				res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"text": "ping"}})
				if err != nil || res.IsError {
					fmt.Fprintln(os.Stderr, "call failed:", err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	if len(lat) == 0 {
		return result{}
	}
	return result{calls: len(lat), p50: lat[len(lat)/2], p99: lat[len(lat)*99/100], perSec: float64(len(lat)) / elapsed.Seconds()}
}

func us(d time.Duration) string {
	return strings.TrimSuffix(fmt.Sprintf("%.0fµs", float64(d.Microseconds())), "")
}
