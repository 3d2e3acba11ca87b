package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/apiclient"
	"github.com/capsem/capsem/core/config"
	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/mcpgw"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/privsep"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/core/vmrecord"
)

// Defaults of a CreateRequest beyond its VMConfig's.
const (
	DefaultImage = "default"
	// bootTimeout bounds a VM's boot: assets may be built first.
	bootTimeout = 5 * time.Minute
	// stopTimeout bounds a clean stop before the process is killed.
	stopTimeout = 30 * time.Second
)

// normalize fills req's defaults and checks it: what any VM needs
// (api.VMConfig.Check), then what this host needs (the workspace
// directory, the environment, the policy files).
func (s *Service) normalize(req *api.CreateRequest) error {
	req.Image = cmp.Or(req.Image, DefaultImage)
	if req.Name != "" {
		if err := CheckName(req.Name); err != nil {
			return err
		}
	}
	if req.Image != DefaultImage {
		img, err := s.Image(req.Image)
		if err != nil {
			return err
		}
		if err := fromImage(req, img); err != nil {
			return err
		}
	}
	if err := req.VMConfig.Check(); err != nil {
		return badRequest("%v", err)
	}
	req.VMConfig = req.VMConfig.WithDefaults()
	if req.Workspace != "" {
		if err := vmhost.CheckWorkspaceDir(req.Workspace); err != nil {
			return badRequest("%v", err)
		}
	}
	if err := checkEnv(req.Env); err != nil {
		return err
	}
	req.NoAutodetect = req.NoAutodetect || s.o.NoAutodetect
	return checkConfig(req.Config, req.NoAutodetect)
}

// checkPortsFree refuses ports whose host address cannot be listened on
// now (taken, or privileged), so that a create or resume that would fail
// on them fails before a VM starts, naming the port. The VM's process
// listens on them itself, and says the same should one be taken meanwhile.
func checkPortsFree(ports []api.PortMapping) error {
	for _, m := range ports {
		ln, err := net.Listen("tcp", m.Listen())
		if err != nil {
			return conflict("%v", &vmhost.PortTakenError{Port: m, Err: err})
		}
		ln.Close()
	}
	return nil
}

// checkConfig refuses a VM configuration that the VM's process would
// refuse after its assets are made: the same files, parsed the same way,
// so that a bad one is a 400 naming the problem and no VM is started.
func checkConfig(path string, noAutodetect bool) error {
	if path != "" {
		if !filepath.IsAbs(path) {
			return badRequest("config %q: want an absolute path (the service does not share the client's working directory)", path)
		}
		// Kernel interfaces look like regular files, and some block
		// on read.
		for _, fs := range []string{"/proc/", "/sys/", "/dev/"} {
			if strings.HasPrefix(filepath.Clean(path)+"/", fs) {
				return badRequest("config %s: a kernel interface, not a configuration file", path)
			}
		}
		if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
			if err == nil {
				err = errors.New("not a regular file")
			}
			return badRequest("config %s: %v", path, err)
		}
	}
	sources, err := mcpgw.SourcesFor(path, !noAutodetect)
	if err == nil {
		_, err = config.LoadHierarchy(sources)
	}
	if err != nil {
		return badRequest("configuration: %v", err)
	}
	return nil
}

// checkEnv refuses env variables that privsep would refuse.
func checkEnv(env map[string]string) error {
	if len(env) > api.MaxEnv {
		return badRequest("env has %d variables, more than %d", len(env), api.MaxEnv)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if err := privsep.CheckEnv(k, env[k]); err != nil {
			return badRequest("env: %v", err)
		}
	}
	return nil
}

// Create boots a VM and returns once it is ready for exec. A create that
// fails (bad input, a name taken, too little memory, a boot that fails or
// is cancelled) leaves nothing behind.
func (s *Service) Create(ctx context.Context, req api.CreateRequest) (api.VM, error) {
	return s.create(ctx, req, false, nil)
}

// CreateStream is Create, telling stage each stage of the VM's start as
// it begins; a refusal comes before any stage.
func (s *Service) CreateStream(ctx context.Context, req api.CreateRequest, stage func(string)) (api.VM, error) {
	return s.create(ctx, req, false, stage)
}

