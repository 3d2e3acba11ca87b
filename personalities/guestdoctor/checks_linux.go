package guestdoctor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/mountinfo"
)

// Paths of the guest the checks look at.
const (
	relayBinary   = "capsem-mcp-server"
	doctorBinary  = "capsem-doctor"
	initramfsView = guestwire.GuestInitramfs // the initramfs, read-only (the agent's storage stage)
	baseMount     = guestwire.GuestRootImage
	cmdlinePath   = "/proc/cmdline"
)

// vmHint is the fix of a failed guest check that names none of its own.
const vmHint = "this VM is not as capsem makes it: run capsem doctor on the host, and report it with the VM's console log"

// clockTolerance is how far the guest's clock may be from the host's.
const clockTolerance = 5 * time.Second

func checks(expectEnv map[string]string, probeURL string) []doctor.Group {
	return []doctor.Group{
		{Name: "env", Hint: vmHint, Checks: []doctor.Check{
			{Name: "hostname", Run: checkHostname},
			{Name: "clock", Run: checkClock},
			{Name: "injected-env", Run: func(ctx context.Context, r *doctor.Reporter) { checkInjectedEnv(r, expectEnv) }},
			{Name: "refused-env", Run: checkRefusedEnv},
			{Name: "path-home", Run: checkPathHome},
		}},
		{Name: "fs", Hint: vmHint, Checks: []doctor.Check{
			{Name: "overlay-root", Run: checkOverlayRoot},
			{Name: "upper-on-disk", Run: checkUpperOnDisk},
			{Name: "workspace", Run: checkWorkspace},
			{Name: "base-read-only", Run: checkBaseReadOnly},
			{Name: "writable-dirs", Run: checkWritableDirs},
		}},
		{Name: "exec", Hint: vmHint, Checks: []doctor.Check{
			{Name: "streams", Run: checkStreams},
			{Name: "exit-codes", Run: checkExitCodes},
			{Name: "group-kill", Run: checkGroupKill},
		}},
		{Name: "mcp", Hint: vmHint, Checks: []doctor.Check{
			{Name: "relay", Run: checkMCP},
		}},
		{Name: "agents", Hint: vmHint, Checks: agentChecks()},
		{Name: "net", Hint: vmHint, Checks: netChecks(probeURL)},
		{Name: "sandbox", Hint: vmHint, Checks: []doctor.Check{
			{Name: "raw-memory", Run: checkRawMemory},
			{Name: "no-setuid", Run: checkNoSetuid},
			{Name: "binaries-read-only", Run: checkBinariesReadOnly},
		}},
	}
}

// --- env

