package vmhost

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/guestctl"
	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/vmm"
)

// StartMode is how a VM starts.
type StartMode int

const (
	// ModeBoot boots the VM and saves nothing.
	ModeBoot StartMode = iota
	// ModeBootAndSave boots a VM to its save point, saves its state there
	// for every later VM of the configuration, and resumes this VM from
	// that state like those.
	ModeBootAndSave
	// ModeResume resumes the saved boot of the VM's configuration.
	ModeResume
	// ModeResumeSuspended resumes the VM's own state, saved by its
	// suspend: its processes carry on where they were.
	ModeResumeSuspended
)

// String is the mode as api.Info.Start reports it.
func (m StartMode) String() string {
	switch m {
	case ModeBootAndSave:
		return "booted_saved"
	case ModeResume:
		return "restored"
	case ModeResumeSuspended:
		return "resumed"
	}
	return "booted"
}

// startMachine starts the VM of spec, with the accelerator left to the
// backend's decision, falling back to TCG once when KVM that passed its
// proof still cannot run it.
func (v *VM) startMachine(ctx context.Context, spec vmm.Spec, bootStates string, canSave bool) error {
	backend := v.opts.Backend
	mode, err := startFallingBackToTCG(v.log,
		func(accel string) (StartMode, error) {
			s := spec
			s.Accel = accel
			return v.startWithSavedBoots(ctx, s, bootStates, canSave)
		},
		func() (vmm.Accel, bool) { return v.accel, v.ctl.client != nil },
		func(why error) error { return backend.DemoteAccel(ctx, spec, why) })
	if err != nil {
		return err
	}
	v.start = mode
	return nil
}

// startFallingBackToTCG runs start with the accelerator left to the
// backend's decision. When that start failed under KVM that was not forced
// and before the guest spoke (used says what the last start ran under and
// whether the guest spoke), KVM passed its proof yet cannot run this VM: a
// VM never fails to start for the accelerator's sake, so demote records
// that (later VMs go straight to TCG) and start runs once more under TCG.
func startFallingBackToTCG(log *slog.Logger, start func(accel string) (StartMode, error),
	used func() (vmm.Accel, bool), demote func(error) error) (StartMode, error) {
	mode, err := start("")
	accel, spoke := used()
	if err == nil || spoke || accel.Name != vmm.AccelKVM || accel.Forced {
		return mode, err
	}
	log.Warn("the VM did not start under KVM; retrying once under TCG", "err", err)
	if derr := demote(err); derr != nil {
		log.Warn("recording the KVM failure", "err", derr)
		return start(vmm.AccelTCG)
	}
	// The decision now reads the demoted verdict, and says why.
	return start("")
}

// bootPlan is how one start of the VM goes: the mode, and for the modes
// that use a saved boot, where it lives and (resuming) which state.
type bootPlan struct {
	mode  StartMode
	saved *bootState     // nil: saved boots are off or unavailable
	meta  *bootStateMeta // the state to resume (ModeResume)
	// suspended: the state is the VM's own, saved by its suspend: it
	// resumes from it or not at all (err says why not).
	suspended bool
	// wakeMarker is the marker the suspended guest waits for (nil: the
	// saved boots', guestwire.WakeMarker).
	wakeMarker []byte
	err        error
}

// planBoot picks the first plan for spec: resume its saved boot when there
// is one; else, when canSave, boot to save it; else boot. key is the
// configuration a saved state depends on, nil when the backend's machines
// cannot save and key states.
func (v *VM) planBoot(key []string, bootStates string, canSave bool) bootPlan {
	o := v.opts
	if o.Suspended {
		return v.planSuspended(v.ownStateKeyArgv)
	}
	switch {
	case key == nil:
		return bootPlan{mode: ModeBoot}
	case o.NoBootState || envvars.BootState.Get() == "off":
		v.log.Info("saved VM states are off", "env", envvars.BootState.Name())
		return bootPlan{mode: ModeBoot}
	}
	saved, err := newBootState(cmp.Or(o.BootStateDir, bootStates), key, o.SessionDir)
	if err != nil {
		v.log.Warn("VM states cannot be saved or restored", "err", err)
		return bootPlan{mode: ModeBoot}
	}
	if m, ok := saved.lookup(); ok {
		return bootPlan{mode: ModeResume, saved: saved, meta: m}
	}
	if canSave {
		return bootPlan{mode: ModeBootAndSave, saved: saved}
	}
	return bootPlan{mode: ModeBoot, saved: saved}
}

