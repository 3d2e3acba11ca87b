package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestwire"
)

// fakeWakeHost answers the agent's save point with reply (nil: say
// nothing) on the other end of a pipe, and reports what the agent sent.
func fakeWakeHost(t *testing.T, reply *guestwire.Message) (net.Conn, <-chan guestwire.Message) {
	t.Helper()
	guest, host := net.Pipe()
	t.Cleanup(func() { guest.Close(); host.Close() })
	got := make(chan guestwire.Message, 1)
	go func() {
		var m guestwire.Message
		if err := guestwire.NewReader(host).Read(&m); err != nil {
			close(got)
			return
		}
		got <- m
		if reply != nil {
			// Junk first, as a restored guest may find in its buffers
			// (a start of the marker among it), then the marker.
			host.Write([]byte("\x00\xffcaps\x00junk" + guestwire.WakeMarker))
			guestwire.NewWriter(host).Write(reply)
		}
	}()
	return guest, got
}

func TestWakeHandshake(t *testing.T) {
	seed := bytes.Repeat([]byte{0xa5}, guestwire.MinWakeSeed)
	clock := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		reply     *guestwire.Message
		wantErr   string // "" = success
		wantClock bool
	}{
		{"wake", &guestwire.Message{Type: guestwire.TypeWake, Wake: &guestwire.Wake{ClockUnixNano: clock.UnixNano(), Seed: seed}}, "", true},
		{"wake without clock", &guestwire.Message{Type: guestwire.TypeWake, Wake: &guestwire.Wake{Seed: seed}}, "", false},
		{"another message", &guestwire.Message{Type: guestwire.TypePing}, `answered the save point with "ping"`, false},
		{"short seed", &guestwire.Message{Type: guestwire.TypeWake, Wake: &guestwire.Wake{Seed: seed[:8]}}, "wake seed of 8 bytes", false},
		{"no payload", &guestwire.Message{Type: guestwire.TypeWake}, "no wake payload", false},
		{"silent host", nil, "waiting for the host's wake", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port, sent := fakeWakeHost(t, tc.reply)
			var gotSeed []byte
			var gotClock time.Time
			hooks := wakeHooks{
				addEntropy: func(s []byte) error { gotSeed = append([]byte(nil), s...); return nil },
				setClock:   func(c time.Time) error { gotClock = c; return nil },
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			w, err := wakeHandshake(ctx, port, hooks)
			if m, ok := <-sent; !ok || m.Type != guestwire.TypeSavePoint {
				t.Fatalf("the host got %+v (ok %v), want a save_point", m, ok)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error naming %q", err, tc.wantErr)
				}
				if gotSeed != nil || !gotClock.IsZero() {
					t.Fatal("a refused wake changed the guest")
				}
				if tc.reply == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("a silent host should end in the deadline: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gotSeed, seed) || !bytes.Equal(w.Seed, seed) {
				t.Fatalf("seed %x applied, want %x", gotSeed, seed)
			}
			if tc.wantClock != !gotClock.IsZero() || (tc.wantClock && !gotClock.Equal(clock)) {
				t.Fatalf("clock set to %v, want %v (set: %v)", gotClock, clock, tc.wantClock)
			}
		})
	}
}

func TestWakeAsked(t *testing.T) {
	for cmdline, want := range map[string]bool{
		"console=ttyS0 capsem.wake=1":              true,
		"capsem.wake=1 capsem.wake=0":              false,
		"console=ttyS0":                            false,
		"capsem.wakeup=1":                          false,
		"capsem.wake=0 rdinit=/init capsem.wake=1": true,
	} {
		if got := wakeAsked(cmdline); got != want {
			t.Errorf("wakeAsked(%q) = %v, want %v", cmdline, got, want)
		}
	}
}

// TestClaimIdentity: a root keeps its machine id across boots of its own
// VM, and a root that was another VM's (a clone) gets a new one.
func TestClaimIdentity(t *testing.T) {
	dir := t.TempDir()
	vmIDFile, machineIDFile := filepath.Join(dir, "var/lib/capsem/vm-id"), filepath.Join(dir, "etc/machine-id")
	os.MkdirAll(filepath.Dir(machineIDFile), 0o755)
	log := slog.New(slog.DiscardHandler)
	ensureMachineID(log, machineIDFile)
	first, _ := os.ReadFile(machineIDFile)
	if len(bytes.TrimSpace(first)) != 32 {
		t.Fatalf("machine id %q", first)
	}
	for _, step := range []struct {
		vmID    string
		changes bool
	}{
		{"vm-aaaaaaaaaaaa", false}, // first boot of a root: it is this VM's
		{"vm-aaaaaaaaaaaa", false}, // its next boot
		{"vm-bbbbbbbbbbbb", true},  // a clone's first boot
		{"vm-bbbbbbbbbbbb", false}, // the clone's next boot
	} {
		before, _ := os.ReadFile(machineIDFile)
		if err := claimIdentity(log, vmIDFile, machineIDFile, step.vmID); err != nil {
			t.Fatal(err)
		}
		after, _ := os.ReadFile(machineIDFile)
		if changed := !bytes.Equal(before, after); changed != step.changes {
			t.Errorf("claim by %s: machine id changed %v, want %v (%q -> %q)", step.vmID, changed, step.changes, before, after)
		}
		if len(bytes.TrimSpace(after)) != 32 {
			t.Errorf("machine id %q after claim by %s", after, step.vmID)
		}
		if got, _ := os.ReadFile(vmIDFile); string(got) != step.vmID+"\n" {
			t.Errorf("vm-id file %q after claim by %s", got, step.vmID)
		}
	}
}

// TestSkipToMarker: the marker is found after junk that holds parts of it,
// and nothing after it is consumed.
func TestSkipToMarker(t *testing.T) {
	m := guestwire.WakeMarker
	for _, in := range []string{m, "junk" + m, m[:5] + m, m[:len(m)-2] + m, "\x00\x00" + m, "\x00" + m[:3] + "\x00" + m} {
		r := strings.NewReader(in + "rest")
		if err := skipToMarker(r, m); err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if rest, _ := io.ReadAll(r); string(rest) != "rest" {
			t.Errorf("%q: left %q", in, rest)
		}
	}
	if err := skipToMarker(strings.NewReader(m[:len(m)-1]), m); err == nil {
		t.Error("a cut marker was taken")
	}
}