func bootFacts() (guestwire.BootFacts, error) {
	var f guestwire.BootFacts
	b, err := os.ReadFile(guestwire.GuestBootFacts)
	if err != nil {
		return f, fmt.Errorf("the agent's boot facts: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("the agent's boot facts %s: %w", guestwire.GuestBootFacts, err)
	}
	return f, nil
}

const agentHint = "the agent did not apply the host's boot config: see the VM's console log"

func checkHostname(_ context.Context, r *doctor.Reporter) {
	f, err := bootFacts()
	if err != nil {
		r.Failf(agentHint, "%v", err)
		return
	}
	h, err := os.Hostname()
	switch {
	case err != nil:
		r.Failf(agentHint, "reading the host name: %v", err)
	case f.Hostname == "":
		r.Failf(agentHint, "the host gave no VM name")
	case h != f.Hostname:
		r.Failf(agentHint, "host name %q, but the VM is %q", h, f.Hostname)
	default:
		r.Okf("%s (the VM's name)", h)
	}
}

func checkClock(_ context.Context, r *doctor.Reporter) {
	f, err := bootFacts()
	if err != nil || f.HostClockUnixNano == 0 {
		r.Failf(agentHint, "no host clock to compare with (%v)", err)
		return
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		r.Failf("", "CLOCK_BOOTTIME: %v", err)
		return
	}
	host := time.Unix(0, f.HostClockUnixNano+(ts.Nano()-f.BootTimeNano))
	off := time.Since(host)
	if off < -clockTolerance || off > clockTolerance {
		r.Failf("the guest's clock was not set from the host's, or drifted", "guest clock %s, host's %s: %v apart (at most %v)",
			time.Now().UTC().Format(time.RFC3339), host.UTC().Format(time.RFC3339), off.Round(time.Millisecond), clockTolerance)
		return
	}
	r.Okf("within %v of the host's (tolerance %v)", off.Abs().Round(time.Millisecond), clockTolerance)
}

func checkInjectedEnv(r *doctor.Reporter, expect map[string]string) {
	f, _ := bootFacts()
	var missing, found []string
	for _, k := range f.EnvKeys {
		if _, ok := os.LookupEnv(k); !ok {
			missing = append(missing, k+" (boot config)")
		} else {
			found = append(found, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(expect)) {
		if v, ok := os.LookupEnv(k); !ok || v != expect[k] {
			missing = append(missing, fmt.Sprintf("%s=%q (got %q)", k, expect[k], v))
		} else {
			found = append(found, k)
		}
	}
	switch {
	case len(missing) > 0:
		r.Failf("the agent did not pass the host's environment to the command", "missing: %s", strings.Join(missing, ", "))
	case len(found) == 0:
		r.Okf("nothing injected to check (the boot config set no environment; --expect-env names more)")
	default:
		r.Okf("present: %s", strings.Join(found, ", "))
	}
}

func checkRefusedEnv(_ context.Context, r *doctor.Reporter) {
	var bad []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if err := guestwire.ValidateEnvKey(k); err != nil {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		r.Failf("the agent let an injection variable through", "refused variables present: %s", strings.Join(bad, ", "))
		return
	}
	r.Okf("none of LD_*, BASH_FUNC_*, BASH_ENV, ENV, IFS, PS4, ... in %d variables", len(os.Environ()))
}

func checkPathHome(_ context.Context, r *doctor.Reporter) {
	path := os.Getenv("PATH")
	dirs := filepath.SplitList(path)
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			r.Failf("a relative PATH entry runs whatever the current directory holds", "PATH %q has the relative entry %q", path, d)
			return
		}
	}
	for _, need := range []string{"/usr/bin", "/bin"} {
		if !slices.Contains(dirs, need) {
			r.Failf("", "PATH %q lacks %s", path, need)
			return
		}
	}
	if _, err := exec.LookPath("sh"); err != nil {
		r.Failf("", "no sh in PATH %q: %v", path, err)
		return
	}
	home := os.Getenv("HOME")
	if st, err := os.Stat(home); !filepath.IsAbs(home) || err != nil || !st.IsDir() {
		r.Failf("", "HOME %q is not an existing absolute directory (%v)", home, err)
		return
	}
	r.Okf("PATH %s; HOME %s", path, home)
}

// --- fs

// mountTable reads the mount table, or reports the check failed.
func mountTable(r *doctor.Reporter) ([]mountinfo.Entry, bool) {
	ms, err := mountinfo.Self()
	if err != nil {
		r.Failf("", "%v", err)
		return nil, false
	}
	return ms, true
}

// cmdlineValue is a parameter of the kernel's command line, which says what
// storage the host attached.
func cmdlineValue(key string) string {
	b, _ := os.ReadFile(cmdlinePath)
	v, _ := guestwire.CmdlineValue(string(b), key)
	return v
}

func checkOverlayRoot(_ context.Context, r *doctor.Reporter) {
	ms, ok := mountTable(r)
	if !ok {
		return
	}
	root, ok := mountinfo.At(ms, "/")
	upper := cmdlineValue(guestwire.CmdlineUpperDisk)
	switch {
	case upper == "":
		r.Warnf("give the VM a disk (the default) to keep what is installed across stop and resume",
			"the VM has no per-VM disk: the root is the initramfs, in RAM (%s)", root.FSType)
	case !ok || root.FSType != "overlay":
		r.Failf("the agent's storage stage did not switch the root: see the VM's console log",
			"the host attached the disk %q, but / is %q, not an overlay", upper, root.FSType)
	default:
		r.Okf("/ is an overlay: lower %s, upper %s", mountinfo.Option(root.Super, "lowerdir"), mountinfo.Option(root.Super, "upperdir"))
	}
}

func checkUpperOnDisk(_ context.Context, r *doctor.Reporter) {
	serial := cmdlineValue(guestwire.CmdlineUpperDisk)
	if serial == "" {
		r.Warnf("give the VM a disk (the default)", "no per-VM disk attached: writes live in RAM and go with the VM")
		return
	}
	ms, ok := mountTable(r)
	if !ok {
		return
	}
	root, _ := mountinfo.At(ms, "/")
	upperdir := mountinfo.Option(root.Super, "upperdir")
	if upperdir == "" {
		r.Failf("the agent's storage stage did not switch the root", "/ has no overlay upper layer")
		return
	}
	// The mount holding the upper layer: the longest target that contains it.
	var holder mountinfo.Entry
	for _, m := range ms {
		if (upperdir == m.Target || strings.HasPrefix(upperdir, strings.TrimSuffix(m.Target, "/")+"/")) && len(m.Target) >= len(holder.Target) {
			holder = m
		}
	}
	dev := filepath.Base(holder.Source)
	got, err := os.ReadFile(filepath.Join("/sys/block", dev, "serial"))
	if err != nil || strings.TrimSpace(string(got)) != serial {
		r.Failf("the upper layer must be on the VM's own disk, or nothing persists", "upper layer %s is on %s (%s), not the disk with serial %q (%v)",
			upperdir, holder.Source, holder.FSType, serial, err)
		return
	}
	r.Okf("upper layer %s on %s (%s, serial %s)", upperdir, holder.Source, holder.FSType, serial)
}

// roundTrip writes a file in dir, reads it back and removes it.
func roundTrip(dir string) error {
	f, err := os.CreateTemp(dir, ".capsem-doctor-*")
	if err != nil {
		return err
	}
	name := f.Name()
	defer os.Remove(name)
	want := []byte("capsem-doctor " + strconv.FormatInt(time.Now().UnixNano(), 10))
	if _, err := f.Write(want); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	got, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("read back %q, wrote %q", got, want)
	}
	return os.Remove(name)
}

