package vmhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capsem/capsem/core/api"
)

// portGuest stands in for the guest behind the stack: port 3000 answers
// "guest got " and what it read once the host's direction ends; port 3002
// holds each connection open, reading, until it ends; every other port
// refuses, as a guest's reset would.
type portGuest struct {
	echo, hold net.Listener
	held       atomic.Int64
}

func newPortGuest(t *testing.T) *portGuest {
	g := &portGuest{}
	for _, ln := range []*net.Listener{&g.echo, &g.hold} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		*ln = l
	}
	serve := func(ln net.Listener, handle func(net.Conn)) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}
	go serve(g.echo, func(c net.Conn) {
		got, _ := io.ReadAll(c)
		c.Write(append([]byte("guest got "), got...))
	})
	go serve(g.hold, func(c net.Conn) {
		g.held.Add(1)
		defer g.held.Add(-1)
		io.Copy(io.Discard, c)
	})
	return g
}

func (g *portGuest) dial(ctx context.Context, port uint16) (net.Conn, error) {
	var d net.Dialer
	switch port {
	case 3000:
		return d.DialContext(ctx, "tcp", g.echo.Addr().String())
	case 3002:
		return d.DialContext(ctx, "tcp", g.hold.Addr().String())
	}
	return nil, fmt.Errorf("dialing guest port %d: %w", port, syscall.ECONNREFUSED)
}

// freePort is a loopback port nothing listens on (a moment ago).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func dialHost(t *testing.T, m api.PortMapping) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", m.Listen(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readAll reads c to its end, failing the test past a deadline: a
// connection the publisher ends must end, not hang.
func readAll(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the host connection: %v (after %q)", err, got)
	}
	return string(got)
}

func TestPublishedPorts(t *testing.T) {
	before := runtime.NumGoroutine()
	g := newPortGuest(t)
	p := newPublisher(g.dial, slog.New(slog.DiscardHandler))
	var evMu sync.Mutex
	var events []inboundEvent
	p.record = func(e inboundEvent) { evMu.Lock(); events = append(events, e); evMu.Unlock() }
	echo, err := p.add(api.PortMapping{Host: freePort(t), Guest: 3000})
	if err != nil {
		t.Fatal(err)
	}
	if echo.Address != api.DefaultPortAddress {
		t.Errorf("published on %q, want loopback unless asked", echo.Address)
	}

	t.Run("a connection before serve waits for it", func(t *testing.T) {
		c := dialHost(t, echo)
		defer c.Close()
		c.Write([]byte("early"))
		c.(*net.TCPConn).CloseWrite()
		time.Sleep(100 * time.Millisecond)
		p.serve()
		if got := readAll(t, c); got != "guest got early" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("bytes both ways, each direction ending apart", func(t *testing.T) {
		c := dialHost(t, echo)
		defer c.Close()
		msg := strings.Repeat("x", 1<<20)
		go func() {
			c.Write([]byte(msg))
			c.(*net.TCPConn).CloseWrite()
		}()
		if got := readAll(t, c); got != "guest got "+msg {
			t.Fatalf("got %d bytes back, want %d", len(got), len("guest got "+msg))
		}
	})
	t.Run("a guest port nobody listens on ends the connection", func(t *testing.T) {
		m, err := p.add(api.PortMapping{Host: freePort(t), Guest: 3001})
		if err != nil {
			t.Fatal(err)
		}
		c := dialHost(t, m)
		defer c.Close()
		if got := readAll(t, c); got != "" {
			t.Fatalf("got %q", got)
		}
	})
	t.Run("a host port published twice", func(t *testing.T) {
		_, err := p.add(api.PortMapping{Address: "127.0.0.1", Host: echo.Host, Guest: 3002})
		want := fmt.Sprintf("host port 127.0.0.1:%d is taken: this VM publishes it already, to guest port 3000", echo.Host)
		if err == nil || err.Error() != want {
			t.Fatalf("%v, want %q", err, want)
		}
	})
	t.Run("a host port another program holds", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		_, err = p.add(api.PortMapping{Host: port, Guest: 3000})
		var taken *PortTakenError
		want := fmt.Sprintf("host port 127.0.0.1:%d is taken: ", port)
		if !errors.As(err, &taken) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("%v, want %q...", err, want)
		}
	})
	t.Run("a bad mapping", func(t *testing.T) {
		if _, err := p.add(api.PortMapping{Address: "::1%lo", Host: 1, Guest: 1}); err == nil || !strings.Contains(err.Error(), "want an IP address") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("a flood of host connections is bounded", func(t *testing.T) {
		hold, err := p.add(api.PortMapping{Host: freePort(t), Guest: 3002})
		if err != nil {
			t.Fatal(err)
		}
		const n = maxConnsPerPort + 64
		conns := make([]net.Conn, 0, n)
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for range n {
			conns = append(conns, dialHost(t, hold))
		}
		// Past the bound a connection is closed at once; the others stay
		// open, each held by the guest.
		var closedCount atomic.Int64
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() {
				c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(make([]byte, 1)); err == io.EOF {
					closedCount.Add(1)
				}
			})
		}
		wg.Wait()
		closed := int(closedCount.Load())
		if closed != n-maxConnsPerPort || g.held.Load() != maxConnsPerPort {
			t.Fatalf("%d of %d closed, %d reached the guest; want %d reached", closed, n, g.held.Load(), maxConnsPerPort)
		}
		evMu.Lock()
		refused := 0
		for _, e := range events {
			if e.port == hold && strings.Contains(e.refused, "connections at once") && strings.HasPrefix(e.peer, "127.0.0.1:") {
				refused++
			}
		}
		evMu.Unlock()
		if refused != n-maxConnsPerPort {
			t.Fatalf("%d refusals recorded, want %d", refused, n-maxConnsPerPort)
		}
		// Those that end give their places back.
		for _, c := range conns[:10] {
			c.Close()
		}
		deadline := time.Now().Add(5 * time.Second)
		for g.held.Load() > maxConnsPerPort-10 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		c := dialHost(t, hold)
		conns = append(conns, c)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			t.Fatal("a connection was refused once the bound had room again")
		}
	})

	evMu.Lock()
	carried := 0
	for _, e := range events {
		if e.port == echo && e.refused == "" && e.err == "" && e.toGuest > 0 && e.fromGuest > 0 {
			carried++
		}
	}
	evMu.Unlock()
	if carried == 0 {
		t.Errorf("no carried connection was recorded with its bytes: %+v", events)
	}
	ports := p.list()
	if len(ports) != 3 || ports[0] != echo {
		t.Errorf("listed %+v", ports)
	}
	// A connection open at the end is ended by close, and close waits for
	// every goroutine.
	open := dialHost(t, echo)
	defer open.Close()
	open.Write([]byte("x"))
	p.close()
	// Ended at once: its end of file, or a reset when the "x" was still
	// unread.
	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := open.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("an open connection after close: read %d bytes, %v", n, err)
	}
	if c, err := net.DialTimeout("tcp", echo.Listen(), time.Second); err == nil {
		c.Close()
		t.Error("the listener still accepts after close")
	}
	if _, err := p.add(api.PortMapping{Host: freePort(t), Guest: 3000}); !errors.Is(err, errPortsClosed) {
		t.Errorf("a port added after close: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+4 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+4 { // the fake guest's own
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after close, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