// create is Create, of a run's VM (ephemeral, even when named) or not,
// telling stage (when not nil) the stages of its start.
func (s *Service) create(ctx context.Context, req api.CreateRequest, run bool, stage func(string)) (api.VM, error) {
	if err := s.normalize(&req); err != nil {
		return api.VM{}, err
	}
	if err := checkPortsFree(req.Ports); err != nil {
		return api.VM{}, err
	}
	v, err := s.reserve(req, run)
	if err != nil {
		return api.VM{}, err
	}
	defer v.mu.Unlock()
	memory := false
	if req.Image != DefaultImage {
		memory, err = s.prepareFromImage(ctx, v)
	} else {
		err = s.resolveBase(ctx, v, stage)
	}
	if err != nil {
		s.discard(v)
		return api.VM{}, err
	}
	if err := s.boot(ctx, v, stage, memory); err != nil {
		s.discard(v)
		return api.VM{}, err
	}
	return s.runningView(ctx, v), nil
}

// resolveBase records the root image of v's base, made first if need be;
// the VM keeps that image for good (a later build makes a new file and
// leaves it be). v.mu is held.
func (s *Service) resolveBase(ctx context.Context, v *vm, stage func(string)) error {
	s.mu.Lock()
	base := v.rec.Base
	s.mu.Unlock()
	if base == api.BaseMinimal {
		return nil
	}
	if s.o.RootImage == nil {
		return unavailable("base %q: this service has no root images (use base %q)", base, api.BaseMinimal)
	}
	progress := func(line string) {
		if stage != nil {
			stage(api.StageRootImage + line)
		}
	}
	path, err := s.o.RootImage(ctx, base, progress)
	if err != nil {
		return unavailable("base %q: %v", base, err)
	}
	if err := s.update(v, func(r *vmrecord.Record) { r.RootImage = path }); err != nil {
		return err
	}
	s.pinRoots()
	return nil
}

// runningView is v's description with its process's own report.
func (s *Service) runningView(ctx context.Context, v *vm) api.VM {
	out := s.view(v)
	if c := s.runningClient(v); c != nil {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if info, err := c.Info(ictx); err == nil {
			out.Process = info
			if info.State == api.StateUnresponsive {
				out.State = api.StateUnresponsive
			}
		}
	}
	return out
}

// reserve records a new VM as booting, its name taken and its memory
// counted, and returns it locked.
func (s *Service) reserve(req api.CreateRequest, run bool) (*vm, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Name != "" {
		for _, o := range s.vms {
			if o.rec.Name == req.Name {
				return nil, conflict("a VM named %q exists already (%s)", req.Name, o.rec.State)
			}
		}
		if err := s.imageNamedLocked(req.Name); err != nil {
			return nil, err
		}
	}
	if err := s.checkMemoryLocked(req.RAMMB); err != nil {
		return nil, err
	}
	id := newID()
	r := &vmrecord.Record{VM: api.VM{ID: id, Name: req.Name, Persistent: req.Name != "" && !run, Run: run, State: api.StateBooting,
		Image: req.Image, CreatedAt: time.Now().UTC(), SessionDir: s.sessionDirFor(id), VMConfig: req.VMConfig}}
	r.Socket = paths.Session{Dir: r.SessionDir}.APISocket()
	v := &vm{rec: r}
	v.mu.Lock()
	s.vms[id] = v
	return v, nil
}

// boot starts v's process and waits until the VM is ready, telling stage
// (when not nil) the stages the process reports; suspended resumes the
// VM's suspend instead of booting. v.mu is held.
func (s *Service) boot(ctx context.Context, v *vm, stage func(string), suspended bool) error {
	s.mu.Lock()
	r := *v.rec
	v.rec.State, v.rec.LastLog, v.stopping = api.StateBooting, "", false
	s.mu.Unlock()
	if err := s.update(v, func(*vmrecord.Record) {}); err != nil {
		return err
	}
	t0 := time.Now()
	cfg := vmhost.ProcessConfig{SessionDir: r.SessionDir, Socket: r.Socket, Name: cmp.Or(r.Name, r.ID), ID: r.ID, VMConfig: r.VMConfig,
		GuestBin: s.o.GuestBinary, RootImage: r.RootImage, TCGCacheMiB: s.o.TCGCacheMiB, Suspended: suspended}
	cfg.NoAutodetect = cfg.NoAutodetect || s.o.NoAutodetect
	proc, err := vmhost.Launch(cfg, vmhost.LaunchOptions{Executable: s.o.Executable, Env: s.processEnv(credentialEnv(r.Config, cfg.NoAutodetect)...), Detach: true})
	if err != nil {
		return err
	}
	// On the record at once: a service that dies now finds the process.
	if err := s.update(v, func(r *vmrecord.Record) { r.PID = proc.PID() }); err != nil {
		proc.Kill()
		return err
	}
	launched := time.Since(t0)
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	info, err := proc.WaitReady(bctx, stage)
	if err != nil {
		proc.Kill()
		return fmt.Errorf("VM %s did not boot: %w", r.Label(), err)
	}
	s.mu.Lock()
	v.proc, v.client, v.gone = proc, proc.Client, proc.Done()
	s.mu.Unlock()
	if err := s.update(v, func(r *vmrecord.Record) { r.State, r.StartedAt = api.StateRunning, time.Now().UTC() }); err != nil {
		s.log.Error("VM registry", "vm", r.ID, "err", err)
	}
	go s.watch(v, proc.Done())
	s.log.Info("VM running", "vm", r.ID, "name", r.Name, "pid", proc.PID(), "launch_ms", launched.Milliseconds(),
		"ready_ms", time.Since(t0).Milliseconds(), "process_boot_ms", info.BootTimings["total"])
	return nil
}