func checkWorkspace(_ context.Context, r *doctor.Reporter) {
	tag := cmdlineValue(guestwire.CmdlineWorkspace)
	if tag == "" {
		r.Warnf("without a workspace, nothing the guest writes is visible on the host", "the VM has no host workspace")
		return
	}
	ms, ok := mountTable(r)
	if !ok {
		return
	}
	m, ok := mountinfo.At(ms, guestwire.GuestWorkspace)
	if !ok || m.FSType != "9p" || m.Source != tag {
		r.Failf("the agent mounts it at boot: see the VM's console log; something in the guest may have unmounted it",
			"the host shared the workspace %q, but %s is not mounted from it (found %q %q)", tag, guestwire.GuestWorkspace, m.FSType, m.Source)
		return
	}
	if err := roundTrip(guestwire.GuestWorkspace); err != nil {
		r.Failf("the host's workspace directory must be writable by the VM's QEMU", "%s is mounted but not writable: %v", guestwire.GuestWorkspace, err)
		return
	}
	r.Okf("%s: 9p %q, writable", guestwire.GuestWorkspace, tag)
}

func checkBaseReadOnly(_ context.Context, r *doctor.Reporter) {
	if cmdlineValue(guestwire.CmdlineUpperDisk) == "" {
		r.Warnf("give the VM a disk (the default) to keep what is installed across stop and resume", "no overlay: the root is the initramfs itself, in RAM")
		return
	}
	ms, ok := mountTable(r)
	if !ok {
		return
	}
	// The root's lower layer: the root image when the VM has one, else
	// the initramfs (always in view, for its capsem binary).
	lowers := []string{initramfsView}
	if cmdlineValue(guestwire.CmdlineLowerDisk) != "" {
		m, ok := mountinfo.At(ms, baseMount)
		if !ok || m.FSType != "erofs" {
			r.Failf("the agent mounts the root image at boot: see the VM's console log", "the VM has a root image, but %s is not an erofs mount (found %q)", baseMount, m.FSType)
			return
		}
		lowers = append(lowers, baseMount)
	}
	for _, lower := range lowers {
		m, ok := mountinfo.At(ms, lower)
		if !ok || !slices.Contains(strings.Split(m.Options, ","), "ro") {
			r.Failf("the agent mounts the base read-only at boot", "the base %s is not mounted read-only (%q)", lower, m.Options)
			return
		}
		err := os.WriteFile(filepath.Join(lower, ".capsem-doctor"), []byte("x"), 0o600)
		if !errors.Is(err, unix.EROFS) {
			os.Remove(filepath.Join(lower, ".capsem-doctor"))
			r.Failf("the agent mounts the base read-only at boot", "a write to the base %s gave %v, want EROFS", lower, err)
			return
		}
	}
	r.Okf("%s read-only (a write fails with EROFS)", strings.Join(lowers, " and "))
}

