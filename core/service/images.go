package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/core/vmrecord"
	"github.com/capsem/capsem/vmm"
)

// Images are what forks make of VMs (package vmimage keeps them): a VM's
// disk and workspace as they were, to create VMs from. Image names and VM
// names are one namespace, so a name given to capsem_create, capsem_info
// or capsem_delete means one thing.
//
// What a VM made from an image keeps of its source, and what it gets anew:
//   - keeps: everything on its disk (files anywhere in the guest, installed
//     packages), its workspace (a copy), the source's settings as defaults;
//     with memory, its RAM and CPU state (the processes running) and the
//     DNS pins of its network;
//   - anew: its id, name and host name (boot config), its machine id (the
//     agent's claimIdentity, as its root records another VM's id), its
//     ledger (a new session), its entropy and clock (the boot, or a memory
//     image's wake), its disk as a layer of its own, its network stack
//     (same guest address and MAC: each VM's stack is its own), its ports.

// imageNamedLocked refuses name when an image has it or a fork is making
// one of it. s.mu is held.
func (s *Service) imageNamedLocked(name string) error {
	if s.forking[name] {
		return conflict("an image named %q is being made", name)
	}
	if _, err := os.Stat(s.images.Disk(name)); err == nil {
		return conflict("an image named %q exists (VMs and images share their names)", name)
	}
	return nil
}

// vmNamedLocked refuses name when a VM has it. s.mu is held.
func (s *Service) vmNamedLocked(name string) error {
	for _, o := range s.vms {
		if o.rec.Name == name {
			return conflict("a VM named %q exists (VMs and images share their names)", name)
		}
	}
	return nil
}

// Fork makes the image req.Name of a running or stopped VM: its disk (the
// VM's own layer; the root image under it is shared, not copied) and its
// workspace. A running VM's guest writes out its caches first and the VM
// is paused for the copy, then runs on.
func (s *Service) Fork(ctx context.Context, ref string, req api.ForkRequest) (api.Image, error) {
	if err := checkName("image", req.Name); err != nil {
		return api.Image{}, err
	}
	if len(req.Description) > api.MaxDescription || !utf8.ValidString(req.Description) {
		return api.Image{}, badRequest("description: want at most %d bytes of UTF-8 text", api.MaxDescription)
	}
	v, r, err := s.lockVM(ref)
	if err != nil {
		return api.Image{}, err
	}
	defer v.mu.Unlock()
	if err := guard(verbFork, &r); err != nil {
		return api.Image{}, err
	}
	if r.Disk() == 0 {
		return api.Image{}, conflict("VM %s has no disk (disk_gb 0): it runs from memory, and a fork copies a disk", r.Label())
	}
	t0 := time.Now()
	s.mu.Lock()
	err = s.vmNamedLocked(req.Name)
	if err == nil {
		err = s.imageNamedLocked(req.Name)
	}
	client := v.client
	if err == nil {
		s.forking[req.Name] = true
	}
	s.mu.Unlock()
	if err != nil {
		return api.Image{}, err
	}
	defer func() {
		s.mu.Lock()
		delete(s.forking, req.Name)
		s.mu.Unlock()
	}()
	staging, err := s.images.Stage(req.Name)
	if err != nil {
		return api.Image{}, err
	}
	var (
		cp       api.ForkCopy
		resumeVM bool // a running source of a memory fork, suspended for it
	)
	switch {
	case req.Memory:
		cp, resumeVM, err = s.copyWithMemory(ctx, v, &r, staging)
	case r.State == api.StateRunning:
		if client == nil {
			err = notRunning(&r)
		} else if cp, err = client.ForkCopy(ctx, staging); err != nil {
			err = s.vmError(v, err)
		}
	default:
		cp, err = copyStopped(ctx, &r, staging)
	}
	var resumeErr error
	if resumeVM {
		// The source carries on from the state it was forked at.
		t := time.Now()
		if resumeErr = s.boot(ctx, v, nil, true); resumeErr != nil {
			s.update(v, func(r *vmrecord.Record) { r.State, r.PID, r.LastLog = api.StateSuspended, 0, resumeErr.Error() })
		}
		cp.PausedMS += time.Since(t).Milliseconds()
	}
	if err != nil {
		s.images.Discard(staging)
		return api.Image{}, err
	}
	img := api.Image{Name: req.Name, Description: req.Description, CreatedAt: time.Now().UTC(),
		Source: api.ImageSource{ID: r.ID, Name: r.Name, State: string(r.State)},
		Base:   r.Base, RootImage: r.RootImage, Config: imageConfig(r.VMConfig),
		DiskBytes: cp.DiskBytes, DiskAllocated: cp.DiskAllocated, WorkspaceBytes: cp.WorkspaceBytes,
		SizeBytes: cp.DiskAllocated + cp.WorkspaceBytes + cp.StateBytes, PausedMS: cp.PausedMS,
		Memory: req.Memory, StateBytes: cp.StateBytes}
	img.ForkMS = time.Since(t0).Milliseconds()
	if err := s.images.Publish(staging, img); err != nil {
		s.images.Discard(staging)
		if errors.Is(err, vmimage.ErrExists) {
			return api.Image{}, conflict("%v", err)
		}
		return api.Image{}, err
	}
	s.pinRoots()
	s.log.Info("forked a VM", "vm", r.ID, "name", r.Name, "image", img.Name, "memory", img.Memory, "fork_ms", img.ForkMS,
		"paused_ms", img.PausedMS, "size_bytes", img.SizeBytes)
	if resumeErr != nil {
		return api.Image{}, fmt.Errorf("image %s is made, but VM %s did not resume after it (it stays suspended; capsem resume tries again): %w", img.Name, r.Label(), resumeErr)
	}
	return s.Image(img.Name)
}