// stateKey is the configuration key of spec's saved boot under accel, and
// of the VM's own states (vmm.StateKeyer), or nil when the backend's
// machines cannot save and resume states. Saved boots are keyed by a
// machine that does the wake handshake.
func (v *VM) stateKey(spec vmm.Spec, accel vmm.Accel) (key, own []string, err error) {
	m, err := v.opts.Backend.CreateWithAccel(withWake(spec), accel)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the VM: %w", err)
	}
	keyer, okKey := m.(vmm.StateKeyer)
	_, okSave := m.(vmm.StateSaver)
	_, okHook := m.(vmm.ChannelHooker)
	if !okKey || !okSave || !okHook {
		return nil, nil, nil
	}
	return keyer.StateKey(), keyer.OwnStateKey(), nil
}

// startWithSavedBoots starts the guest of spec as planBoot says and, when
// a start does not work out, as the next plan says, until one does or
// booting failed. It returns how the VM started.
func (v *VM) startWithSavedBoots(ctx context.Context, spec vmm.Spec, bootStates string, canSave bool) (StartMode, error) {
	v.stage("choosing the accelerator")
	accel, err := v.opts.Backend.ChooseAccel(ctx, spec)
	if err != nil {
		return ModeBoot, fmt.Errorf("creating the VM: %w", err)
	}
	// Decided once: every machine below runs with this accelerator and
	// CPU model, which the configuration key of the saved boot names.
	v.accel = accel
	v.log.Info("accelerator", "accel", accel.Name, "cpu", accel.CPU, "reason", accel.Reason)
	key, own, err := v.stateKey(spec, accel)
	if err != nil {
		return ModeBoot, err
	}
	v.ownStateKeyArgv = own
	// One VM of a configuration boots to save it; the others started with
	// it wait for that save, then resume from it. The lock is held until
	// the save is published, or this start ends.
	var unlockSave func()
	defer func() {
		if unlockSave != nil {
			unlockSave()
		}
	}()
	lockForSave := func(p bootPlan) bootPlan {
		if p.mode != ModeBootAndSave || unlockSave != nil {
			return p
		}
		unlock, err := p.saved.lockSave(ctx)
		if err != nil {
			v.log.Warn("waiting for another VM's save of this configuration; booting without saving", "err", err)
			return bootPlan{mode: ModeBoot}
		}
		unlockSave = unlock
		if m, ok := p.saved.lookup(); ok {
			return bootPlan{mode: ModeResume, saved: p.saved, meta: m}
		}
		return p
	}
	plan := lockForSave(v.planBoot(key, bootStates, canSave))
	if plan.err != nil {
		return ModeBoot, plan.err
	}
	justSaved := false
	for {
		t := time.Now()
		saved, err := v.startGuest(ctx, spec, plan)
		switch {
		case err == nil && saved:
			// The VM that booted served only to be saved (it was stopped
			// at its save point, before anything of this VM): this VM
			// resumes from the state like every later one, and so has
			// only the guest RAM it uses (the save read all of it).
			v.timings["boot_and_save"] = time.Since(t).Milliseconds()
			justSaved = true
			if unlockSave != nil { // published: the VMs waiting for it may resume now
				unlockSave()
				unlockSave = nil
			}
			if m, ok := plan.saved.lookup(); ok {
				plan = bootPlan{mode: ModeResume, saved: plan.saved, meta: m}
			} else { // replaced and removed by a concurrent first start
				v.log.Warn("the boot saved a moment ago is gone; booting")
				plan = bootPlan{mode: ModeBoot}
			}
			continue
		case err == nil && justSaved:
			return ModeBootAndSave, nil
		case err == nil && plan.mode == ModeBootAndSave:
			return ModeBoot, nil // its save failed: it booted on, unsaved
		case err == nil && plan.suspended:
			return ModeResumeSuspended, nil
		case err == nil:
			return plan.mode, nil
		case plan.suspended:
			return plan.mode, fmt.Errorf("the VM's suspended state could not be restored (%w; the console's last lines: %s); resuming with boot discards it and boots the VM's disk",
				err, LogTail(spec.ConsoleLog, 4))
		case plan.mode != ModeResume || v.ctl.client != nil:
			return plan.mode, err
		}
		// The state was refused (its hash did not match: the guest was
		// never woken, so it touched nothing of this VM) or the guest
		// never spoke (the backend could not load it). Drop it and boot;
		// save again unless this very start just saved it.
		v.log.Warn("resuming the saved boot failed; removing it and booting", "err", err, "state", plan.saved.statePath(plan.meta))
		plan.saved.remove(plan.meta)
		next := bootPlan{mode: ModeBoot}
		if canSave && !justSaved {
			next = lockForSave(bootPlan{mode: ModeBootAndSave, saved: plan.saved})
		}
		plan = next
	}
}

