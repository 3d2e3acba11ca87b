package vmhost

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/qemu"
	"github.com/capsem/capsem/vmm/ramfile"
)

// fakeQEMU is a stand-in binary whose identity keys the saved boots.
func fakeQEMU(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func argvFor(qemu, name, session string, mem string) []string {
	return []string{qemu, "-name", "guest=" + name + ",debug-threads=on", "-m", mem,
		"-kernel", "/assets/abc/vmlinux", "-chardev", "file,id=console,path=" + session + "/console.log,append=on",
		"-drive", "file=" + session + "/disk.img,if=none,id=disk-capsem-upper"}
}

func TestBootStateKey(t *testing.T) {
	qemu, dir := fakeQEMU(t), t.TempDir()
	key := func(argv []string, session string) string {
		t.Helper()
		s, err := newBootState(dir, argv, session)
		if err != nil {
			t.Fatal(err)
		}
		return s.key
	}
	base := key(argvFor(qemu, "a", "/s/one", "1024M"), "/s/one")
	if len(base) != 24 {
		t.Fatalf("key %q: want 24 hex digits", base)
	}
	// The VM's name and session directory are per-VM: same key.
	if k := key(argvFor(qemu, "other-name", "/var/s/two", "1024M"), "/var/s/two"); k != base {
		t.Errorf("name or session changed the key: %s vs %s", k, base)
	}
	// Anything that reaches the guest's state changes it.
	if k := key(argvFor(qemu, "a", "/s/one", "512M"), "/s/one"); k == base {
		t.Error("memory size did not change the key")
	}
	other := argvFor(qemu, "a", "/s/one", "1024M")
	other[6] = "/assets/def/vmlinux"
	if k := key(other, "/s/one"); k == base {
		t.Error("another kernel did not change the key")
	}
	// So does another QEMU binary (here: the same path, rewritten).
	time.Sleep(10 * time.Millisecond)
	os.WriteFile(qemu, []byte("#!/bin/sh\n# upgraded\n"), 0o755)
	if k := key(argvFor(qemu, "a", "/s/one", "1024M"), "/s/one"); k == base {
		t.Error("a changed QEMU binary did not change the key")
	}
	if _, err := newBootState(dir, nil, "/s"); err == nil {
		t.Error("an empty argv was accepted")
	}
	if _, err := newBootState(dir, []string{"/nonexistent/qemu"}, "/s"); err == nil || !strings.Contains(err.Error(), "QEMU binary") {
		t.Errorf("a missing QEMU binary: %v", err)
	}
}

// savedState publishes a state file with content for s, as a save would.
func savedState(t *testing.T, s *bootState, content string) *bootStateMeta {
	t.Helper()
	p, err := s.newStatePath()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := s.publish(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBootStatePublishLookupVerify(t *testing.T) {
	qemu := fakeQEMU(t)
	s, err := newBootState(filepath.Join(t.TempDir(), "boot-states"), argvFor(qemu, "a", "/s/one", "1024M"), "/s/one")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.lookup(); ok {
		t.Fatal("lookup found a state before any was saved")
	}
	m := savedState(t, s, "state one")
	sum := sha256.Sum256([]byte("state one"))
	if m.SHA256 != hex.EncodeToString(sum[:]) || m.Size != 9 || m.Format != bootStateFormat || m.Key != s.key ||
		m.State != s.key+"-"+m.SHA256[:16]+".state" || slices.Contains(m.Argv, "-name") ||
		!slices.ContainsFunc(m.Argv, func(a string) bool { return strings.Contains(a, "$SESSION/disk.img") }) {
		t.Fatalf("metadata %+v", m)
	}
	for _, p := range []string{s.metaPath(), s.statePath(m)} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, want mode 0600", p, err)
		}
	}
	got, ok := s.lookup()
	if !ok || got.SHA256 != m.SHA256 {
		t.Fatalf("lookup: %+v %v", got, ok)
	}
	if err := s.verify(got); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(s.dir, "*.saving")); len(left) != 0 {
		t.Fatalf("the unpublished name stayed: %v", left)
	}

	// A newer save replaces the older state; the older file goes once it
	// is old enough that no start can be about to open it.
	m2 := savedState(t, s, "state two, newer")
	if _, err := os.Stat(s.statePath(m)); err != nil {
		t.Errorf("a state replaced a moment ago was removed: %v", err)
	}
	old := time.Now().Add(-2 * replacedStateGrace)
	os.Chtimes(s.statePath(m), old, old)
	savedState(t, s, "state three")
	if _, err := os.Stat(s.statePath(m)); !os.IsNotExist(err) {
		t.Errorf("an old replaced state file is still there: %v", err)
	}
	if _, err := os.Stat(s.statePath(m2)); err != nil {
		t.Errorf("the state replaced a moment ago was removed: %v", err)
	}
	// The rest works on the second state, published again.
	m2 = savedState(t, s, "state two, newer")
	if got, ok := s.lookup(); !ok || got.State != m2.State {
		t.Fatalf("lookup after a second save: %+v %v", got, ok)
	}

	// Same size, other bytes: lookup passes (it checks sizes), verify
	// names both hashes.
	os.WriteFile(s.statePath(m2), []byte("STATE TWO, NEWER"), 0o600)
	if err := s.verify(m2); err == nil || !strings.Contains(err.Error(), m2.SHA256) {
		t.Fatalf("a changed state verified: %v", err)
	}
	s.remove(m2)
	if _, ok := s.lookup(); ok {
		t.Fatal("lookup found a removed state")
	}
	if _, err := os.Stat(s.statePath(m2)); !os.IsNotExist(err) {
		t.Fatalf("remove left the state file: %v", err)
	}
}

