package vmhost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestctl"
	"github.com/capsem/capsem/core/paths"
)

// exitingMachine is a machine whose QEMU exits when done is closed.
type exitingMachine struct{ done chan struct{} }

func (m exitingMachine) Start(context.Context) error { return nil }
func (m exitingMachine) Channel() guestchan.Channel  { return nil }
func (m exitingMachine) Stop(context.Context) error  { return nil }
func (m exitingMachine) Wait() error                 { <-m.done; return nil }
func (m exitingMachine) Done() <-chan struct{}       { return m.done }
func (m exitingMachine) PID() int                    { return 0 }

const panicTrace = "[   13.026395] Kernel panic - not syncing: sysrq triggered crash\n" +
	"[   13.031000] CPU: 0 PID: 212 Comm: sh Not tainted 6.1.0-57-amd64 #1  Debian 6.1.192-3\n" +
	"[   13.040393] Kernel Offset: disabled\n"

// A call the guest connection's close cut off says why: the VM's stop
// (409), the guest going away on its own (503, naming the kernel's panic
// when this boot's console has one), or, when neither comes within the
// bound, nothing more than the failure itself.
func TestCutOffSaysWhatCutTheCall(t *testing.T) {
	closed := fmt.Errorf("%w: the guest channel closed", guestctl.ErrClosed)
	cases := []struct {
		name    string
		console string // before the boot, then after it (split at "|")
		event   func(v *VM)
		err     error
		status  int // 0: err comes back as it is
		has     string
	}{
		{"a stop asked for", "|", func(v *VM) { v.stopping.Store(true) }, closed, http.StatusConflict, "the guest channel closed"},
		{"a kernel panic", "boot\n|" + panicTrace, func(v *VM) { v.loseGuest(errors.New("lost")); close(v.machine.(exitingMachine).done) }, closed, http.StatusServiceUnavailable,
			"the guest's kernel panicked during the call (Kernel panic - not syncing: sysrq triggered crash), which stopped the VM: guestctl: control connection closed"},
		{"QEMU exiting unasked, no panic", "|just a power-off\n", func(v *VM) { close(v.machine.(exitingMachine).done) }, closed, http.StatusServiceUnavailable,
			"QEMU exited during the call (the guest powered off or crashed, or QEMU was killed; the console log has the guest's last output), which stopped the VM"},
		{"a panic of an earlier boot is not this one's", panicTrace + "|booted again\n", func(v *VM) { close(v.machine.(exitingMachine).done) }, closed, http.StatusServiceUnavailable,
			"QEMU exited during the call"},
		{"the guest lost, its QEMU slow to exit", "|", func(v *VM) { v.loseGuest(errors.New("lost")) }, closed, http.StatusServiceUnavailable,
			"the guest's channel closed during the call, which stopped the VM"},
		{"an agent that reconnects", "|", func(*VM) {}, closed, 0, ""},
		{"not a closed connection", "|", func(v *VM) { v.loseGuest(errors.New("lost")) }, errors.New("no such file"), 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			v := &VM{session: paths.Session{Dir: dir}, machine: exitingMachine{done: make(chan struct{})}, lost: make(chan struct{}), stopped: make(chan struct{})}
			before, after, _ := strings.Cut(tc.console, "|")
			log := filepath.Join(dir, "console.log")
			os.WriteFile(log, []byte(before), 0o600)
			v.consoleStart = consoleSize(log)
			f, _ := os.OpenFile(log, os.O_APPEND|os.O_WRONLY, 0)
			f.WriteString(after)
			f.Close()
			tc.event(v)
			start := time.Now()
			err := v.cutOff(context.Background(), tc.err)
			var cut *cutError
			if tc.status == 0 {
				if err != tc.err {
					t.Fatalf("got %v, want the failure as it is", err)
				}
				return
			}
			if !errors.As(err, &cut) || cut.status != tc.status || !strings.Contains(err.Error(), tc.has) || !errors.Is(err, tc.err) {
				t.Fatalf("got %v, want %d saying %q and wrapping %v", err, tc.status, tc.has, tc.err)
			}
			if codeOf(guestErrorStatus(err)) != map[int]string{409: api.CodeInterrupted, 503: api.CodeUnavailable}[tc.status] {
				t.Fatalf("code %s for %d", codeOf(guestErrorStatus(err)), tc.status)
			}
			if took := time.Since(start); tc.name != "the guest lost, its QEMU slow to exit" && took > guestGoneWait/2 {
				t.Fatalf("took %v: the reason was known at once", took)
			}
		})
	}
}

// A caller that left is told nothing more, at once.
func TestCutOffOfACallerThatLeft(t *testing.T) {
	v := &VM{session: paths.Session{Dir: t.TempDir()}, machine: exitingMachine{done: make(chan struct{})}, lost: make(chan struct{}), stopped: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := fmt.Errorf("%w: closed", guestctl.ErrClosed)
	if err := v.cutOff(ctx, closed); err != closed {
		t.Fatalf("got %v", err)
	}
}

// The panic line quoted is bounded: the guest writes the console.
func TestConsolePanicIsBounded(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "console.log"), []byte("Kernel panic - not syncing: "+strings.Repeat("\x1b]52;c;", 1000)+"\n"), 0o600)
	v := &VM{session: paths.Session{Dir: dir}}
	if line := v.consolePanic(); len(line) != maxPanicLine || !strings.HasPrefix(line, "Kernel panic - not syncing: ") {
		t.Fatalf("%d bytes: %q", len(line), line)
	}
	// A console log that rotated since the boot began is all this boot's.
	v.consoleStart = 1 << 30
	if line := v.consolePanic(); line == "" {
		t.Fatal("a rotated console log was not searched")
	}
}