// startGuest creates and starts the machine for spec as plan says, does
// the host side of the wake handshake, and waits for the guest's Hello.
// saved reports a ModeBootAndSave start that saved the state: its machine
// is stopped, and the VM is to resume from that state. Resuming, it hashes
// the saved state while the backend loads it, and wakes the guest only
// once the hash matched. On failure v.machine is stopped, and v.ctl is set
// only if the guest had spoken.
func (v *VM) startGuest(ctx context.Context, spec vmm.Spec, plan bootPlan) (saved bool, err error) {
	t := time.Now()
	v.stage(map[StartMode]string{ModeResume: "resuming the saved boot of this configuration", ModeBoot: "booting under " + v.accel.Name,
		ModeBootAndSave: "booting under " + v.accel.Name + ", to save the boot for the VMs of this configuration"}[plan.mode])
	var checked chan stateCheck
	switch plan.mode {
	case ModeResume:
		spec.RestoreFrom = plan.saved.statePath(plan.meta)
		checked = make(chan stateCheck, 1)
		go func() {
			t := time.Now()
			err := plan.saved.verify(plan.meta)
			checked <- stateCheck{err: err, ms: time.Since(t).Milliseconds()}
		}()
	}
	// Every VM gets the monitor: saving its boot, and pausing it for a
	// fork's consistent copy of its disk, go through it.
	spec.Monitor = true
	// A VM that neither saves nor resumes boots without the handshake,
	// and mounts its disk while its last modules load.
	if plan.mode != ModeBoot {
		spec = withWake(spec)
	}
	m, err := v.opts.Backend.CreateWithAccel(spec, v.accel)
	if err != nil {
		return false, fmt.Errorf("creating the VM: %w", err)
	}
	v.machine = m
	var hook *wakeHook
	if plan.mode != ModeBoot {
		// stateKey checked that machines of this backend have all three.
		hook = &wakeHook{v: v, saver: m.(vmm.StateSaver), plan: plan, checked: checked}
		m.(vmm.ChannelHooker).SetBeforeChannel(hook.run)
	}
	v.consoleStart = consoleSize(spec.ConsoleLog)
	if err := m.Start(ctx); err != nil {
		return false, fmt.Errorf("starting the VM: %w", err)
	}
	v.timings["qemu_start"] = time.Since(t).Milliseconds()
	if hook != nil && hook.saved {
		// Never woken: it waits at its save point until it is stopped.
		v.stopMachine(ctx, m)
		return true, nil
	}
	// The guest mounts the workspace before it says hello.
	ph, ok := m.(vmm.PortHolder)
	var wsConn net.Conn
	if ok {
		wsConn, ok = ph.Port(guestwire.WorkspacePort)
	}
	if !ok {
		v.stopMachine(ctx, m)
		return false, errors.New("the VM backend gave no workspace port")
	}
	v.ws.serve(ctx, v, wsConn)
	if v.net != nil {
		if err := v.net.serve(ctx, v, m); err != nil {
			v.stopMachine(ctx, m)
			return false, err
		}
	}
	t = time.Now()
	hctx, cancel := context.WithTimeoutCause(ctx, helloTimeout, fmt.Errorf("the guest did not say hello within %v", helloTimeout))
	v.ctl.client, err = guestctl.Accept(hctx, m.Channel(), v.controlOptions())
	cancel()
	if err != nil {
		v.stopMachine(ctx, m)
		return false, fmt.Errorf("waiting for the guest agent: %w (console: %s)", err, spec.ConsoleLog)
	}
	v.timings["kernel_to_hello"] = time.Since(t).Milliseconds()
	return false, nil
}

func (v *VM) stopMachine(ctx context.Context, m vmm.Machine) {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := m.Stop(stopCtx); err != nil {
		v.log.Warn("stopping the VM", "err", err)
	}
}