// copyWithMemory copies a VM's disk, workspace and whole state into
// staging: a suspended VM's as they are; a running one is suspended for
// it (resume then reports true: the caller resumes it). v.mu is held.
func (s *Service) copyWithMemory(ctx context.Context, v *vm, r *vmrecord.Record, staging string) (cp api.ForkCopy, resume bool, err error) {
	switch r.State {
	case api.StateRunning:
		t := time.Now()
		if _, err := s.suspendLocked(ctx, v, r); err != nil {
			return cp, false, err
		}
		resume = true
		defer func() { cp.PausedMS += time.Since(t).Milliseconds() }()
	case api.StateSuspended:
	default:
		return cp, false, conflict("VM %s is %s: a fork with memory takes a VM that is running or suspended", r.Label(), r.State)
	}
	if cp, err = copyStopped(ctx, r, staging); err != nil {
		return cp, resume, err
	}
	suspend := paths.Session{Dir: r.SessionDir}.Suspend()
	if _, err = vmimage.CopyTree(ctx, suspend, vmimage.StagedState(staging)); err != nil {
		return cp, resume, fmt.Errorf("copying the VM's saved state: %w", err)
	}
	if cp.StateBytes, err = vmimage.DirAllocated(vmimage.StagedState(staging)); err != nil {
		return cp, resume, fmt.Errorf("the VM's saved state: %w", err)
	}
	return cp, resume, nil
}

// copyStopped copies a stopped VM's disk and workspace into staging.
func copyStopped(ctx context.Context, r *vmrecord.Record, staging string) (api.ForkCopy, error) {
	var out api.ForkCopy
	sess := paths.Session{Dir: r.SessionDir}
	disk := vmm.Disk{Path: sess.Disk()}
	if _, err := os.Stat(sess.DiskLayer()); err == nil {
		disk = vmm.Disk{Path: sess.DiskLayer(), Format: vmm.DiskQcow2}
	}
	u, err := vmimage.CopyDisk(ctx, disk, vmimage.StagedDisk(staging))
	if err != nil {
		return out, err
	}
	out.DiskBytes, out.DiskAllocated = u.Size, u.Allocated
	ws := sess.Workspace()
	if r.Workspace != "" {
		ws = r.Workspace
	}
	out.WorkspaceBytes, err = vmimage.CopyTree(ctx, ws, vmimage.StagedWorkspace(staging))
	return out, err
}

// imageConfig is what VMs of an image start with: the source's settings
// less those that were the source's alone (the ports it published, the
// host directory it shared: the image has its own copy of the workspace).
func imageConfig(c api.VMConfig) api.VMConfig {
	c.Ports, c.Workspace = nil, ""
	return c
}

// fromImage fills req's unset settings from the image's configuration
// (every setting, field by field, so a new one needs no edit here; env
// merged, the request's winning) and refuses what the image cannot be: a
// root or a disk size other than its own.
func fromImage(req *api.CreateRequest, img api.Image) error {
	if img.Problem != "" {
		return refuse(http.StatusConflict, "image %q cannot make a VM: %s", img.Name, img.Problem)
	}
	if req.Base != "" && req.Base != img.Base {
		return badRequest("base %q: image %q is of base %q", req.Base, img.Name, img.Base)
	}
	if img.Memory && (req.RAMMB != 0 && req.RAMMB != img.Config.RAMMB || req.CPUs != 0 && req.CPUs != img.Config.CPUs) {
		return badRequest("image %q holds a running VM's memory and CPUs: its VMs have its %d MB and %d CPUs", img.Name, img.Config.RAMMB, img.Config.CPUs)
	}
	if img.Memory && req.NoNetwork != img.Config.NoNetwork {
		return badRequest("image %q holds a running VM's devices: its VMs keep its network (no_network %v)", img.Name, img.Config.NoNetwork)
	}
	if req.DiskGB != nil && *req.DiskGB != img.Config.Disk() {
		return badRequest("disk_gb %d: image %q has a %d GB disk, which its VMs keep", *req.DiskGB, img.Name, img.Config.Disk())
	}
	env := map[string]string{}
	for k, v := range img.Config.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	got, base := reflect.ValueOf(&req.VMConfig).Elem(), reflect.ValueOf(img.Config)
	for i := range got.NumField() {
		if f := got.Field(i); f.IsZero() && f.CanSet() {
			f.Set(base.Field(i))
		}
	}
	if len(env) > 0 {
		req.Env = env
	}
	req.Version = 0
	return nil
}

