package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/capsem/capsem/core/api"
)

// record is what the registry keeps of one VM, across service restarts:
// its description (whose Process it never holds: that is asked of the
// running VM) and what only the service needs.
type record struct {
	api.VM
	DiskGB int    `json:"disk_gb"`
	Socket string `json:"socket"`
}

func (r *record) view() api.VM { return r.VM }

// registry stores one JSON file per VM in dir. Each write replaces the
// file atomically (a temporary file renamed over it), so a crash leaves
// the old record or the new one, never half of one.
type registry struct{ dir string }

var idRe = regexp.MustCompile(`^vm-[0-9a-f]{12}$`)

func (g registry) path(id string) string { return filepath.Join(g.dir, id+".json") }

func (g registry) save(r *record) error {
	if !idRe.MatchString(r.ID) {
		return fmt.Errorf("registry: bad VM id %q", r.ID)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(g.dir, 0o700); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	f, err := os.CreateTemp(g.dir, r.ID+".*.tmp")
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

func (g registry) remove(id string) error {
	if err := os.Remove(g.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("registry: removing %s: %w", id, err)
	}
	return nil
}

// load reads every record. A file that does not parse is reported and
// skipped (moved aside, so it is not read again), never fatal: one bad
// record must not keep the service from serving the others.
func (g registry) load() ([]*record, []error) {
	entries, err := os.ReadDir(g.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, []error{fmt.Errorf("registry: %w", err)}
	}
	var out []*record
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(g.dir, name)) // a write that never finished
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || !idRe.MatchString(id) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(g.dir, name))
		var r record
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil && r.ID != id {
			err = fmt.Errorf("names VM %q", r.ID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("registry: %s: %w (moved aside)", name, err))
			os.Rename(filepath.Join(g.dir, name), filepath.Join(g.dir, name+".bad"))
			continue
		}
		out = append(out, &r)
	}
	return out, errs
}
