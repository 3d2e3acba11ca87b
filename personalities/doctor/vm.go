package doctor

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strings"
	"time"

	"github.com/capsem/capsem/core/doctor"
)

// vmTimeout bounds the vm group: a boot (the first builds the assets and
// proves KVM), the guest's checks and the VM's removal.
const vmTimeout = 15 * time.Minute

// checkVM boots an ephemeral VM with `capsem run`, runs the guest's
// capsem-doctor in it and relays each of its results as it comes (group
// vm, named after the guest's group and check); the VM is removed after.
func (h *host) checkVM(ctx context.Context, r *doctor.Reporter) {
	ctx, cancel := context.WithTimeout(ctx, vmTimeout)
	defer cancel()
	args := []string{"--log-level", "warn", "run", "--guest-binary", h.guestBin}
	if h.cmd.Config != "" {
		args = append(args, "--config", h.cmd.Config)
	}
	if h.cmd.NoAutodetect {
		args = append(args, "--no-autodetect")
	}
	args = append(args, "--", "capsem-doctor", "--json")
	cmd := exec.CommandContext(ctx, h.self, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.Failf("", "%v", err)
		return
	}
	if err := cmd.Start(); err != nil {
		r.Failf("", "starting capsem run: %v", err)
		return
	}
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
	err = cmd.Wait()
	var exit *exec.ExitError
	switch {
	case sum == nil:
		r.Failf("the other groups' failures say why; the VM's own log is in the output above",
			"no VM ran the guest doctor (%v): %s", err, tail(stderr.String()+strings.Join(other, "\n")))
	case sum.Result == "PASS" && err == nil:
		r.Okf("an ephemeral VM ran capsem-doctor: %d ok, %d warn; the VM is removed", sum.OK, sum.Warn)
	case sum.Result == "FAIL" && errors.As(err, &exit) && exit.ExitCode() == 1:
		r.Failf("the vm/... lines above name each failed guest check", "capsem-doctor in the VM: %d failed", sum.Fail)
	default:
		r.Failf("", "capsem-doctor in the VM said %s, and capsem run ended %v", sum.Result, err)
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
