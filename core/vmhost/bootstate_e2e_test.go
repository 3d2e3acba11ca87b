package vmhost_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/vmm"
)

// bootStateDir is a directory of saved boots of the test's own, so what a
// test saves, restores or spoils meets no other test's VMs.
func bootStateDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "capsem-bootstates-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// guestFacts are what must differ, or be this VM's own, in VMs resumed
// from one saved boot.
type guestFacts struct {
	random, bootID, hostname string
	clock                    time.Time
}

func readFacts(t *testing.T, v *vmProc) guestFacts {
	t.Helper()
	out, _ := v.guestSh(t, `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n'; echo
cat /proc/sys/kernel/random/boot_id
hostname
date +%s`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("guest facts: %q", out)
	}
	secs, err := strconv.ParseInt(lines[3], 10, 64)
	if err != nil {
		t.Fatalf("guest date: %q", lines[3])
	}
	return guestFacts{random: lines[0], bootID: lines[1], hostname: lines[2], clock: time.Unix(secs, 0)}
}

// TestBootStateResumesVMs: the first VM of a configuration boots and is
// saved at its save point; the next ones resume from that state and are
// still each their own machine: their own random numbers, boot id, host
// name, clock and disk.
func TestBootStateResumesVMs(t *testing.T) {
	states := bootStateDir(t)
	first := startVM(t, "bs-first", func(c *vmhost.ProcessConfig) { c.BootStateDir = states })
	defer first.stop(t)
	if first.info.Start != vmhost.ModeBootAndSave.String() {
		t.Fatalf("the first VM started %q, want %q", first.info.Start, vmhost.ModeBootAndSave.String())
	}
	metas, _ := filepath.Glob(filepath.Join(states, "*.json"))
	saved, _ := filepath.Glob(filepath.Join(states, "*.state"))
	if len(metas) != 1 || len(saved) != 1 {
		t.Fatalf("saved boot files: %v %v", metas, saved)
	}
	// The VM that was saved read all of its 1 GiB of guest RAM; the first
	// VM is not that one but resumed from its state, and holds only what
	// the guest uses.
	if first.info.BootTimings["boot_and_save"] <= 0 || first.info.BootTimings["guest_after_wake"] <= 0 {
		t.Errorf("the first VM's timings lack the boot-and-save or the resume: %v", first.info.BootTimings)
	}
	if rss := qemuRSS(t, first.info.QEMUPID); rss > 600<<20 {
		t.Errorf("the first VM's QEMU holds %d MiB: the saved VM's RAM stayed in use", rss>>20)
	}
	// The devices' state, and the guest's RAM apart beside it.
	var meta struct {
		SHA256      string `json:"sha256"`
		Size        int64  `json:"size"`
		Memory      string `json:"memory"`
		MemoryBytes int64  `json:"memory_bytes"`
	}
	b, _ := os.ReadFile(metas[0])
	if err := json.Unmarshal(b, &meta); err != nil || meta.Size == 0 || meta.MemoryBytes < 1<<20 || len(meta.SHA256) != 64 ||
		meta.Memory != filepath.Base(vmm.MemoryPath(saved[0])) {
		t.Fatalf("metadata %s: %v", b, err)
	}
	if _, err := os.Stat(vmm.MemoryPath(saved[0])); err != nil {
		t.Fatalf("the saved boot's RAM: %v", err)
	}

	vms := []*vmProc{first}
	for _, name := range []string{"bs-second", "bs-third"} {
		v := startVM(t, name, func(c *vmhost.ProcessConfig) { c.BootStateDir = states })
		defer v.stop(t)
		if v.info.Start != vmhost.ModeResume.String() {
			t.Fatalf("%s started %q, want %q (timings %v)", name, v.info.Start, vmhost.ModeResume.String(), v.info.BootTimings)
		}
		if v.info.BootTimings["guest_after_wake"] <= 0 || v.info.BootTimings["state_hash"] <= 0 {
			t.Errorf("%s timings lack the resumed start's stages: %v", name, v.info.BootTimings)
		}
		vms = append(vms, v)
	}
	seen := map[string]string{}
	for _, v := range vms {
		f := readFacts(t, v)
		name := v.info.Name
		for what, val := range map[string]string{"random bytes": f.random, "boot id": f.bootID} {
			if other, dup := seen[what+val]; dup {
				t.Errorf("%s of %s and %s are the same: %s", what, other, name, val)
			}
			seen[what+val] = name
		}
		if want := v.info.Name; f.hostname != want {
			t.Errorf("host name %q, want %q", f.hostname, want)
		}
		if d := time.Since(f.clock); d < -5*time.Second || d > 5*time.Second {
			t.Errorf("%s's clock is %v off the host's", v.info.Name, d)
		}
	}
	// A resumed VM's network works: the host's stack behind its NIC is
	// this VM's own, and the guest's setup came with the saved boot.
	if out, _ := vms[2].guestSh(t, `capsem-doctor -k net`); !strings.Contains(out, "RESULT: PASS") {
		t.Errorf("the network of a resumed VM:\n%s", out)
	}
	// Each resumed VM has its own disk under its root.
	vms[1].guestSh(t, `echo second > /root/mine && sync`)
	if out, _ := vms[2].guestSh(t, `cat /root/mine 2>/dev/null || echo absent`); strings.TrimSpace(out) != "absent" {
		t.Fatalf("the third VM sees the second's file: %q", out)
	}
	// A resumed VM's console starts at its wake: the boot was another's.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs, err := vms[1].client.Logs(ctx, 500, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, `"msg":"woken"`) || strings.Contains(logs, `"msg":"init started"`) {
		t.Fatalf("console of a resumed VM:\n%.2000s", logs)
	}
}