// wakeHook is the host side of the wake handshake for a start that uses a
// saved boot: at the save point, save the state (ModeBootAndSave), or,
// resuming, wait for the state's hash (checked) before the wake.
type wakeHook struct {
	v       *VM
	saver   vmm.StateSaver
	plan    bootPlan
	checked <-chan stateCheck
	// saved: the state was saved and published, and the guest was left
	// unwoken at its save point.
	saved bool
}

func (h *wakeHook) run(ctx context.Context, raw net.Conn) error {
	if h.plan.mode == ModeBootAndSave {
		if err := readSavePoint(ctx, raw); err != nil {
			return err
		}
		saved, err := h.save(ctx)
		if err != nil {
			return err
		}
		if saved {
			h.saved = true
			return nil // no wake: this machine is stopped, and the VM resumes
		}
		return sendWake(raw, nil)
	}
	select {
	case r := <-h.checked:
		h.v.timings["state_hash"] = r.ms
		if r.err != nil {
			return fmt.Errorf("the saved boot failed verification: %w", r.err)
		}
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return sendWake(raw, h.plan.wakeMarker)
}

// save saves and publishes the state of the VM waiting at its save point
// and reports whether that worked. A failed save leaves the VM fine, to
// boot on unsaved, unless it stays paused (vmm.ErrNotResumed): that is an
// error, since a paused VM would never answer.
func (h *wakeHook) save(ctx context.Context) (bool, error) {
	t := time.Now()
	defer func() { h.v.timings["save_state"] = time.Since(t).Milliseconds() }()
	ctx, cancel := context.WithTimeout(ctx, wakePointTimeout)
	defer cancel()
	path, err := h.plan.saved.newStatePath()
	if err == nil {
		err = h.saver.SaveState(ctx, path)
	}
	var m *bootStateMeta
	if err == nil {
		m, err = h.plan.saved.publish(path)
	}
	if errors.Is(err, vmm.ErrNotResumed) {
		return false, err
	}
	if err != nil {
		h.v.log.Warn("saving the VM state failed; booting on", "err", err)
		return false, nil
	}
	h.v.log.Info("saved the VM at its save point", "state", h.plan.saved.statePath(m), "bytes", m.Bytes())
	return true, nil
}

// withWake returns spec with the kernel parameter that asks the agent for
// the wake handshake.
func withWake(spec vmm.Spec) vmm.Spec {
	spec.Cmdline += " " + guestwire.CmdlineWake + "=1"
	return spec
}

// stateCheck is the verdict on a saved state's bytes, and how long the
// hash took.
type stateCheck struct {
	err error
	ms  int64
}

// helloTimeout bounds the wait for the guest agent's hello once the
// machine runs, so that a guest that hangs (a KVM that passed its proof but
// cannot run the whole VM) fails its start instead of waiting forever; the
// agent gives up on the channel after its own 60 s.
const helloTimeout = 90 * time.Second

// wakePointTimeout bounds the wait for the guest's save point and the
// save there (the agent gives up on its side after its own channel
// timeout).
const wakePointTimeout = 60 * time.Second

// readSavePoint reads the save_point a booting guest sends on the raw
// channel before it waits for the wake.
func readSavePoint(ctx context.Context, raw net.Conn) error {
	pctx, cancel := context.WithTimeout(ctx, wakePointTimeout)
	defer cancel()
	dl, _ := pctx.Deadline()
	raw.SetReadDeadline(dl)
	var m guestwire.Message
	err := guestwire.NewReader(raw).Read(&m)
	raw.SetReadDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("waiting for the guest's save point: %w", err)
	}
	if m.Type != guestwire.TypeSavePoint {
		return fmt.Errorf("the guest sent %q where its save point belongs", m.Type)
	}
	return nil
}

// sendWake wakes the guest, with fresh entropy and the time, after marker
// (nil: guestwire.WakeMarker). A resumed guest said save_point before it
// was saved: it only gets the wake.
func sendWake(raw net.Conn, marker []byte) error {
	if marker == nil {
		marker = []byte(guestwire.WakeMarker)
	}
	seed := make([]byte, guestwire.MinWakeSeed)
	rand.Read(seed)
	w := &guestwire.Message{Type: guestwire.TypeWake, Wake: &guestwire.Wake{ClockUnixNano: time.Now().UnixNano(), Seed: seed}}
	if _, err := raw.Write(marker); err != nil {
		return fmt.Errorf("waking the guest: %w", err)
	}
	if err := guestwire.NewWriter(raw).Write(w); err != nil {
		return fmt.Errorf("waking the guest: %w", err)
	}
	return nil
}