func checkWritableDirs(_ context.Context, r *doctor.Reporter) {
	var ok []string
	for _, d := range []string{"/usr/local", "/tmp", "/root"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			r.Failf("", "%s: %v", d, err)
			return
		}
		if err := roundTrip(d); err != nil {
			r.Failf("the root overlay must be writable", "writing in %s: %v", d, err)
			return
		}
		ok = append(ok, d)
	}
	r.Okf("wrote, read back and removed a file in %s", strings.Join(ok, ", "))
}

// --- exec

func shell(ctx context.Context, script string) *exec.Cmd {
	return exec.CommandContext(ctx, "sh", "-c", script)
}

func checkStreams(ctx context.Context, r *doctor.Reporter) {
	var out, errb bytes.Buffer
	cmd := shell(ctx, "echo to-stdout; echo to-stderr >&2; exit 7")
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 || out.String() != "to-stdout\n" || errb.String() != "to-stderr\n" {
		r.Failf("", "stdout %q, stderr %q, %v: want them apart and exit status 7", out.String(), errb.String(), err)
		return
	}
	r.Okf("stdout and stderr apart, exit status 7 kept")
}

func checkExitCodes(ctx context.Context, r *doctor.Reporter) {
	for _, c := range []struct {
		script string
		code   int
		signal syscall.Signal
	}{{"exit 0", 0, 0}, {"exit 1", 1, 0}, {"exit 255", 255, 0}, {"kill -KILL $$", -1, syscall.SIGKILL}} {
		err := shell(ctx, c.script).Run()
		code, sig := 0, syscall.Signal(0)
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				sig = ws.Signal()
			}
		} else if err != nil {
			r.Failf("", "%q: %v", c.script, err)
			return
		}
		if code != c.code || sig != c.signal {
			r.Failf("", "%q ended with status %d signal %v, want %d %v", c.script, code, sig, c.code, c.signal)
			return
		}
	}
	r.Okf("exit statuses 0, 1, 255 and death by SIGKILL reported as such")
}

// checkGroupKill: a command that outlives its deadline goes with its whole
// process group, children included (what an exec timeout does).
func checkGroupKill(ctx context.Context, r *doctor.Reporter) {
	cmd := shell(ctx, "sleep 300 & echo $!; sleep 300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	if err := cmd.Start(); err != nil {
		r.Failf("", "starting a process group: %v", err)
		return
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	child, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		cmd.Process.Kill()
		cmd.Wait()
		r.Failf("", "reading the background child's pid: %v %v", err, perr)
		return
	}
	if err := unix.Kill(-cmd.Process.Pid, unix.SIGKILL); err != nil {
		r.Failf("", "killing process group %d: %v", cmd.Process.Pid, err)
		return
	}
	cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		state := procState(child)
		if state == "" || state == "Z" { // gone, or dead and not yet reaped
			break
		}
		if time.Now().After(deadline) {
			r.Failf("", "the group's background child %d is still %s 5 s after the group was killed", child, state)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Okf("killing the process group took its background child (pid %d) too", child)
}

// procState is a process's state letter, "" when it is gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return string(b[i+2])
	}
	return "?"
}

// --- mcp

// mcpTimeout bounds each answer of the relay.
const mcpTimeout = 60 * time.Second

// mcpSession speaks JSON-RPC lines to the relay.
type mcpSession struct {
	in    io.WriteCloser
	lines chan []byte
}

func (s *mcpSession) send(line string) error {
	_, err := io.WriteString(s.in, line+"\n")
	return err
}

// answer waits for the response with this id.
func (s *mcpSession) answer(id int) (map[string]json.RawMessage, error) {
	t := time.After(mcpTimeout)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				return nil, errors.New("the relay closed its output")
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(line, &m) != nil {
				return nil, fmt.Errorf("the relay wrote a line that is not JSON: %.200q", line)
			}
			if string(m["id"]) == strconv.Itoa(id) {
				return m, nil
			}
		case <-t:
			return nil, fmt.Errorf("no answer to request %d within %v", id, mcpTimeout)
		}
	}
}

// relayEnv is this process's environment without the relay's endpoint
// override: the check is of the default path to the host.
func relayEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envvars.MCPEndpoint.Name()+"=") {
			env = append(env, kv)
		}
	}
	return env
}

