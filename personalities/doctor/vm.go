package doctor

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/paths"
	"github.com/capsem/capsem/core/service"
	"github.com/capsem/capsem/core/vmhost"
	"github.com/capsem/capsem/guestfs"
)

// vmTimeout bounds the vm group: a boot (the first builds the assets and
// proves KVM), the guest's checks and the VM's removal.
const vmTimeout = 15 * time.Minute

// checkVM boots an ephemeral VM, runs the guest's capsem-doctor in it and
// relays each of its results as it comes (group vm, named after the
// guest's group and check); the VM is removed after. The VM's process is
// started here, not through the service: this group proves that a VM
// runs on this host whatever the service's state (the service group
// reports on that).
func (h *host) checkVM(ctx context.Context, r *doctor.Reporter) {
	ctx, cancel := context.WithTimeout(ctx, vmTimeout)
	defer cancel()
	_, err := service.SecureRunDir()
	var sessions string
	if err == nil {
		sessions, err = paths.SessionsDir()
	}
	if err == nil {
		err = os.MkdirAll(sessions, 0o700)
	}
	var dir string
	if err == nil {
		dir, err = os.MkdirTemp(sessions, "doctor-")
	}
	if err != nil {
		r.Failf("", "a session directory for the VM: %v", err)
		return
	}
	defer os.RemoveAll(dir)
	cfg := vmhost.ProcessConfig{SessionDir: dir, Socket: paths.Session{Dir: dir}.APISocket(), Name: "capsem-doctor",
		VMConfig: api.VMConfig{Config: h.cmd.Config, NoAutodetect: h.cmd.NoAutodetect}, GuestBin: h.guestBin}
	// The full root when it is built, so the VM's doctor checks the AI
	// CLIs too; the minimal one otherwise (the assets group says why).
	if root, err := guestfs.ResolveRoot(h.assetsDir(), guestfs.DefaultRecipe); err == nil {
		cfg.RootImage = root.Image
	}
	proc, err := vmhost.Launch(cfg, vmhost.LaunchOptions{Executable: h.self, Env: os.Environ()})
	if err != nil {
		r.Failf("", "starting the VM's process: %v", err)
		return
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer scancel()
		if proc.Stop(sctx) != nil {
			proc.Kill()
		}
	}()
	if _, err := proc.WaitReady(ctx, nil); err != nil {
		r.Failf("the other groups' failures say why", "the VM did not become ready: %v", err)
		return
	}
	out, in := io.Pipe()
	var stderr bytes.Buffer
	var ev *api.ExecEvent
	var execErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		ev, execErr = proc.Client.Exec(ctx, &api.ExecRequest{Argv: []string{"capsem-doctor", "--json"}}, in, &stderr)
		in.Close()
	}()
	var sum *doctor.Summary
	var other []string
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		res, s, ok := doctor.ParseLine(sc.Bytes())
		switch {
		case !ok:
			other = append(other, sc.Text())
		case res != nil:
			res.Name = res.Group + "/" + res.Name
			res.Group = "vm"
			r.Add(*res)
		default:
			sum = s
		}
	}
	io.Copy(io.Discard, out) // a line over the bound: let the exec finish
	<-done
	switch {
	case execErr != nil || ev == nil:
		r.Failf("", "running capsem-doctor in the VM: %v: %s; the VM's process log ends: %s", execErr, tail(stderr.String()), tail(proc.LogTail(6)))
	case sum == nil:
		r.Failf("the other groups' failures say why",
			"capsem-doctor in the VM gave no summary (exit %d): %s; the VM's process log ends: %s", ev.ExitCode, tail(stderr.String()+strings.Join(other, "\n")), tail(proc.LogTail(6)))
	case sum.Result == "PASS" && ev.ExitCode == 0:
		r.Okf("an ephemeral VM ran capsem-doctor: %d ok, %d warn; the VM is removed", sum.OK, sum.Warn)
	case sum.Result == "FAIL" && ev.ExitCode == 1:
		r.Failf("the vm/... lines above name each failed guest check", "capsem-doctor in the VM: %d failed", sum.Fail)
	default:
		r.Failf("", "capsem-doctor in the VM said %s, and exited %d", sum.Result, ev.ExitCode)
	}
}

// tail is the last lines of s, for an error.
func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 6 {
		lines = lines[len(lines)-6:]
	}
	return strings.Join(lines, " | ")
}