// prepareFromImage gives a new VM of an image its disk, a layer over the
// image's, its workspace, a copy of the image's (unless the VM shares a
// host directory), and a memory image's state as its suspend's: memory
// says the VM is then to resume from it. v.mu is held.
func (s *Service) prepareFromImage(ctx context.Context, v *vm) (memory bool, err error) {
	r := s.snapshot(v)
	// Read again: it could have been deleted before this VM was
	// recorded as its user; from now on it cannot be.
	img, err := s.images.Get(r.Image)
	if err == nil && img.Problem != "" {
		err = errors.New(img.Problem)
	}
	if err != nil {
		return false, refuse(http.StatusConflict, "image %q: %v", r.Image, err)
	}
	if err := s.update(v, func(r *vmrecord.Record) { r.RootImage = img.RootImage }); err != nil {
		return false, err
	}
	s.pinRoots()
	if err := os.MkdirAll(r.SessionDir, 0o700); err != nil {
		return false, fmt.Errorf("creating the session directory: %w", err)
	}
	sess := paths.Session{Dir: r.SessionDir}
	if err := vmimage.MakeLayer(ctx, s.images.Disk(r.Image), sess.DiskLayer()); err != nil {
		return false, err
	}
	if r.Workspace == "" {
		if _, err := vmimage.CopyTree(ctx, s.images.Workspace(r.Image), sess.Workspace()); err != nil {
			return false, err
		}
	}
	if img.Memory {
		if err := vmimage.LinkTree(ctx, s.images.State(r.Image), sess.Suspend()); err != nil {
			return false, fmt.Errorf("placing image %s's saved state: %w", img.Name, err)
		}
	}
	return img.Memory, nil
}

// usersOfLocked names the VMs made from the image name. s.mu is held.
func (s *Service) usersOfLocked(name string) []string {
	var out []string
	for _, v := range s.vms {
		if v.rec.Image == name {
			out = append(out, v.rec.Label())
		}
	}
	slices.Sort(out)
	return out
}

// Images lists the images, each with the VMs made from it.
func (s *Service) Images() ([]api.Image, error) {
	list, errs := s.images.List()
	for _, err := range errs {
		s.log.Warn("images", "err", err)
	}
	if list == nil {
		return nil, errors.Join(errs...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range list {
		list[i].UsedBy = s.usersOfLocked(list[i].Name)
	}
	return list, nil
}

// Image describes the image name.
func (s *Service) Image(name string) (api.Image, error) {
	if err := checkName("image", name); err != nil {
		return api.Image{}, err
	}
	img, err := s.images.Get(name)
	if errors.Is(err, vmimage.ErrNotFound) {
		return api.Image{}, refuse(http.StatusNotFound, "no image named %q (capsem image ls lists them)", name)
	}
	if err != nil {
		return api.Image{}, err
	}
	s.mu.Lock()
	img.UsedBy = s.usersOfLocked(name)
	s.mu.Unlock()
	return img, nil
}

// DeleteImage deletes the image name, refused while VMs made from it
// remain (their disks are layers over its disk).
func (s *Service) DeleteImage(name string) error {
	if _, err := s.Image(name); err != nil {
		return err
	}
	// After s.mu is let go: the image's root may go now.
	defer s.pinRoots()
	s.mu.Lock()
	defer s.mu.Unlock()
	if users := s.usersOfLocked(name); len(users) > 0 {
		return conflict("image %q is in use by %d VM(s) made from it (%v): delete them first", name, len(users), users)
	}
	if s.forking[name] {
		return conflict("image %q is being made", name)
	}
	// Under s.mu: no create of the image can start meanwhile.
	if err := s.images.Remove(name); err != nil {
		if errors.Is(err, vmimage.ErrNotFound) {
			return refuse(http.StatusNotFound, "no image named %q", name)
		}
		return err
	}
	return nil
}
