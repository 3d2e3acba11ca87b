package guestctl

import (
	"context"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestctl/memchan"
	"github.com/capsem/capsem/core/guestwire"
)

// TestAcceptAgainAfterAHeartbeatLapse: a client whose guest missed its
// heartbeat frees its ports once closed, so the host accepts the agent's
// next control connection on the same channel, and that one serves.
func TestAcceptAgainAfterAHeartbeatLapse(t *testing.T) {
	host, guest := memchan.Pair()
	t.Cleanup(func() { host.Close() })
	opts := Options{Log: quiet, HeartbeatInterval: 20 * time.Millisecond, HeartbeatTimeout: 50 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	connectGuest := func() *fakeGuest {
		g := &fakeGuest{ch: guest, conn: dialHost(t, guest)}
		g.r, g.w = guestwire.NewReader(g.conn), guestwire.NewWriter(g.conn)
		g.w.Write(goodHello())
		return g
	}
	first := make(chan *fakeGuest, 1)
	go func() { first <- connectGuest() }()
	c, err := Accept(ctx, host, opts)
	if err != nil {
		t.Fatal(err)
	}
	g := <-first
	go g.drain() // stalled: reads, never answers
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("the stalled guest was not noticed")
	}
	c.Close()

	second := make(chan *fakeGuest, 1)
	go func() { second <- connectGuest() }()
	c2, err := Accept(ctx, host, opts)
	if err != nil {
		t.Fatalf("accepting the agent's next connection: %v", err)
	}
	defer c2.Close()
	g2 := <-second
	go func() { // answers every ping until the connection ends
		var m guestwire.Message
		for g2.r.Read(&m) == nil {
			g2.w.Write(&guestwire.Message{Type: guestwire.TypePong, ID: m.ID})
		}
	}()
	if _, err := c2.Ping(ctx); err != nil {
		t.Fatalf("the new connection does not serve: %v", err)
	}
}
