package vmhost

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/capsem/capsem/vmm"
)

// TestStartFallingBackToTCG: only a start that failed under a KVM nobody
// forced, before the guest spoke, is retried, once, after the verdict is
// demoted; every other outcome stands.
func TestStartFallingBackToTCG(t *testing.T) {
	kvm := vmm.Accel{Name: vmm.AccelKVM, CPU: "host"}
	forcedKVM := vmm.Accel{Name: vmm.AccelKVM, CPU: "host", Forced: true}
	tcg := vmm.Accel{Name: vmm.AccelTCG, CPU: "max"}
	boom := errors.New("the guest did not say hello within 90s")
	for _, c := range []struct {
		name        string
		firstAccel  vmm.Accel
		firstErr    error
		spoke       bool
		demoteErr   error
		wantStarts  []string // the accel argument of each start
		wantDemoted bool
		wantErr     bool
	}{
		{"works under kvm", kvm, nil, true, nil, []string{""}, false, false},
		{"kvm never reached the guest", kvm, boom, false, nil, []string{"", ""}, true, false},
		{"kvm failed, cache unwritable", kvm, boom, false, errors.New("read-only"), []string{"", vmm.AccelTCG}, true, false},
		{"forced kvm fails as it is", forcedKVM, boom, false, nil, []string{""}, false, true},
		{"the guest spoke, then failed", kvm, boom, true, nil, []string{""}, false, true},
		{"tcg failure is not retried", tcg, boom, false, nil, []string{""}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var starts []string
			accel, spoke := c.firstAccel, c.spoke
			demoted := false
			how, err := startFallingBackToTCG(slog.New(slog.DiscardHandler),
				func(a string) (StartMode, error) {
					starts = append(starts, a)
					if len(starts) == 1 {
						return ModeBoot, c.firstErr
					}
					accel, spoke = tcg, true
					return ModeResume, nil
				},
				func() (vmm.Accel, bool) { return accel, spoke },
				func(why error) error {
					if !errors.Is(why, boom) {
						t.Errorf("demoted for %v", why)
					}
					demoted = true
					return c.demoteErr
				})
			if (err != nil) != c.wantErr || demoted != c.wantDemoted || len(starts) != len(c.wantStarts) {
				t.Fatalf("err %v, demoted %v, starts %q; want error %v, demoted %v, starts %q", err, demoted, starts, c.wantErr, c.wantDemoted, c.wantStarts)
			}
			for i := range starts {
				if starts[i] != c.wantStarts[i] {
					t.Fatalf("starts %q, want %q", starts, c.wantStarts)
				}
			}
			if len(starts) == 2 && how != ModeResume {
				t.Fatalf("the retry's start mode %q is not the one returned", how)
			}
		})
	}
}
