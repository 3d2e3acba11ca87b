package cli_test

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/hostmcp"
	"github.com/capsem/capsem/core/testkit"
)

// TestStalledGuestComesBack stalls a VM's guest past its heartbeat, as a
// fork bomb or a loaded host does: QEMU is stopped (SIGSTOP) until the
// service lists the VM as unresponsive, with the reason in capsem info
// and in capsem mcp's capsem_info and capsem_list, and commands are
// refused meanwhile, saying why, at the CLI and to an agent. Once QEMU
// runs again (SIGCONT) the agent connects again and the VM runs
// commands, with no stop and resume.
func TestStalledGuestComesBack(t *testing.T) {
	env, _ := testkit.ServiceEnv(t)
	testkit.GuestBinary(t)
	c := capsemCLI{t: t, env: env}
	c.must("create", "stall", "--ram-mb", "512", "--cpus", "1")
	agent := startMCP(t, env)
	mcpInfo := func() hostmcp.VMOut {
		t.Helper()
		var vm hostmcp.VMOut
		if msg := agent.call("capsem_info", map[string]any{"id": "stall"}, &vm); msg != "" {
			t.Fatalf("capsem_info: %s", msg)
		}
		return vm
	}
	if vm := mcpInfo(); vm.State != api.StateRunning || vm.StateReason != "" {
		t.Fatalf("capsem_info before the stall: %+v", vm)
	}
	t.Cleanup(func() { c.run("rm", "stall") })
	if out := c.must("exec", "stall", "--", "echo", "before"); out != "before\n" {
		t.Fatalf("exec before the stall: %q", out)
	}
	info := func() api.VM {
		t.Helper()
		var vm api.VM
		if err := json.Unmarshal([]byte(c.must("info", "stall", "--json")), &vm); err != nil {
			t.Fatal(err)
		}
		return vm
	}
	listed := func() api.VMState {
		t.Helper()
		var vms []api.VM
		if err := json.Unmarshal([]byte(c.must("ls", "--json")), &vms); err != nil || len(vms) != 1 {
			t.Fatalf("ls --json: %+v %v", vms, err)
		}
		return vms[0].State
	}
	vm := info()
	if vm.Process == nil || vm.Process.QEMUPID == 0 {
		t.Fatalf("info has no QEMU pid: %+v", vm)
	}
	qemu := vm.Process.QEMUPID
	if err := syscall.Kill(qemu, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(qemu, syscall.SIGCONT)
		}
	}
	defer resume()
	for listed() != api.StateUnresponsive {
		if time.Since(stopped) > time.Minute {
			t.Fatalf("a guest stalled for %v is still listed %q", time.Since(stopped).Round(time.Second), listed())
		}
		time.Sleep(time.Second)
	}
	t.Logf("listed unresponsive %v after the stall began", time.Since(stopped).Round(time.Second))
	if vm := info(); vm.State != api.StateUnresponsive || vm.Process == nil || !strings.Contains(vm.Process.StateReason, "heartbeat") {
		t.Fatalf("info of the stalled VM: %+v %+v", vm, vm.Process)
	}
	if table := c.must("ls"); !strings.Contains(table, string(api.StateUnresponsive)) {
		t.Fatalf("ls does not say unresponsive:\n%s", table)
	}
	if text := c.must("info", "stall"); !strings.Contains(text, "heartbeat") {
		t.Fatalf("info does not say why the VM is unresponsive:\n%s", text)
	}
	if _, errOut, code := c.run("exec", "stall", "--", "true"); code == 0 || !strings.Contains(errOut, "does not answer") {
		t.Fatalf("exec on the stalled VM: exit %d %q", code, errOut)
	}
	// An agent sees the same, through the real capsem mcp.
	if vm := mcpInfo(); vm.State != api.StateUnresponsive || !strings.Contains(vm.StateReason, "heartbeat") {
		t.Fatalf("capsem_info of the stalled VM: %+v", vm)
	}
	var all hostmcp.ListOut
	if msg := agent.call("capsem_list", map[string]any{}, &all); msg != "" || len(all.VMs) != 1 || all.VMs[0].State != api.StateUnresponsive {
		t.Fatalf("capsem_list of the stalled VM: %+v %s", all, msg)
	}
	if msg := agent.call("capsem_exec", map[string]any{"id": "stall", "command": "true"}, nil); !strings.Contains(msg, "does not answer") {
		t.Fatalf("capsem_exec on the stalled VM: %q, want a tool error saying the guest does not answer", msg)
	}

	resume()
	back := time.Now()
	for {
		out, _, code := c.run("exec", "stall", "--", "echo", "after")
		if code == 0 && out == "after\n" {
			break
		}
		if time.Since(back) > 2*time.Minute {
			t.Fatalf("the VM ran no command %v after its guest ran again (last: exit %d %q; listed %q)",
				time.Since(back).Round(time.Second), code, out, listed())
		}
		time.Sleep(time.Second)
	}
	t.Logf("a command ran again %v after the guest did", time.Since(back).Round(time.Second))
	if state := listed(); state != api.StateRunning {
		t.Fatalf("listed %q after the guest came back", state)
	}
	if vm := mcpInfo(); vm.State != api.StateRunning || vm.StateReason != "" {
		t.Fatalf("capsem_info after the guest came back: %+v", vm)
	}
	if out := c.must("exec", "stall", "--", "cat", "/proc/1/comm"); strings.TrimSpace(out) == "" {
		t.Fatal("no PID 1 after the stall")
	}
}
