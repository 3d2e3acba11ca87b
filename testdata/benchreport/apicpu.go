package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
)

// cpuSnap is the CPU time used so far by each side of a VM's data path:
// this process (the API client), the per-VM process, QEMU (the guest and
// its devices), and as the guest counts them its CPUs' busy time and PID
// 1's (the agent's). The guest's clock keeps running while the host has
// its vCPU threads off a core, so its figures run high on a busy host;
// QEMU's are the host's own count.
type cpuSnap struct {
	client, process, qemu time.Duration
	guestBusy             time.Duration
	agent, agentSys       time.Duration
	mib                   float64 // what the figure moved, for the per-MiB figures
}

// cpuProbe snapshots a VM's CPU times; the guest's through an exec, so
// take it outside a timed section.
type cpuProbe struct {
	vm      *vmHandle
	qemuPID int
}

func newCPUProbe(ctx context.Context, vm *vmHandle) (*cpuProbe, error) {
	info, err := vm.client.Info(ctx)
	if err != nil {
		return nil, err
	}
	return &cpuProbe{vm: vm, qemuPID: info.QEMUPID}, nil
}

func (p *cpuProbe) snap(ctx context.Context) cpuSnap {
	var s cpuSnap
	s.client, _ = procCPU(os.Getpid())
	s.process, _ = procCPU(p.vm.proc.PID())
	s.qemu, _ = procCPU(p.qemuPID)
	var out bytes.Buffer
	if _, err := p.vm.client.Exec(ctx, &api.ExecRequest{Command: "head -1 /proc/stat; cat /proc/1/stat"}, &out, nil); err == nil {
		lines := strings.SplitN(out.String(), "\n", 2)
		// cpu user nice system idle iowait irq softirq ...: all but idle.
		if f := strings.Fields(lines[0]); len(f) > 7 {
			var ticks int64
			for i, v := range f[1:8] {
				var n int64
				fmt.Sscanf(v, "%d", &n)
				if i != 3 {
					ticks += n
				}
			}
			s.guestBusy = time.Duration(ticks) * 10 * time.Millisecond
		}
		if len(lines) > 1 {
			s.agent, s.agentSys = statCPU(lines[1])
		}
	}
	return s
}

func (a cpuSnap) sub(b cpuSnap) cpuSnap {
	return cpuSnap{client: a.client - b.client, process: a.process - b.process, qemu: a.qemu - b.qemu,
		guestBusy: a.guestBusy - b.guestBusy, agent: a.agent - b.agent, agentSys: a.agentSys - b.agentSys}
}

func (a cpuSnap) String() string {
	perMiB := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000/a.mib) }
	return fmt.Sprintf("ms/MiB: client %s, per-VM process %s, QEMU %s (as the guest counts: busy %s, of it the agent %s, %s in the kernel)",
		perMiB(a.client), perMiB(a.process), perMiB(a.qemu), perMiB(a.guestBusy), perMiB(a.agent), perMiB(a.agentSys))
}

// procCPU is the user+system and the system CPU time of process pid.
func procCPU(pid int) (total, sys time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	return statCPU(string(b))
}

// statCPU reads utime+stime and stime from a /proc/PID/stat line (clock
// ticks of 10 ms).
func statCPU(line string) (total, sys time.Duration) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(line[i+1:])
	if len(f) < 13 {
		return 0, 0
	}
	var ut, st int64
	fmt.Sscanf(f[11], "%d", &ut)
	fmt.Sscanf(f[12], "%d", &st)
	return time.Duration(ut+st) * 10 * time.Millisecond, time.Duration(st) * 10 * time.Millisecond
}