func checkMCP(ctx context.Context, r *doctor.Reporter) {
	path, err := exec.LookPath(relayBinary)
	if err != nil {
		r.Failf("the agent links it at boot: see the VM's console log", "%s: %v", relayBinary, err)
		return
	}
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = relayEnv()
	in, err := cmd.StdinPipe()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		r.Failf("", "starting %s: %v", path, err)
		return
	}
	s := &mcpSession{in: in, lines: make(chan []byte, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			s.lines <- bytes.Clone(sc.Bytes())
		}
		close(s.lines)
	}()
	defer func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
	fail := func(step string, err error) {
		r.Failf("the gateway path: capsem-mcp-server → port 5002 → the host's MCP endpoint; see the VM's process log",
			"%s: %v (relay stderr: %.300s)", step, err, strings.TrimSpace(stderr.String()))
	}
	steps := []struct {
		name  string
		send  []string
		id    int
		check func(map[string]json.RawMessage) (string, error)
	}{
		{"initialize", []string{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"capsem-doctor","version":"1"}}}`,
			`{"jsonrpc":"2.0","method":"notifications/initialized"}`}, 1, checkInitialize},
		{"tools/list", []string{`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`}, 2, checkToolsList},
		{"tools/call", []string{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"builtin__http_get","arguments":{"url":"http://127.0.0.1:9/"}}}`}, 3, checkToolCall},
		{"invalid JSON", []string{`{"jsonrpc":"2.0","id":4,"method":`}, -1, nil},
		{"the call after it", []string{`{"jsonrpc":"2.0","id":5,"method":"tools/list"}`}, 5, checkToolsList},
	}
	var done []string
	for _, st := range steps {
		for _, line := range st.send {
			if err := s.send(line); err != nil {
				fail(st.name, err)
				return
			}
		}
		if st.id < 0 {
			// A line that is not JSON has no id to answer on: the
			// answer is the parse error, with a null id.
			m, err := nullIDAnswer(s)
			if err != nil {
				fail(st.name, err)
				return
			}
			if code := errorCode(m); code != -32700 {
				fail(st.name, fmt.Errorf("answered %s, want error -32700", compact(m)))
				return
			}
			done = append(done, "invalid JSON answered -32700")
			continue
		}
		m, err := s.answer(st.id)
		if err != nil {
			fail(st.name, err)
			return
		}
		what, err := st.check(m)
		if err != nil {
			fail(st.name, err)
			return
		}
		done = append(done, what)
	}
	r.Okf("%s", strings.Join(done, "; "))
}

// nullIDAnswer waits for an answer whose id is null (a parse error).
func nullIDAnswer(s *mcpSession) (map[string]json.RawMessage, error) {
	t := time.After(mcpTimeout)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				return nil, errors.New("the relay closed its output")
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(line, &m) == nil && (string(m["id"]) == "null" || m["id"] == nil) {
				return m, nil
			}
		case <-t:
			return nil, fmt.Errorf("no answer to the invalid line within %v", mcpTimeout)
		}
	}
}

func errorCode(m map[string]json.RawMessage) int {
	var e struct {
		Code int `json:"code"`
	}
	if json.Unmarshal(m["error"], &e) != nil {
		return 0
	}
	return e.Code
}

func compact(m map[string]json.RawMessage) string {
	b, _ := json.Marshal(m)
	if len(b) > 300 {
		b = append(b[:300], "..."...)
	}
	return string(b)
}

func checkInitialize(m map[string]json.RawMessage) (string, error) {
	var res struct {
		ProtocolVersion string `json:"protocolVersion"`
		ServerInfo      struct {
			Name string `json:"name"`
		} `json:"serverInfo"`
		Capabilities map[string]json.RawMessage `json:"capabilities"`
	}
	if err := json.Unmarshal(m["result"], &res); err != nil || res.ProtocolVersion == "" || res.Capabilities["tools"] == nil {
		return "", fmt.Errorf("answered %s, want a result with a protocol version and tools", compact(m))
	}
	return "initialize: " + res.ServerInfo.Name + " " + res.ProtocolVersion, nil
}

