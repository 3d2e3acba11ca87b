// Package vmrecord is the service's record of one VM and the registry that
// stores the records ($CAPSEM_HOME/run/vms, paths.RegistryDir), one JSON
// file per VM. The service writes it; others read it: `capsem policy
// reload` learns from it which VMs run, and under which process, so that a
// running VM whose gateway does not answer is reported instead of missed.
//
// Each write replaces a file atomically (a temporary file renamed over
// it), so a crash leaves the old record or the new one, never half of one.
package vmrecord

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
)

// Record is what the registry keeps of one VM across service restarts:
// its description (whose Process it never holds: that is asked of the
// running VM) and what only the service needs.
type Record struct {
	api.VM
	// RootImage is the root image the VM was made with (Base resolved
	// at its create), for every boot of it: "" for the minimal root.
	RootImage string `json:"root_image,omitempty"`
	Socket    string `json:"socket"` // the per-VM process's API
}

// Label is how messages name the VM: its name, else its id.
func (r *Record) Label() string {
	if r.Name != "" {
		return r.Name
	}
	return r.ID
}

// ProcessAlive reports whether the record's pid is this VM's process (and
// not an unrelated one that reused the pid).
func (r *Record) ProcessAlive() bool {
	if r.PID <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", r.PID))
	return err == nil && IsSessionProcess(b, r.SessionDir)
}

// IsSessionProcess reports whether cmdline (NUL-separated, as in
// /proc/PID/cmdline) is `capsem process` for sessionDir.
func IsSessionProcess(cmdline []byte, sessionDir string) bool {
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	hasProcess, hasDir := false, false
	for i, a := range args {
		if string(a) == "process" {
			hasProcess = true
		}
		if string(a) == "--session-dir" && i+1 < len(args) && string(args[i+1]) == sessionDir {
			hasDir = true
		}
	}
	return hasProcess && hasDir
}

// IDPattern is the form of a VM id.
var IDPattern = regexp.MustCompile(`^vm-[0-9a-f]{12}$`)

// Registry stores records in Dir.
type Registry struct{ Dir string }

// Open is the registry of this home's run directory.
func Open() (Registry, error) {
	dir, err := paths.RegistryDir()
	return Registry{Dir: dir}, err
}

func (g Registry) path(id string) string { return filepath.Join(g.Dir, id+".json") }

// Save writes r, replacing its previous record.
func (g Registry) Save(r *Record) error {
	if !IDPattern.MatchString(r.ID) {
		return fmt.Errorf("registry: bad VM id %q", r.ID)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(g.Dir, 0o700); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	f, err := os.CreateTemp(g.Dir, r.ID+".*.tmp")
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, g.path(r.ID))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("registry: saving %s: %w", r.ID, err)
	}
	return nil
}

// Remove deletes id's record.
func (g Registry) Remove(id string) error {
	if err := os.Remove(g.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("registry: removing %s: %w", id, err)
	}
	return nil
}

// Read returns every record that parses, and an error for each file that
// does not; it changes nothing.
func (g Registry) Read() ([]*Record, []error) {
	recs, bad, errs := g.read()
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		errs = append(errs, fmt.Errorf("registry: %s: %w", name, bad[name]))
	}
	return recs, errs
}

// Load is Read for the registry's owner, the service: a file that does not
// parse is moved aside (so it is not read again), and an unfinished write
// removed. Neither is fatal: one bad record must not keep the service from
// serving the others.
func (g Registry) Load() ([]*Record, []error) {
	recs, bad, errs := g.read()
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		errs = append(errs, fmt.Errorf("registry: %s: %w (moved aside)", name, bad[name]))
		os.Rename(filepath.Join(g.Dir, name), filepath.Join(g.Dir, name+".bad"))
	}
	entries, _ := os.ReadDir(g.Dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			os.Remove(filepath.Join(g.Dir, e.Name()))
		}
	}
	return recs, errs
}

// read parses every record file; bad holds those that do not parse, by
// file name.
func (g Registry) read() (recs []*Record, bad map[string]error, errs []error) {
	entries, err := os.ReadDir(g.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, []error{fmt.Errorf("registry: %w", err)}
	}
	bad = map[string]error{}
	for _, e := range entries {
		name := e.Name()
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !IDPattern.MatchString(id) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(g.Dir, name))
		var r Record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil && r.ID != id {
			err = fmt.Errorf("names VM %q", r.ID)
		}
		if err != nil {
			bad[name] = err
			continue
		}
		if r.Version > api.VMConfigVersion {
			// A newer capsem's record stays as it is, for that capsem.
			errs = append(errs, fmt.Errorf("registry: %s: config_version %d, newer than this capsem reads (%d): left alone", name, r.Version, api.VMConfigVersion))
			continue
		}
		recs = append(recs, &r)
	}
	return recs, bad, errs
}
