package vmhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capsem/capsem/core/filelock"
	"github.com/capsem/capsem/vmm"
	"github.com/capsem/capsem/vmm/ramfile"
)

// A VM normally starts by resuming a saved one instead of booting. For the
// first VM of a configuration the process boots a VM, saves it at the wake
// handshake's save point (guestwire.Wake: modules loaded, devices found,
// nothing VM-specific done) and stops it; that VM and every later one of
// the configuration resume from the state and carry on from the same
// point, with their own disk, workspace, entropy and clock.

// replacedStateGrace is how old a replaced state must be before a publish
// removes it.
var replacedStateGrace = time.Minute

// bootStateFormat is bumped whenever what a saved state means changes, so
// old ones are no longer used.
const bootStateFormat = 2

// stateKind is what a saved state is, which decides who may collect it:
// a saved boot is shared by the VMs of its configuration, a cache that
// goes when it no longer loads; a suspend is one VM's, saved in its
// session, resumed by it or by the VMs of an image made of it (a memory
// fork copies it), and kept when it does not load (only a resume with
// boot, or the VM's deletion, discards it).
type stateKind string

const (
	stateBoot    stateKind = "boot"
	stateSuspend stateKind = "suspend"
)

// bootState is where a saved state lives: in dir (a saved boot's beside
// the assets it boots from; a suspend's in its VM's session), named by a
// key over QEMU's argv without its per-VM parts (the argv names the
// assets' files) and QEMU's own identity.
type bootState struct {
	dir  string
	key  string
	argv []string // normalized, recorded in the metadata for diagnosis
	kind stateKind
	// vm is the VM a suspend store belongs to (the parent its states
	// record).
	vm string
}