// TestBootStateRefusedFallsBack: a saved boot whose bytes changed is
// refused before its guest is woken, one QEMU cannot load ends before the
// guest speaks; either way the VM boots instead, and is saved anew.
func TestBootStateRefusedFallsBack(t *testing.T) {
	states := bootStateDir(t)
	v := startVM(t, "bs-spoil", func(c *vmhost.ProcessConfig) { c.BootStateDir = states })
	v.stop(t)
	stateFile := func() (string, string) {
		t.Helper()
		metas, _ := filepath.Glob(filepath.Join(states, "*.json"))
		saved, _ := filepath.Glob(filepath.Join(states, "*.state"))
		if len(metas) != 1 || len(saved) != 1 {
			t.Fatalf("saved boot files: %v %v", metas, saved)
		}
		return metas[0], saved[0]
	}
	for _, tc := range []struct {
		name  string
		spoil func(meta, state string)
	}{
		{"changed bytes", func(meta, state string) {
			f, err := os.OpenFile(state, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := f.Stat()
			f.WriteAt([]byte("spoilt!"), st.Size()/2)
			f.Close()
		}},
		{"not a QEMU state", func(meta, state string) {
			st, _ := os.Stat(state)
			junk := make([]byte, st.Size())
			copy(junk, "this is not a migration stream")
			os.WriteFile(state, junk, 0o600)
			// Its metadata vouches for it, so only QEMU can refuse it.
			var m map[string]any
			b, _ := os.ReadFile(meta)
			json.Unmarshal(b, &m)
			m["sha256"] = sha256Hex(junk)
			b, _ = json.Marshal(m)
			os.WriteFile(meta, b, 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			meta, state := stateFile()
			tc.spoil(meta, state)
			v := startVM(t, "bs-after-spoil", func(c *vmhost.ProcessConfig) { c.BootStateDir = states })
			defer v.stop(t)
			if v.info.Start != vmhost.ModeBootAndSave.String() {
				t.Fatalf("started %q after a spoilt saved boot, want %q", v.info.Start, vmhost.ModeBootAndSave.String())
			}
			log, _ := os.ReadFile(v.log)
			if !strings.Contains(string(log), "resuming the saved boot failed") {
				t.Fatalf("the process log does not say why it booted:\n%s", log)
			}
			if out, _ := v.guestSh(t, "echo alive"); strings.TrimSpace(out) != "alive" {
				t.Fatalf("exec after the fallback: %q", out)
			}
			_, fresh := stateFile()
			if fresh == state {
				t.Fatalf("the spoilt state %s was kept", state)
			}
		})
	}
}

// TestBootStateOff: with CAPSEM_BOOT_STATE=off a VM boots and nothing is
// saved.
func TestBootStateOff(t *testing.T) {
	states := bootStateDir(t)
	t.Setenv(envvars.BootState.Name(), "off")
	v := startVM(t, "bs-off", func(c *vmhost.ProcessConfig) { c.BootStateDir = states })
	defer v.stop(t)
	if v.info.Start != vmhost.ModeBoot.String() {
		t.Fatalf("started %q, want %q", v.info.Start, vmhost.ModeBoot.String())
	}
	if left, _ := os.ReadDir(states); len(left) != 0 {
		t.Fatalf("a VM saved its boot with saving off: %v", left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if o := v.exec(ctx, &api.ExecRequest{Command: "true"}); o.err != nil || o.ev.ExitCode != 0 {
		t.Fatalf("exec: %v", o.err)
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// qemuRSS is the resident memory of QEMU's process, in bytes.
func qemuRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestFirstStartsTogetherSaveOnce: VMs of a configuration with no saved
// boot, started at once, boot and save it once; the others wait for that
// save and resume from it.
func TestFirstStartsTogetherSaveOnce(t *testing.T) {
	states := bootStateDir(t)
	const n = 3
	vms := make([]*vmProc, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			vms[i] = startVM(t, fmt.Sprintf("together-%d", i), func(c *vmhost.ProcessConfig) { c.BootStateDir = states })
		})
	}
	wg.Wait()
	starts := map[string]int{}
	for _, v := range vms {
		if v == nil {
			t.Fatal("a VM did not start")
		}
		defer v.stop(t)
		starts[v.info.Start]++
	}
	if starts[vmhost.ModeBootAndSave.String()] != 1 || starts[vmhost.ModeResume.String()] != n-1 {
		t.Fatalf("starts %v, want one %s and %d %s", starts, vmhost.ModeBootAndSave, n-1, vmhost.ModeResume)
	}
}