// savedStateWithRAM publishes a state whose RAM is apart, as QEMU saves
// one: 4 MiB, sparse, with a page of data at 1 MiB.
func savedStateWithRAM(t *testing.T, s *bootState, content, ram string) *bootStateMeta {
	t.Helper()
	p, err := s.newStatePath()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(p, []byte(content), 0o600)
	f, err := os.OpenFile(vmm.MemoryPath(p), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(4 << 20)
	f.WriteAt([]byte(ram), 1<<20)
	f.Close()
	m, err := s.publish(p)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestBootStateWithRAM: a state's RAM file is published, looked up,
// verified, replaced and removed with it, and its hash covers the RAM's
// data, not its holes.
func TestBootStateWithRAM(t *testing.T) {
	s, err := newBootState(filepath.Join(t.TempDir(), "boot-states"), argvFor(fakeQEMU(t), "a", "/s/one", "1024M"), "/s/one")
	if err != nil {
		t.Fatal(err)
	}
	m := savedStateWithRAM(t, s, "devices", "guest data")
	if m.Memory != filepath.Base(vmm.MemoryPath(m.State)) || m.MemoryBytes != ramfile.PageSize || m.Bytes() != 7+ramfile.PageSize {
		t.Fatalf("metadata %+v", m)
	}
	if left, _ := filepath.Glob(filepath.Join(s.dir, "*.saving*")); len(left) != 0 {
		t.Fatalf("the unpublished names stayed: %v", left)
	}
	got, ok := s.lookup()
	if !ok || got.Memory != m.Memory {
		t.Fatalf("lookup: %+v %v", got, ok)
	}
	if err := s.verify(got); err != nil {
		t.Fatal(err)
	}
	// Zeros written over a hole change nothing the guest would see.
	f, _ := os.OpenFile(s.memoryPath(m), os.O_WRONLY, 0)
	f.WriteAt(make([]byte, 8192), 2<<20)
	f.Close()
	if err := s.verify(got); err != nil {
		t.Fatalf("zeros over a hole failed verification: %v", err)
	}
	// Another byte in the RAM does.
	f, _ = os.OpenFile(s.memoryPath(m), os.O_WRONLY, 0)
	f.WriteAt([]byte("G"), 1<<20)
	f.Close()
	if err := s.verify(got); err == nil || !strings.Contains(err.Error(), m.SHA256) {
		t.Fatalf("changed RAM verified: %v", err)
	}
	// An old replaced state goes with its RAM.
	old := time.Now().Add(-2 * replacedStateGrace)
	os.Chtimes(s.statePath(m), old, old)
	m2 := savedStateWithRAM(t, s, "devices 2", "other data")
	for _, p := range []string{s.statePath(m), s.memoryPath(m)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s of a replaced state is still there: %v", p, err)
		}
	}
	s.remove(m2)
	if ents, _ := os.ReadDir(s.dir); len(ents) != 0 {
		t.Errorf("remove left %v", ents)
	}

	for name, spoil := range map[string]func(m *bootStateMeta){
		"missing RAM":       func(m *bootStateMeta) { os.Remove(s.memoryPath(m)) },
		"RAM elsewhere":     func(m *bootStateMeta) { m.Memory = "../x.state.ram"; writeMeta(t, s, m) },
		"RAM of another":    func(m *bootStateMeta) { m.Memory = "other.state.ram"; writeMeta(t, s, m) },
		"RAM a directory":   func(m *bootStateMeta) { os.Remove(s.memoryPath(m)); os.Mkdir(s.memoryPath(m), 0o700) },
		"metadata drops it": func(m *bootStateMeta) { m.Memory = ""; writeMeta(t, s, m) },
	} {
		t.Run(name, func(t *testing.T) {
			m := savedStateWithRAM(t, s, "devices", "guest data")
			defer s.remove(m)
			spoil(m)
			got, ok := s.lookup()
			if ok && s.verify(got) == nil {
				t.Fatalf("a state with %s was taken: %+v", name, got)
			}
		})
	}
}

func TestBootStateLookupRefuses(t *testing.T) {
	qemu := fakeQEMU(t)
	for name, spoil := range map[string]func(s *bootState, m *bootStateMeta){
		"truncated state":     func(s *bootState, m *bootStateMeta) { os.Truncate(s.statePath(m), 3) },
		"missing state":       func(s *bootState, m *bootStateMeta) { os.Remove(s.statePath(m)) },
		"undecodable meta":    func(s *bootState, m *bootStateMeta) { os.WriteFile(s.metaPath(), []byte("{"), 0o600) },
		"other format":        func(s *bootState, m *bootStateMeta) { m.Format++; writeMeta(t, s, m) },
		"other key":           func(s *bootState, m *bootStateMeta) { m.Key = "0123"; writeMeta(t, s, m) },
		"state outside":       func(s *bootState, m *bootStateMeta) { m.State = "../x.state"; writeMeta(t, s, m) },
		"state a directory":   func(s *bootState, m *bootStateMeta) { os.Remove(s.statePath(m)); os.Mkdir(s.statePath(m), 0o700) },
		"state name is empty": func(s *bootState, m *bootStateMeta) { m.State = ""; writeMeta(t, s, m) },
	} {
		t.Run(name, func(t *testing.T) {
			s, err := newBootState(t.TempDir(), argvFor(qemu, "a", "/s", "1024M"), "/s")
			if err != nil {
				t.Fatal(err)
			}
			m := savedState(t, s, "some state")
			spoil(s, m)
			if got, ok := s.lookup(); ok {
				t.Fatalf("lookup accepted %+v", got)
			}
		})
	}
}

func writeMeta(t *testing.T, s *bootState, m *bootStateMeta) {
	t.Helper()
	b, _ := json.Marshal(m)
	if err := os.WriteFile(s.metaPath(), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBootStateKeyedByAccelerator: a state saved under one accelerator or
// CPU model is never resumed under another (QEMU could not load it, or the
// guest would run on a CPU it did not boot on).
func TestBootStateKeyedByAccelerator(t *testing.T) {
	bin, dir := fakeQEMU(t), t.TempDir()
	spec := vmm.Spec{Name: "a", Kernel: "/assets/abc/vmlinux", Initramfs: "/assets/abc/initramfs.cpio", Cmdline: "console=ttyS0",
		CPUs: 2, MemoryMiB: 1024, ChannelSocket: "/s/one/channel.sock", ConsoleLog: "/s/one/console.log"}
	keys := map[string]string{}
	for _, a := range []qemu.Accel{{Name: vmm.AccelTCG, CPU: qemu.TCGCPU}, {Name: vmm.AccelKVM, CPU: "host"}, {Name: vmm.AccelKVM, CPU: "host,-arch-capabilities"}} {
		args, err := qemu.Args(spec, a)
		if err != nil {
			t.Fatal(err)
		}
		s, err := newBootState(dir, append([]string{bin}, args...), "/s/one")
		if err != nil {
			t.Fatal(err)
		}
		if other, dup := keys[s.key]; dup {
			t.Fatalf("%s -cpu %s shares its saved boot with %s", a.Name, a.CPU, other)
		}
		keys[s.key] = a.Name + " -cpu " + a.CPU
	}
}

// TestStateKinds: a suspend records its VM as the parent; a saved boot's
// store never takes a suspend, nor a suspend's store a saved boot (one is
// a cache, the other a VM's own state).
func TestStateKinds(t *testing.T) {
	qemu := fakeQEMU(t)
	argv := argvFor(qemu, "a", "/s", "1024M")
	dir := t.TempDir()
	boot, err := newBootState(dir, argv, "/s")
	if err != nil {
		t.Fatal(err)
	}
	suspend, err := newBootState(dir, argv, "/s")
	if err != nil {
		t.Fatal(err)
	}
	suspend.suspendOf("vm-0000000000aa")
	m := savedState(t, suspend, "a suspend")
	if m.Kind != stateSuspend || m.Parent != "vm-0000000000aa" {
		t.Fatalf("a suspend's metadata: %+v", m)
	}
	if got, ok := boot.lookup(); ok {
		t.Fatalf("the saved boot's store took a suspend: %+v", got)
	}
	if _, ok := suspend.lookup(); !ok {
		t.Fatal("the suspend's store lost its state")
	}
	b := savedState(t, boot, "a saved boot")
	if b.Kind != stateBoot || b.Parent != "" {
		t.Fatalf("a saved boot's metadata: %+v", b)
	}
	if got, ok := suspend.lookup(); ok {
		t.Fatalf("the suspend's store took a saved boot: %+v", got)
	}
}