// bootStateMeta is <key>.json, written once the state file is complete.
type bootStateMeta struct {
	Format int       `json:"format"`
	Kind   stateKind `json:"kind"`
	// Parent is the VM whose state it is (a suspend's; a VM made from a
	// memory fork resumes its source's).
	Parent string `json:"parent,omitempty"`
	Key    string `json:"key"`
	State  string `json:"state"` // file name in the boot-states directory
	Size   int64  `json:"size"`
	// Memory is the file of the guest's RAM beside State
	// (vmm.MemoryPath), "" for a backend that keeps RAM in State;
	// MemoryBytes is its data.
	Memory      string `json:"memory,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	// SHA256 covers the state and its RAM's data (hashState).
	SHA256  string    `json:"sha256"`
	Created time.Time `json:"created"`
	Argv    []string  `json:"argv"`
}

// newBootState keys the saved state of a VM whose QEMU argv (program first) is
// argv: the VM's name and its session directory are left out (they differ
// per VM and reach no guest state), and QEMU's binary is identified by
// size and modification time, since another QEMU may not read the state.
func newBootState(dir string, argv []string, sessionDir string) (*bootState, error) {
	if len(argv) == 0 {
		return nil, errors.New("boot state: empty QEMU argv")
	}
	st, err := os.Stat(argv[0])
	if err != nil {
		return nil, fmt.Errorf("boot state: QEMU binary: %w", err)
	}
	var norm []string
	for i := 0; i < len(argv); i++ {
		if argv[i] == "-name" {
			i++
			continue
		}
		norm = append(norm, strings.ReplaceAll(argv[i], sessionDir, "$SESSION"))
	}
	h := sha256.New()
	fmt.Fprintf(h, "capsem boot state %d\x00qemu %d %d\x00", bootStateFormat, st.Size(), st.ModTime().UnixNano())
	for _, a := range norm {
		h.Write([]byte(a))
		h.Write([]byte{0})
	}
	return &bootState{dir: dir, key: hex.EncodeToString(h.Sum(nil))[:24], argv: norm, kind: stateBoot}, nil
}

// suspendOf makes s the store of vm's suspend.
func (s *bootState) suspendOf(vm string) *bootState {
	s.kind, s.vm = stateSuspend, vm
	return s
}

func (s *bootState) metaPath() string { return filepath.Join(s.dir, s.key+".json") }

// saveLockTimeout bounds the wait for another process's save of the same
// configuration (a boot and a save take seconds, more with many at once).
const saveLockTimeout = 3 * time.Minute

// lockSave takes the lock that lets one VM at a time boot to save this
// configuration: VMs started together then resume from one saved boot
// instead of each booting and saving its own.
func (s *bootState) lockSave(ctx context.Context) (func(), error) {
	ctx, cancel := context.WithTimeout(ctx, saveLockTimeout)
	defer cancel()
	return filelock.Lock(ctx, filepath.Join(s.dir, s.key+".save.lock"))
}

// lookup returns the metadata when a complete one is there.
// It checks the metadata and the state file's size; the state's bytes are
// checked by verify, beside the restore.
func (s *bootState) lookup() (*bootStateMeta, bool) {
	b, err := os.ReadFile(s.metaPath())
	if err != nil {
		return nil, false
	}
	var m bootStateMeta
	if json.Unmarshal(b, &m) != nil || m.Format != bootStateFormat || m.Kind != s.kind || m.Key != s.key ||
		m.State == "" || filepath.Base(m.State) != m.State {
		return nil, false
	}
	st, err := os.Stat(filepath.Join(s.dir, m.State))
	if err != nil || !st.Mode().IsRegular() || st.Size() != m.Size {
		return nil, false
	}
	if m.Memory != "" {
		if m.Memory != filepath.Base(vmm.MemoryPath(m.State)) {
			return nil, false
		}
		if st, err := os.Stat(s.memoryPath(&m)); err != nil || !st.Mode().IsRegular() {
			return nil, false
		}
	}
	return &m, true
}

// memoryPath is the file of the state's RAM, "" when it has none apart.
func (s *bootState) memoryPath(m *bootStateMeta) string {
	if m.Memory == "" {
		return ""
	}
	return filepath.Join(s.dir, m.Memory)
}

// Bytes is what the state takes: its file and its RAM's data.
func (m *bootStateMeta) Bytes() int64 { return m.Size + m.MemoryBytes }

func (s *bootState) statePath(m *bootStateMeta) string { return filepath.Join(s.dir, m.State) }

// verify hashes the state and its RAM and compares them with the
// metadata.
func (s *bootState) verify(m *bootStateMeta) error {
	sum, size, memBytes, err := hashState(s.statePath(m), s.memoryPath(m))
	if err != nil {
		return err
	}
	if size != m.Size || memBytes != m.MemoryBytes || sum != m.SHA256 {
		return fmt.Errorf("saved VM state %s: sha256 %s (%d bytes, RAM %d), its metadata says %s (%d bytes, RAM %d)",
			s.statePath(m), sum, size, memBytes, m.SHA256, m.Size, m.MemoryBytes)
	}
	return nil
}

// newStatePath returns a path for SaveState to write a new state to.
func (s *bootState) newStatePath() (string, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return "", fmt.Errorf("boot state directory: %w", err)
	}
	return filepath.Join(s.dir, fmt.Sprintf("%s.%d.saving", s.key, os.Getpid())), nil
}

// publish hashes the state SaveState wrote to path (and its RAM beside
// it, when the backend keeps RAM apart), names the files by their hash,
// and writes the metadata that makes it the configuration's saved state.
func (s *bootState) publish(path string) (*bootStateMeta, error) {
	memory := vmm.MemoryPath(path)
	if _, err := os.Stat(memory); err != nil {
		memory = ""
	}
	drop := func() {
		os.Remove(path)
		if memory != "" {
			os.Remove(memory)
		}
	}
	sum, size, memBytes, err := hashState(path, memory)
	if err != nil {
		drop()
		return nil, err
	}
	m := &bootStateMeta{Format: bootStateFormat, Kind: s.kind, Parent: s.vm, Key: s.key, State: s.key + "-" + sum[:16] + ".state",
		Size: size, MemoryBytes: memBytes, SHA256: sum, Created: time.Now().UTC(), Argv: s.argv}
	if memory != "" {
		m.Memory = filepath.Base(vmm.MemoryPath(m.State))
		if err := os.Rename(memory, s.memoryPath(m)); err != nil {
			drop()
			return nil, fmt.Errorf("boot state: naming the state's RAM: %w", err)
		}
	}
	if err := os.Rename(path, s.statePath(m)); err != nil {
		drop()
		os.Remove(s.memoryPath(m))
		return nil, fmt.Errorf("boot state: naming the state: %w", err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	tmp := s.metaPath() + fmt.Sprintf(".%d.tmp", os.Getpid())
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("boot state: writing its metadata: %w", err)
	}
	if err := os.Rename(tmp, s.metaPath()); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("boot state: publishing its metadata: %w", err)
	}
	// States of the key this one replaces go, once no start can still be
	// about to open one (a concurrent first start may have published one
	// a moment ago, and be resuming from it).
	old, _ := filepath.Glob(filepath.Join(s.dir, s.key+"-*.state"))
	for _, p := range old {
		if st, err := os.Stat(p); err == nil && filepath.Base(p) != m.State && time.Since(st.ModTime()) > replacedStateGrace {
			os.Remove(p)
			os.Remove(vmm.MemoryPath(p))
		}
	}
	return m, nil
}

// remove deletes the saved state (metadata first, so nobody picks the state
// up meanwhile).
func (s *bootState) remove(m *bootStateMeta) {
	os.Remove(s.metaPath())
	if m != nil {
		os.Remove(s.statePath(m))
		if m.Memory != "" {
			os.Remove(s.memoryPath(m))
		}
	}
}

// hashState hashes the state file at path and, when memory is not "", the
// data of its RAM file (vmm/ramfile.Hash: the RAM's pages, not the file's
// holes, so a copy hashes alike). It returns the hash, the state's size and
// the RAM's bytes of data.
func hashState(path, memory string) (sum string, size, memBytes int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, 0, fmt.Errorf("boot state: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if size, err = io.Copy(h, f); err != nil {
		return "", 0, 0, fmt.Errorf("boot state: reading %s: %w", path, err)
	}
	if memory != "" {
		mf, err := os.Open(memory)
		if err != nil {
			return "", 0, 0, fmt.Errorf("boot state: %w", err)
		}
		defer mf.Close()
		if memBytes, err = ramfile.Hash(h, mf); err != nil {
			return "", 0, 0, fmt.Errorf("boot state: %s: %w", memory, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), size, memBytes, nil
}
