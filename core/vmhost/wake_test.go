package vmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestwire"
	"github.com/capsem/capsem/vmm"
)

// fakeGuest plays the agent's side of the wake handshake on a pipe: it
// says first (nil: nothing) and returns the wake it got.
func fakeGuest(t *testing.T, first *guestwire.Message) (net.Conn, <-chan *guestwire.Message) {
	t.Helper()
	host, guest := net.Pipe()
	t.Cleanup(func() { host.Close(); guest.Close() })
	got := make(chan *guestwire.Message, 1)
	go func() {
		if first != nil {
			if err := guestwire.NewWriter(guest).Write(first); err != nil {
				close(got)
				return
			}
		}
		// The marker comes first, whole.
		marker := make([]byte, len(guestwire.WakeMarker))
		if _, err := io.ReadFull(guest, marker); err != nil || string(marker) != guestwire.WakeMarker {
			close(got)
			return
		}
		var m guestwire.Message
		if err := guestwire.NewReader(guest).Read(&m); err != nil {
			close(got)
			return
		}
		got <- &m
	}()
	return host, got
}

func TestSavePointAndWake(t *testing.T) {
	t.Run("resumed guest: the wake only", func(t *testing.T) {
		raw, got := fakeGuest(t, nil)
		if err := sendWake(raw, nil); err != nil {
			t.Fatal(err)
		}
		checkWake(t, <-got)
	})
	t.Run("a suspend's own marker", func(t *testing.T) {
		host, guest := net.Pipe()
		defer host.Close()
		defer guest.Close()
		marker := []byte("a suspend's marker, 16+")
		go sendWake(host, marker)
		got := make([]byte, len(marker))
		if _, err := io.ReadFull(guest, got); err != nil || !bytes.Equal(got, marker) {
			t.Fatalf("the guest read %q first, want the marker %q (%v)", got, marker, err)
		}
		var m guestwire.Message
		if err := guestwire.NewReader(guest).Read(&m); err != nil {
			t.Fatal(err)
		}
		checkWake(t, &m)
	})
	t.Run("each wake has its own seed", func(t *testing.T) {
		var seeds [][]byte
		for range 2 {
			raw, got := fakeGuest(t, nil)
			if err := sendWake(raw, nil); err != nil {
				t.Fatal(err)
			}
			seeds = append(seeds, (<-got).Wake.Seed)
		}
		if bytes.Equal(seeds[0], seeds[1]) {
			t.Fatal("two wakes carried the same seed")
		}
	})
	t.Run("another message where the save point belongs", func(t *testing.T) {
		raw, _ := fakeGuest(t, &guestwire.Message{Type: guestwire.TypeHello, Hello: &guestwire.Hello{}})
		err := readSavePoint(context.Background(), raw)
		if err == nil || !strings.Contains(err.Error(), `"hello" where its save point belongs`) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a silent guest", func(t *testing.T) {
		raw, _ := fakeGuest(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := readSavePoint(ctx, raw); err == nil || !strings.Contains(err.Error(), "waiting for the guest's save point") {
			t.Fatalf("got %v", err)
		}
	})
}

// fakeSaver writes a state file, or fails with err.
type fakeSaver struct{ err error }

func (f fakeSaver) SaveState(_ context.Context, path string) error {
	if f.err != nil {
		return f.err
	}
	return os.WriteFile(path, []byte("not a QEMU stream"), 0o600)
}

// TestWakeHook drives the host side of the handshake the way a machine's
// start does, against a fake guest on a pipe.
func TestWakeHook(t *testing.T) {
	point := &guestwire.Message{Type: guestwire.TypeSavePoint}
	newHook := func(t *testing.T, mode StartMode, saver vmm.StateSaver, checked chan stateCheck) *wakeHook {
		saved, err := newBootState(t.TempDir(), []string{"/bin/sh", "-machine", "q35"}, "/session")
		if err != nil {
			t.Fatal(err)
		}
		v := &VM{log: slog.New(slog.DiscardHandler), timings: map[string]int64{}}
		return &wakeHook{v: v, saver: saver, plan: bootPlan{mode: mode, saved: saved}, checked: checked}
	}
	t.Run("boot and save: saved and published, the guest left at its point", func(t *testing.T) {
		raw, got := fakeGuest(t, point)
		h := newHook(t, ModeBootAndSave, fakeSaver{}, nil)
		if err := h.run(context.Background(), raw); err != nil || !h.saved {
			t.Fatalf("run: %v, saved %v", err, h.saved)
		}
		if _, ok := h.plan.saved.lookup(); !ok {
			t.Fatal("the saved state was not published")
		}
		raw.Close()
		if m := <-got; m != nil {
			t.Fatalf("the guest was woken: %+v", m)
		}
	})
	t.Run("boot and save: a failed save boots on", func(t *testing.T) {
		raw, got := fakeGuest(t, point)
		h := newHook(t, ModeBootAndSave, fakeSaver{err: errors.New("device cannot be saved")}, nil)
		if err := h.run(context.Background(), raw); err != nil || h.saved {
			t.Fatalf("run: %v, saved %v", err, h.saved)
		}
		checkWake(t, <-got)
		if _, ok := h.plan.saved.lookup(); ok {
			t.Fatal("a failed save was published")
		}
	})
	t.Run("boot and save: a VM left paused fails the start", func(t *testing.T) {
		raw, got := fakeGuest(t, point)
		h := newHook(t, ModeBootAndSave, fakeSaver{err: fmt.Errorf("%w: cont failed", vmm.ErrNotResumed)}, nil)
		if err := h.run(context.Background(), raw); !errors.Is(err, vmm.ErrNotResumed) {
			t.Fatalf("run: %v, want ErrNotResumed", err)
		}
		raw.Close()
		if m := <-got; m != nil {
			t.Fatalf("a paused guest was woken: %+v", m)
		}
	})
	t.Run("resume: the wake once the state's hash matched", func(t *testing.T) {
		raw, got := fakeGuest(t, nil)
		checked := make(chan stateCheck, 1)
		checked <- stateCheck{ms: 3}
		h := newHook(t, ModeResume, nil, checked)
		if err := h.run(context.Background(), raw); err != nil {
			t.Fatal(err)
		}
		checkWake(t, <-got)
		if h.v.timings["state_hash"] != 3 {
			t.Errorf("timings %v", h.v.timings)
		}
	})
	t.Run("resume: a state that failed its hash is never woken", func(t *testing.T) {
		raw, got := fakeGuest(t, nil)
		checked := make(chan stateCheck, 1)
		checked <- stateCheck{err: errors.New("sha256 mismatch")}
		h := newHook(t, ModeResume, nil, checked)
		if err := h.run(context.Background(), raw); err == nil || !strings.Contains(err.Error(), "failed verification") {
			t.Fatalf("run: %v", err)
		}
		raw.Close()
		if m := <-got; m != nil {
			t.Fatalf("the guest was woken: %+v", m)
		}
	})
}

func checkWake(t *testing.T, m *guestwire.Message) {
	t.Helper()
	if m == nil || m.Type != guestwire.TypeWake {
		t.Fatalf("the guest got %+v, want a wake", m)
	}
	if err := guestwire.ValidateWake(m.Wake); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(time.Unix(0, m.Wake.ClockUnixNano)); d < 0 || d > 5*time.Second {
		t.Fatalf("the wake's clock is %v off", d)
	}
}