// watch marks v defunct when its process exits while nobody stops it.
func (s *Service) watch(v *vm, gone <-chan struct{}) {
	<-gone
	s.mu.Lock()
	expected := v.stopping || v.gone != gone
	if !expected {
		v.rec.State, v.rec.PID = api.StateDefunct, 0
		v.rec.LastLog = vmhost.LogTail(paths.Session{Dir: v.rec.SessionDir}.ProcessLog(), 8)
		v.client, v.proc = nil, nil
	}
	r := *v.rec
	s.mu.Unlock()
	if expected {
		return
	}
	s.log.Error("VM process died", "vm", r.ID, "name", r.Name, "last_log", r.LastLog)
	if err := s.reg.Save(&r); err != nil {
		s.log.Error("VM registry", "vm", r.ID, "err", err)
	}
}

// credentialEnv names the service's variables that hold credentials the
// VM's configuration reads (source_env): the one thing of the service's
// environment a per-VM process gets beyond what it runs on.
func credentialEnv(configPath string, noAutodetect bool) []string {
	sources, err := mcpgw.SourcesFor(configPath, !noAutodetect)
	if err != nil {
		return nil
	}
	m, err := config.LoadHierarchy(sources)
	if err != nil {
		return nil // the VM's process reports it
	}
	var names []string
	for _, c := range m.Net.Credentials() {
		if c.SourceEnv != "" {
			names = append(names, c.SourceEnv)
		}
	}
	return names
}

// processEnv is the per-VM processes' environment: nothing of the
// service's own but what they need (the capsem variables envvars marks
// passed on), the variables named in also, and the options' additions.
func (s *Service) processEnv(also ...string) []string {
	keep := append([]string{"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR"},
		envvars.PassedOn()...)
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(keep, k) || slices.Contains(also, k) || strings.HasPrefix(k, "LC_") {
			env = append(env, kv)
		}
	}
	return append(env, s.o.ProcessEnv...)
}

// discard removes every trace of a VM whose create failed. v.mu is held.
func (s *Service) discard(v *vm) {
	s.mu.Lock()
	delete(s.vms, v.rec.ID)
	r := *v.rec
	s.mu.Unlock()
	killSessionProcesses(r.SessionDir)
	if err := os.RemoveAll(r.SessionDir); err != nil {
		s.log.Error("removing a failed VM's session", "vm", r.ID, "err", err)
	}
	if err := s.reg.Remove(r.ID); err != nil {
		s.log.Error("VM registry", "vm", r.ID, "err", err)
	}
	s.pinRoots()
}

// Stop stops a running VM. A persistent VM keeps its state for resume;
// an ephemeral one is removed.
func (s *Service) Stop(ctx context.Context, ref string) (api.VM, error) {
	v, r, err := s.lockVM(ref)
	if err != nil {
		return api.VM{}, err
	}
	defer v.mu.Unlock()
	if err := guard(verbStop, &r); err != nil {
		return api.VM{}, err
	}
	s.halt(ctx, v)
	if !r.Persistent {
		s.discard(v)
		out := r.VM
		out.State = api.StateStopped
		return out, nil
	}
	if err := s.update(v, func(r *vmrecord.Record) { r.State, r.PID = api.StateStopped, 0 }); err != nil {
		return api.VM{}, err
	}
	return s.view(v), nil
}