func checkToolsList(m map[string]json.RawMessage) (string, error) {
	var res struct {
		Tools []struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			InputSchema json.RawMessage `json:"inputSchema"`
			Annotations json.RawMessage `json:"annotations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(m["result"], &res); err != nil {
		return "", fmt.Errorf("answered %s, want a tool list", compact(m))
	}
	builtin := 0
	for _, tl := range res.Tools {
		if !strings.HasPrefix(tl.Name, "builtin__") {
			continue
		}
		builtin++
		var schema map[string]any
		if tl.Description == "" || json.Unmarshal(tl.InputSchema, &schema) != nil || schema["type"] != "object" || len(tl.Annotations) < 3 {
			return "", fmt.Errorf("builtin tool %s lacks a description, an object input schema or annotations", tl.Name)
		}
	}
	if builtin == 0 {
		return "", fmt.Errorf("no builtin tools among %d", len(res.Tools))
	}
	return fmt.Sprintf("tools/list: %d tools, %d builtin with descriptions, schemas and annotations", len(res.Tools), builtin), nil
}

func checkToolCall(m map[string]json.RawMessage) (string, error) {
	var res struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	if err := json.Unmarshal(m["result"], &res); err != nil || len(res.Content) == 0 {
		return "", fmt.Errorf("answered %s, want a tool result", compact(m))
	}
	// The builtin refuses loopback unless allowed: either answer shows the
	// call went through the gateway to the builtin server and back.
	text := strings.Join(strings.Fields(res.Content[0].Text), " ")
	if len(text) > 60 {
		text = text[:60] + "..."
	}
	return fmt.Sprintf("tools/call builtin__http_get answered (isError %v: %s)", res.IsError, text), nil
}

// --- net (netchecks_linux.go)

// --- sandbox

func checkRawMemory(_ context.Context, r *doctor.Reporter) {
	for _, p := range []string{"/dev/mem", "/dev/kmem", "/dev/port"} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			r.Failf("the agent removes it at boot", "%s exists (%v)", p, err)
			return
		}
	}
	// /proc/kcore cannot be removed; the agent covers it with /dev/null.
	var st unix.Stat_t
	if err := unix.Stat("/proc/kcore", &st); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 1 || unix.Minor(st.Rdev) != 3 {
			r.Failf("the agent masks it with /dev/null at boot", "/proc/kcore is the kernel's memory image, not masked")
			return
		}
		b := make([]byte, 16)
		if n, _ := readAtMost("/proc/kcore", b); n != 0 {
			r.Failf("the agent masks it with /dev/null at boot", "/proc/kcore gave %d bytes", n)
			return
		}
	}
	r.Okf("no /dev/mem, /dev/kmem or /dev/port; /proc/kcore masked (reads nothing)")
}

func readAtMost(path string, b []byte) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Read(b)
}

// checkNoSetuid walks the root filesystem (not /proc, /sys, /dev, other
// mounts or the host's workspace) for set-user-ID and set-group-ID files.
func checkNoSetuid(_ context.Context, r *doctor.Reporter) {
	var rootSt unix.Stat_t
	if err := unix.Stat("/", &rootSt); err != nil {
		r.Failf("", "stat /: %v", err)
		return
	}
	var found []string
	files := 0
	err := filepath.WalkDir("/", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // unreadable: nothing to run from there either
		}
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil {
			return nil
		}
		if d.IsDir() && path != "/" && st.Dev != rootSt.Dev {
			return filepath.SkipDir // another filesystem: /proc, /sys, /dev, /tmp, the workspace
		}
		files++
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			found = append(found, fmt.Sprintf("%s (%04o)", path, st.Mode&0o7777))
		}
		return nil
	})
	if err != nil {
		r.Failf("", "walking /: %v", err)
		return
	}
	if len(found) > 0 {
		r.Failf("a set-ID file in the image lets a process gain privileges", "set-ID files: %s", strings.Join(found[:min(5, len(found))], ", "))
		return
	}
	r.Okf("no set-user-ID or set-group-ID file among %d on the root filesystem", files)
}

func checkBinariesReadOnly(_ context.Context, r *doctor.Reporter) {
	seen := map[string]bool{}
	var checked []string
	for _, name := range []string{relayBinary, doctorBinary} {
		p, err := exec.LookPath(name)
		if err != nil {
			r.Failf("the agent links it at boot", "%s: %v", name, err)
			return
		}
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			r.Failf("", "%s: %v", p, err)
			return
		}
		if seen[target] {
			continue
		}
		seen[target] = true
		// access(2) asks for write access as an open would, mount first:
		// EROFS means a read-only mount, so the file cannot be replaced
		// either (a running binary alone refuses a write with ETXTBSY,
		// yet could be renamed over).
		var sfs unix.Statfs_t
		err = unix.Access(target, unix.W_OK)
		if serr := unix.Statfs(target, &sfs); !errors.Is(err, unix.EROFS) || serr != nil || sfs.Flags&unix.ST_RDONLY == 0 {
			r.Failf("the agent binds the capsem binary read-only at boot", "%s (%s) is writable: access(W_OK) gave %v, want EROFS (a read-only mount)", target, name, err)
			return
		}
		checked = append(checked, target+" (EROFS)")
	}
	r.Okf("writes refused: %s", strings.Join(checked, ", "))
}
