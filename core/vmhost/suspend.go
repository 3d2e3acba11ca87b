package vmhost

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/core/netstack"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/vmm"
)

// A suspend saves the running VM's whole state (RAM, CPUs, devices) in its
// session (paths.Session.Suspend), keyed like a saved boot by the QEMU
// command line it must resume in, and stops the VM; a start with
// Options.Suspended resumes it there, its guest's processes where they
// were. The guest parks first (guestwire.TypeSuspend): it ends its
// channel session and waits for a wake, which is how a restored VM's
// agent learns the time and fresh entropy and opens a new session.

// suspendTimeout bounds a suspend's save (the guest's RAM into a file).
const suspendTimeout = 5 * time.Minute

// Files of a suspend's state store besides the state: the DNS pins, and
// the marker the parked guest waits for before its wake.
const (
	pinsFile   = "dns-pins.json"
	markerFile = "wake-marker"
)

// suspendState is the suspend's state store of the VM's session.
func (v *VM) suspendState() (*bootState, error) {
	if v.ownStateKeyArgv == nil {
		return nil, errors.New("this VM's backend cannot save its state")
	}
	st, err := newBootState(paths.Session{Dir: v.opts.SessionDir}.Suspend(), v.ownStateKeyArgv, v.opts.SessionDir)
	if err != nil {
		return nil, err
	}
	return st.suspendOf(v.opts.ID), nil
}

// planSuspended is the plan of a start that resumes the VM's suspend:
// its state, when one saved for this very configuration is there.
func (v *VM) planSuspended(key []string) bootPlan {
	if key == nil {
		return bootPlan{err: errors.New("this VM's backend cannot restore a suspended state")}
	}
	dir := paths.Session{Dir: v.opts.SessionDir}.Suspend()
	st, err := newBootState(dir, key, v.opts.SessionDir)
	if err != nil {
		return bootPlan{err: err}
	}
	st.suspendOf(v.opts.ID)
	if m, ok := st.lookup(); ok {
		if m.Parent != v.opts.ID {
			v.log.Info("resuming the suspended state of another VM (a memory fork's image)", "parent", m.Parent)
		}
		marker, err := os.ReadFile(filepath.Join(dir, markerFile))
		if err != nil {
			return bootPlan{err: fmt.Errorf("the VM's suspended state has no wake marker (%w); resuming with boot discards it and boots the VM's disk", err)}
		}
		return bootPlan{mode: ModeResume, saved: st, meta: m, suspended: true, wakeMarker: marker}
	}
	metas, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(metas) > 0 {
		return bootPlan{err: errors.New("the VM's suspended state was saved by another QEMU build or configuration, which this start's cannot load; resuming with boot discards it and boots the VM's disk")}
	}
	return bootPlan{err: errors.New("the VM has no suspended state in its session; resuming with boot boots its disk")}
}

// Suspend parks the guest, saves the VM's state into its session and
// stops the VM (the process then exits, as after Stop). On a failure after
// the guest parked, the VM is stopped all the same: its disk is intact,
// its processes lost.
func (v *VM) Suspend(ctx context.Context) (api.SuspendResult, error) {
	var out api.SuspendResult
	suspender, ok := v.machine.(vmm.Suspender)
	if !ok {
		return out, &refusal{status: http.StatusConflict, err: errors.New("this VM's backend cannot suspend it")}
	}
	st, err := v.suspendState()
	if err != nil {
		return out, &refusal{status: http.StatusConflict, err: err}
	}
	ctl := v.control()
	if ctl == nil {
		return out, &refusal{status: http.StatusConflict, err: errors.New("the VM is not ready")}
	}
	v.forkMu.Lock() // no fork's copy while the VM goes
	defer v.forkMu.Unlock()
	t := time.Now()
	// The disk gets what the guest cached: a state that is later
	// discarded (a resume with boot) must not take the guest's recent
	// writes with it.
	syncCtx, cancel := context.WithTimeout(ctx, forkSyncTimeout)
	err = ctl.Sync(syncCtx)
	cancel()
	if err != nil {
		v.log.Warn("suspend: the guest did not sync", "err", err)
	}
	// From here the guest ending its session is expected.
	v.suspended.Store(true)
	v.stopping.Store(true)
	marker := make([]byte, guestwire.MinWakeMarker)
	rand.Read(marker)
	if err := ctl.Suspend(ctx, marker); err != nil {
		// Refused (an agent that cannot park) or not answered: the VM
		// runs on as it was.
		v.suspended.Store(false)
		v.stopping.Store(false)
		return out, &refusal{status: http.StatusConflict, err: fmt.Errorf("the guest did not park for the suspend: %w", err)}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), suspendTimeout)
	defer cancel()
	// Once the guest has parked, nothing but a stop follows.
	defer func() { go v.Stop(context.Background()) }()
	os.RemoveAll(st.dir) // a state left by an earlier suspend is stale
	path, err := st.newStatePath()
	if err == nil {
		err = suspender.SuspendTo(sctx, path)
	}
	var meta *bootStateMeta
	if err == nil {
		meta, err = st.publish(path)
	}
	if err != nil {
		os.RemoveAll(st.dir)
		return out, fmt.Errorf("saving the VM's state (the VM is stopped; its disk is intact): %w", err)
	}
	if err := os.WriteFile(filepath.Join(st.dir, markerFile), marker, 0o600); err != nil {
		os.RemoveAll(st.dir)
		return out, fmt.Errorf("keeping the wake marker (the VM is stopped; its disk is intact): %w", err)
	}
	if v.net != nil {
		if b, err := json.Marshal(v.net.stack.Pins()); err == nil {
			if err := os.WriteFile(filepath.Join(st.dir, pinsFile), b, 0o600); err != nil {
				v.log.Warn("keeping the DNS pins for the resume", "err", err)
			}
		}
	}
	out.StateBytes, out.SuspendMS = meta.Bytes(), time.Since(t).Milliseconds()
	v.log.Info("suspended", "state", st.statePath(meta), "bytes", meta.Bytes(), "ms", out.SuspendMS)
	return out, nil
}

// restorePins gives a VM about to resume from its suspend the DNS pins its
// stack had, before the guest's first packet.
func (v *VM) restorePins() {
	if v.net == nil {
		return
	}
	var pins []netstack.Pin
	b, err := os.ReadFile(filepath.Join(paths.Session{Dir: v.opts.SessionDir}.Suspend(), pinsFile))
	if err == nil {
		err = json.Unmarshal(b, &pins)
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		v.log.Warn("reading the suspended VM's DNS pins", "err", err)
	}
	v.net.stack.RestorePins(pins)
}

// finishResume consumes the suspend's state of a VM resumed from it: the
// VM runs on from here.
func (v *VM) finishResume() {
	dir := paths.Session{Dir: v.opts.SessionDir}.Suspend()
	if err := os.RemoveAll(dir); err != nil {
		v.log.Warn("removing the resumed suspend's state", "err", err)
	}
}