// halt stops v's process, cleanly if it answers, and waits for it to be
// gone. v.mu is held.
func (s *Service) halt(ctx context.Context, v *vm) {
	s.mu.Lock()
	v.stopping = true
	proc, client, gone, pid := v.proc, v.client, v.gone, v.rec.PID
	s.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	switch {
	case proc != nil:
		if err := proc.Stop(sctx); err != nil {
			s.log.Warn("stopping a VM", "pid", pid, "err", err)
		}
	case client != nil && gone != nil: // adopted
		if err := client.Stop(sctx); err != nil {
			s.log.Warn("stopping an adopted VM", "pid", pid, "err", err)
		}
		select {
		case <-gone:
		case <-sctx.Done():
			killPID(pid)
			<-gone
		}
	}
	s.mu.Lock()
	v.proc, v.client, v.gone = nil, nil, nil
	s.mu.Unlock()
}

// Resume starts a persistent VM again: a suspended one from its saved
// state, its processes where they were (with boot: its state discarded,
// its disk booted); a stopped or defunct one by booting its disk.
func (s *Service) Resume(ctx context.Context, ref string, req api.ResumeRequest) (api.VM, error) {
	v, r, err := s.lockVM(ref)
	if err != nil {
		return api.VM{}, err
	}
	defer v.mu.Unlock()
	if !r.Persistent {
		return api.VM{}, conflict("VM %s is ephemeral: only a persistent VM can be resumed (capsem_persist makes one)", r.Label())
	}
	if err := guard(verbResume, &r); err != nil {
		return api.VM{}, err
	}
	if err := s.checkMemory(r.RAMMB); err != nil {
		return api.VM{}, err
	}
	if err := checkConfig(r.Config, r.NoAutodetect || s.o.NoAutodetect); err != nil {
		return api.VM{}, err
	}
	if err := checkPortsFree(r.Ports); err != nil {
		return api.VM{}, err
	}
	suspended := r.State == api.StateSuspended && !req.Boot
	if r.State == api.StateSuspended && req.Boot {
		if err := os.RemoveAll(paths.Session{Dir: r.SessionDir}.Suspend()); err != nil {
			return api.VM{}, fmt.Errorf("discarding the suspended state: %w", err)
		}
	}
	if err := s.boot(ctx, v, nil, suspended); err != nil {
		s.update(v, func(r *vmrecord.Record) {
			// A suspend's state that did not load stays, for another
			// try or a resume with boot.
			r.State, r.PID = api.StateDefunct, 0
			if suspended {
				r.State = api.StateSuspended
			}
			r.LastLog = err.Error()
		})
		if suspended {
			return api.VM{}, conflict("VM %s did not resume from its suspended state: %v", r.Label(), err)
		}
		return api.VM{}, err
	}
	return s.view(v), nil
}

// Suspend saves a running persistent VM's whole state in its session and
// stops it; Resume carries on from it. When the save fails after the
// guest parked, the VM is stopped (its disk intact) and the error says so.
func (s *Service) Suspend(ctx context.Context, ref string) (api.VM, error) {
	v, r, err := s.lockVM(ref)
	if err != nil {
		return api.VM{}, err
	}
	defer v.mu.Unlock()
	if err := guard(verbSuspend, &r); err != nil {
		return api.VM{}, err
	}
	if !r.Persistent {
		return api.VM{}, conflict("VM %s is ephemeral: only a persistent VM can be suspended (capsem_persist names it)", r.Label())
	}
	if _, err := s.suspendLocked(ctx, v, &r); err != nil {
		return api.VM{}, err
	}
	return s.view(v), nil
}

// suspendLocked suspends the running VM v (r: its record): suspended on
// success; stopped, and said so, when the save failed after its guest
// parked. v.mu is held.
func (s *Service) suspendLocked(ctx context.Context, v *vm, r *vmrecord.Record) (api.SuspendResult, error) {
	s.mu.Lock()
	client := v.client
	v.stopping = true
	s.mu.Unlock()
	if client == nil {
		return api.SuspendResult{}, notRunning(r)
	}
	res, err := client.Suspend(ctx)
	var se *apiclient.StatusError
	if errors.As(err, &se) && se.Status/100 == 4 {
		// Refused before the guest parked: the VM runs on.
		s.mu.Lock()
		v.stopping = false
		s.mu.Unlock()
		return res, s.vmError(v, err)
	}
	s.halt(ctx, v)
	if err != nil {
		s.update(v, func(r *vmrecord.Record) { r.State, r.PID, r.LastLog = api.StateStopped, 0, err.Error() })
		return res, fmt.Errorf("VM %s: the suspend failed, and the VM is stopped (its disk is intact; capsem resume boots it): %w", r.Label(), err)
	}
	if err := s.update(v, func(r *vmrecord.Record) { r.State, r.PID, r.LastLog = api.StateSuspended, 0, "" }); err != nil {
		return res, err
	}
	s.log.Info("VM suspended", "vm", r.ID, "name", r.Name, "state_bytes", res.StateBytes, "ms", res.SuspendMS)
	return res, nil
}

