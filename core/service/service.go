// Package service is the engine of `capsem service`, the one daemon per
// user that owns every VM of that user. It is the only code that starts
// per-VM processes (vmhost.Launch, each detached with a scrubbed
// environment, so that a VM outlives a restart or an upgrade of the
// service), keeps a registry of the VMs that survives a restart, re-adopts
// the processes a crashed service left (or reaps those that no longer
// answer), and serves the JSON API of package api on its socket.
//
// A VM created with a name is persistent: stopping it keeps its session
// directory (disk, workspace, session.db) for resume. A VM without one is
// ephemeral: it is removed when it stops. A run's VM (POST /v1/run and
// /v1/run/stream) is ephemeral even when named, and is removed when its
// command ends, when the service stops, or, should the service die, by the
// next one at start. A VM whose process died is defunct, with the last
// lines of its log.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/version"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/core/vmrecord"
	"github.com/capsem/capsem/vmm"
)

// Options configure a Service.
type Options struct {
	// Executable is capsem ("": this executable).
	Executable string
	// GuestBinary is the guest build for /init ("": next to Executable).
	GuestBinary string
	// NoAutodetect keeps AI CLI settings out of the VMs' gateways.
	NoAutodetect bool
	// TCGCacheMiB bounds the TCG translation cache of every VM that runs
	// under TCG (vmm.Spec.TCGCacheMiB; 0: QEMU's default).
	TCGCacheMiB int
	// ProcessEnv is added to the scrubbed environment of per-VM processes.
	ProcessEnv []string
	// RootImage returns the root image of a base other than minimal,
	// making it when it is missing or out of date (telling progress each
	// step); nil: only the minimal base is available.
	RootImage func(ctx context.Context, base string, progress func(string)) (string, error)
	Logger    *slog.Logger
}

// Service owns the VMs.
type Service struct {
	o        Options
	log      *slog.Logger
	reg      vmrecord.Registry
	sessions string

	mu  sync.Mutex
	vms map[string]*vm // by id

	// runsDone ends every run (EndRuns); runs counts those under way,
	// and takes no more once runsEnded (under runsMu).
	runsDone  context.Context
	endRuns   context.CancelFunc
	runsMu    sync.Mutex
	runsEnded bool
	runs      sync.WaitGroup

	// images are the forks' images; forking names those being made
	// (under mu).
	images  vmimage.Store
	forking map[string]bool

	// inspectSlots holds a token per inspect query under way.
	inspectSlots chan struct{}

	// pinMu serializes pinRoots; pinned are the asset directories
	// holding its pins.
	pinMu  sync.Mutex
	pinned map[string]bool
}

// vm is one VM. mu serializes its lifecycle operations (boot, stop,
// resume, persist, delete), which may be slow, so they hold it without the
// service's lock; rec's fields are guarded by Service.mu.
type vm struct {
	mu       sync.Mutex
	rec      *vmrecord.Record
	proc     *vmhost.Process // started by this service; nil when adopted
	client   *apiclient.ProcessClient
	gone     <-chan struct{} // closed when the running process exits
	stopping bool            // a stop or delete is under way: the exit is expected
}

// New opens the registry, re-adopts the per-VM processes that still answer
// and reaps those that do not.
func New(ctx context.Context, o Options) (*Service, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := vmm.CheckTCGCache(o.TCGCacheMiB); err != nil {
		return nil, err
	}
	regDir, err := paths.RegistryDir()
	if err != nil {
		return nil, err
	}
	sessions, err := paths.SessionsDir()
	if err != nil {
		return nil, err
	}
	for _, d := range []string{regDir, sessions} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	imagesDir, err := paths.ImagesDir()
	if err != nil {
		return nil, err
	}
	s := &Service{o: o, log: o.Logger, reg: vmrecord.Registry{Dir: regDir}, sessions: sessions, vms: map[string]*vm{},
		images: vmimage.Store{Dir: imagesDir}, forking: map[string]bool{},
		inspectSlots: make(chan struct{}, maxInspectQueries)}
	// Forks cut short by the last service's end.
	s.images.Sweep()
	s.runsDone, s.endRuns = context.WithCancel(context.Background())
	recs, errs := s.reg.Load()
	for _, err := range errs {
		s.log.Error("VM registry", "err", err)
	}
	for _, r := range recs {
		s.vms[r.ID] = &vm{rec: r}
	}
	for _, v := range s.vms {
		s.adopt(ctx, v)
	}
	s.pinRoots()
	return s, nil
}

