package qemu

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"

	"github.com/capsem/capsem/vmm"
)

func TestResolveAccel(t *testing.T) {
	kvmOK := func() error { return nil }
	noKVM := func() error { return fs.ErrNotExist }
	cases := []struct {
		spec, env string
		probe     func() error
		want      string
		wantErr   bool
	}{
		{"", "", kvmOK, vmm.AccelKVM, false},
		{"", "", noKVM, vmm.AccelTCG, false},
		{"", "tcg", kvmOK, vmm.AccelTCG, false},
		{"", "kvm", kvmOK, vmm.AccelKVM, false},
		{"", "kvm", noKVM, "", true}, // forcing kvm without kvm is an error, not a silent slowdown
		{"tcg", "kvm", kvmOK, vmm.AccelTCG, false},
		{"kvm", "tcg", kvmOK, vmm.AccelKVM, false},
		{"kvm", "", noKVM, "", true},
		{"", "hvf", kvmOK, "", true},
	}
	for _, c := range cases {
		got, reason, err := ResolveAccel(c.spec, c.env, c.probe)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("ResolveAccel(%q, %q) = %q, %v; want %q (error %v)", c.spec, c.env, got, err, c.want, c.wantErr)
		}
		if err == nil && reason == "" {
			t.Errorf("ResolveAccel(%q, %q): no reason for the log", c.spec, c.env)
		}
		if err != nil && !strings.Contains(err.Error(), "kvm") && !strings.Contains(err.Error(), "hvf") {
			t.Errorf("error does not name the accelerator: %v", err)
		}
	}
}

// TestCreatePicksAccel: Create uses the injected probe and environment and
// the argv follows.
func TestCreatePicksAccel(t *testing.T) {
	for _, c := range []struct {
		env     string
		probe   func() error
		want    string
		wantCPU string
	}{
		{"", func() error { return nil }, vmm.AccelKVM, "host"},
		{"", func() error { return errors.New("permission denied") }, vmm.AccelTCG, "max"},
		{"tcg", func() error { return nil }, vmm.AccelTCG, "max"},
	} {
		b := &Backend{
			Binary:   "true", // any program in PATH: Create does not run it
			ProbeKVM: c.probe,
			Getenv:   func(k string) string { return map[string]string{AccelEnv: c.env}[k] },
		}
		vm, err := b.Create(context.Background(), minimalSpec())
		if err != nil {
			t.Fatal(err)
		}
		m := vm.(*Machine)
		argv := strings.Join(m.Argv(), " ")
		if m.Accel() != c.want || !strings.Contains(argv, "-accel "+c.want+" ") || !strings.Contains(argv, "-cpu "+c.wantCPU+" ") {
			t.Errorf("env %q: accel %s, argv %s", c.env, m.Accel(), argv)
		}
	}
}

func TestProbeKVMHere(t *testing.T) {
	// Whatever this host has, the probe answers without panicking and the
	// error (if any) names the device.
	if err := ProbeKVM(); err != nil && !strings.Contains(err.Error(), "/dev/kvm") {
		t.Fatalf("ProbeKVM: %v", err)
	} else {
		t.Logf("ProbeKVM: %v", err)
	}
}
