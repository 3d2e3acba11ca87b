package vmhost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/vmimage"
	"github.com/capsem/capsem/vmm"
)

// forkSyncTimeout bounds the guest's sync before a fork's copy: a guest
// that does not answer is copied as it is on disk (its journal keeps
// that consistent), not waited on for ever.
const forkSyncTimeout = 30 * time.Second

// ForkCopy copies the running VM's disk and workspace into dir, a staging
// directory of the image store: the guest first writes out what it has
// cached (sync), then the VM is paused (its disk writes drained), copied,
// and let run on whatever happened. Forks of one VM go one at a time.
func (v *VM) ForkCopy(ctx context.Context, dir string) (api.ForkCopy, error) {
	var out api.ForkCopy
	if v.upper.ID == "" {
		return out, &refusal{status: http.StatusConflict, err: errors.New("the VM has no disk (disk_gb 0): it runs from memory, and a fork copies a disk")}
	}
	pauser, ok := v.machine.(vmm.Pauser)
	if !ok {
		return out, fmt.Errorf("this VM's backend cannot pause it for a consistent copy")
	}
	v.forkMu.Lock()
	defer v.forkMu.Unlock()
	t := time.Now()
	sctx, cancel := context.WithTimeout(ctx, forkSyncTimeout)
	err := v.control().Sync(sctx)
	cancel()
	if err != nil {
		v.log.Warn("fork: the guest did not sync; copying its disk as it is", "err", err)
	}
	out.SyncMS = time.Since(t).Milliseconds()
	t = time.Now()
	if err := pauser.Pause(ctx); err != nil {
		return out, fmt.Errorf("pausing the VM for its copy: %w", err)
	}
	defer func() {
		if err := pauser.Continue(ctx); err != nil {
			v.log.Error("fork: the VM did not run on after its copy", "err", err)
		}
	}()
	u, err := vmimage.CopyDisk(ctx, v.upper, vmimage.StagedDisk(dir))
	if err != nil {
		return out, err
	}
	out.DiskBytes, out.DiskAllocated = u.Size, u.Allocated
	if out.WorkspaceBytes, err = vmimage.CopyTree(ctx, v.wsDir, vmimage.StagedWorkspace(dir)); err != nil {
		return out, err
	}
	out.PausedMS = time.Since(t).Milliseconds()
	v.log.Info("forked", "dir", dir, "sync_ms", out.SyncMS, "paused_ms", out.PausedMS,
		"disk_allocated_bytes", out.DiskAllocated, "workspace_bytes", out.WorkspaceBytes)
	return out, nil
}

// forkInto is ForkCopy for the service, into a staging directory of this
// home's image store only: nothing else is the process's to write.
func (v *VM) forkInto(ctx context.Context, _ string, req api.ForkCopyRequest) (api.ForkCopy, error) {
	dir, err := paths.ImagesDir()
	if err != nil {
		return api.ForkCopy{}, err
	}
	if !(vmimage.Store{Dir: dir}).IsStaging(req.Dir) {
		return api.ForkCopy{}, &refusal{status: http.StatusBadRequest, err: fmt.Errorf("fork into %q: not a staging directory of the image store %s", req.Dir, dir)}
	}
	return v.ForkCopy(ctx, req.Dir)
}

// refusal is an error with the HTTP status that says what kind it is, and
// its code when not the status's own (writeFailure).
type refusal struct {
	status int
	code   string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