// lookup finds a VM by id, else by name.
func (s *Service) lookup(ref string) (*vm, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.vms[ref]; ok {
		return v, nil
	}
	for _, v := range s.vms {
		if v.rec.Name != "" && v.rec.Name == ref {
			return v, nil
		}
	}
	return nil, notFound(ref)
}

// snapshot is a copy of v's record, taken under the service's lock.
func (s *Service) snapshot(v *vm) vmrecord.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *v.rec
}

// view is a VM's description.
func (s *Service) view(v *vm) api.VM {
	r := s.snapshot(v)
	return r.VM
}

// lockVM finds a VM by id or name and takes its lifecycle lock (the
// caller releases v.mu) and a copy of its record under it.
func (s *Service) lockVM(ref string) (*vm, vmrecord.Record, error) {
	v, err := s.lookup(ref)
	if err != nil {
		return nil, vmrecord.Record{}, err
	}
	v.mu.Lock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vms[v.rec.ID] != v {
		// Removed while this caller waited for it (a delete, a purge or
		// an ephemeral VM's stop).
		v.mu.Unlock()
		return nil, vmrecord.Record{}, notFound(ref)
	}
	return v, *v.rec, nil
}

// update changes v's record under the service's lock and saves it.
func (s *Service) update(v *vm, change func(r *vmrecord.Record)) error {
	s.mu.Lock()
	change(v.rec)
	r := *v.rec
	s.mu.Unlock()
	return s.reg.Save(&r)
}

// List returns every VM, oldest first. A running VM whose guest does not
// answer is listed as unresponsive, as its process reports.
func (s *Service) List() []api.VM {
	s.mu.Lock()
	out := make([]api.VM, 0, len(s.vms))
	clients := make([]*apiclient.ProcessClient, 0, len(s.vms))
	for _, v := range s.vms {
		out = append(out, v.rec.VM)
		var c *apiclient.ProcessClient
		if v.rec.State == api.StateRunning {
			c = v.client
		}
		clients = append(clients, c)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), listInfoTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range clients {
		if c == nil {
			continue
		}
		wg.Go(func() {
			if info, err := c.Info(ctx); err == nil && info.State == api.StateUnresponsive {
				out[i].State = api.StateUnresponsive
			}
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b api.VM) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// listInfoTimeout bounds List's wait for the running VMs' own reports
// (asked all at once; a process does not ask its guest to answer).
const listInfoTimeout = 2 * time.Second

// Info describes one VM; a running one adds its process's own report.
func (s *Service) Info(ctx context.Context, ref string) (api.VM, error) {
	v, err := s.lookup(ref)
	if err != nil {
		return api.VM{}, err
	}
	return s.runningView(ctx, v), nil
}

// runningClient is v's API client when it runs, else nil.
func (s *Service) runningClient(v *vm) *apiclient.ProcessClient {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v.rec.State != api.StateRunning {
		return nil
	}
	return v.client
}

// running returns v's client, or the refusal that says why there is none.
func (s *Service) running(ref string) (*vm, *apiclient.ProcessClient, error) {
	v, err := s.lookup(ref)
	if err != nil {
		return nil, nil, err
	}
	c := s.runningClient(v)
	if c == nil {
		r := s.snapshot(v)
		return nil, nil, notRunning(&r)
	}
	return v, c, nil
}

// sessionOf is v's session directory.
func (s *Service) sessionOf(v *vm) paths.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return paths.Session{Dir: v.rec.SessionDir}
}

// Version is the service's build.
func (s *Service) Version() api.Version {
	return api.Version{Version: version.Version, PID: os.Getpid()}
}

// sessionDirFor is where the VM with id keeps its state.
func (s *Service) sessionDirFor(id string) string { return filepath.Join(s.sessions, id) }