// Persist names a running ephemeral VM, which makes it persistent.
func (s *Service) Persist(ref, name string) (api.VM, error) {
	if err := CheckName(name); err != nil {
		return api.VM{}, err
	}
	v, r, err := s.lockVM(ref)
	if err != nil {
		return api.VM{}, err
	}
	defer v.mu.Unlock()
	if err := guard(verbPersist, &r); err != nil {
		return api.VM{}, err
	}
	s.mu.Lock()
	if v.rec.Persistent {
		defer s.mu.Unlock()
		return api.VM{}, conflict("VM %s is persistent already", v.rec.Label())
	}
	if v.rec.Run {
		defer s.mu.Unlock()
		return api.VM{}, conflict("VM %s belongs to a capsem run: it is removed when the run's command ends", v.rec.Label())
	}
	for _, o := range s.vms {
		if o.rec.Name == name {
			defer s.mu.Unlock()
			return api.VM{}, conflict("a VM named %q exists already", name)
		}
	}
	if err := s.imageNamedLocked(name); err != nil {
		defer s.mu.Unlock()
		return api.VM{}, err
	}
	v.rec.Name, v.rec.Persistent = name, true
	r = *v.rec
	s.mu.Unlock()
	if err := s.reg.Save(&r); err != nil {
		return api.VM{}, err
	}
	return r.VM, nil
}

// Delete stops a VM if it runs and removes it with all its state.
func (s *Service) Delete(ctx context.Context, ref string) error {
	v, _, err := s.lockVM(ref)
	if err != nil {
		return err
	}
	defer v.mu.Unlock()
	s.halt(ctx, v)
	s.discard(v)
	return nil
}

// Purge deletes every ephemeral VM, and with all the persistent ones too.
func (s *Service) Purge(ctx context.Context, all bool) api.PurgeResult {
	var ids []string
	s.mu.Lock()
	for id, v := range s.vms {
		if all || !v.rec.Persistent {
			ids = append(ids, id)
		}
	}
	s.mu.Unlock()
	slices.Sort(ids)
	out := api.PurgeResult{Removed: []string{}}
	for _, id := range ids {
		if err := s.Delete(ctx, id); err == nil {
			out.Removed = append(out.Removed, id)
		}
	}
	return out
}

// adopt takes over a VM found in the registry at start: a process that
// still answers is adopted; one that does not is killed; the VM is then
// defunct (it was running) or stays stopped.
func (s *Service) adopt(ctx context.Context, v *vm) {
	r := v.rec
	if r.Run {
		// Its run's client went with the service that ran it.
		killSessionProcesses(r.SessionDir)
		delete(s.vms, r.ID)
		os.RemoveAll(r.SessionDir)
		s.reg.Remove(r.ID)
		s.log.Warn("removed the VM of a run its service did not finish", "vm", r.ID, "name", r.Name)
		return
	}
	if r.State == api.StateStopped || r.State == api.StateDefunct || r.State == api.StateSuspended {
		killSessionProcesses(r.SessionDir) // none should run; none may
		return
	}
	if r.ProcessAlive() {
		client := apiclient.NewProcessClient(r.Socket)
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := client.Info(ictx)
		cancel()
		if gone, werr := watchPID(r.PID); err == nil && info.State == api.StateRunning && werr == nil {
			v.client, v.gone, r.State = client, gone, api.StateRunning
			s.reg.Save(r)
			go s.watch(v, gone)
			s.log.Info("re-adopted a running VM", "vm", r.ID, "name", r.Name, "pid", r.PID)
			return
		} else if werr != nil {
			err = errors.Join(err, werr)
		}
		s.log.Warn("a VM's process does not answer; killing it", "vm", r.ID, "pid", r.PID, "err", err)
	}
	killSessionProcesses(r.SessionDir)
	r.State, r.PID = api.StateDefunct, 0
	r.LastLog = vmhost.LogTail(paths.Session{Dir: r.SessionDir}.ProcessLog(), 8)
	s.reg.Save(r)
	s.log.Warn("a VM's process was gone at start; defunct", "vm", r.ID, "name", r.Name)
}
