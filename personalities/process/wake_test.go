package process

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestwire"
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
		var m guestwire.Message
		if err := guestwire.NewReader(guest).Read(&m); err != nil {
			close(got)
			return
		}
		got <- &m
	}()
	return host, got
}

func TestWakeGuest(t *testing.T) {
	point := &guestwire.Message{Type: guestwire.TypeSavePoint}
	t.Run("booted guest: save point, then the work, then the wake", func(t *testing.T) {
		raw, got := fakeGuest(t, point)
		ran := false
		err := wakeGuest(context.Background(), raw, true, func(context.Context) error { ran = true; return nil })
		if err != nil || !ran {
			t.Fatalf("wakeGuest: %v (ran at the point: %v)", err, ran)
		}
		checkWake(t, <-got)
	})
	t.Run("resumed guest: the wake only", func(t *testing.T) {
		raw, got := fakeGuest(t, nil)
		if err := wakeGuest(context.Background(), raw, false, nil); err != nil {
			t.Fatal(err)
		}
		checkWake(t, <-got)
	})
	t.Run("each wake has its own seed", func(t *testing.T) {
		var seeds [][]byte
		for range 2 {
			raw, got := fakeGuest(t, nil)
			if err := wakeGuest(context.Background(), raw, false, nil); err != nil {
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
		err := wakeGuest(context.Background(), raw, true, nil)
		if err == nil || !strings.Contains(err.Error(), `"hello" where its save point belongs`) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("the work at the point fails", func(t *testing.T) {
		raw, got := fakeGuest(t, point)
		err := wakeGuest(context.Background(), raw, true, func(context.Context) error { return context.DeadlineExceeded })
		if err == nil {
			t.Fatal("a failed point went on to wake the guest")
		}
		raw.Close()
		if m := <-got; m != nil {
			t.Fatalf("the guest was woken: %+v", m)
		}
	})
	t.Run("a silent guest", func(t *testing.T) {
		raw, _ := fakeGuest(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := wakeGuest(ctx, raw, true, nil); err == nil || !strings.Contains(err.Error(), "waiting for the guest's save point") {
			t.Fatalf("got %v", err)
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
