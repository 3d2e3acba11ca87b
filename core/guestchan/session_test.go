package guestchan

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// testLog writes session logs to the test log, so a failing test shows them.
func testLog(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// socketPair returns two connected AF_UNIX stream sockets, the carrier the
// real host side sees (QEMU's chardev socket).
func socketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("socketpair-%d", i))
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

type carrier func(t testing.TB) (net.Conn, net.Conn)

var carriers = map[string]carrier{
	"pipe":       func(testing.TB) (net.Conn, net.Conn) { return net.Pipe() },
	"socketpair": socketPair,
}

// pair starts a host (server) and guest (client) session over a carrier and
// closes both at the end of the test.
func pair(t testing.TB, c carrier) (host, guest *Session) {
	t.Helper()
	a, b := c(t)
	host, err := Server(a, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	guest, err = Client(b, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		host.Close()
		guest.Close()
	})
	return host, guest
}

// serveEcho accepts on l until it closes, echoing every connection.
func serveEcho(l net.Listener, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
}

// echoOnce dials port, sends payload, half-closes and checks the echo.
func echoOnce(ctx context.Context, ch Channel, port uint32, payload []byte) error {
	c, err := ch.Dial(ctx, port)
	if err != nil {
		return err
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != fmt.Sprintf("guestchan:%d", port) {
		return fmt.Errorf("RemoteAddr %q", got)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		errc <- err
	}()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("port %d: reading echo: %w", port, err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("port %d: write: %w", port, err)
	}
	if !bytes.Equal(got, payload) {
		return fmt.Errorf("port %d: echo differs", port)
	}
	return nil
}

func TestConcurrentStreamsBothDirections(t *testing.T) {
	for name, c := range carriers {
		t.Run(name, func(t *testing.T) {
			host, guest := pair(t, c)
			ports := []uint32{PortControl, PortTerminal, PortMCP, PortEgress, PortExecOutput}
			var servers sync.WaitGroup
			var ls []net.Listener
			for _, side := range []*Session{host, guest} {
				for _, p := range ports {
					l, err := side.Listen(p)
					if err != nil {
						t.Fatal(err)
					}
					if l.Addr().String() != fmt.Sprintf("guestchan:%d", p) {
						t.Fatalf("Addr %v", l.Addr())
					}
					ls = append(ls, l)
					serveEcho(l, &servers)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const perPort = 8
			errs := make(chan error, 2*len(ports)*perPort)
			var clients sync.WaitGroup
			for _, side := range []*Session{host, guest} {
				for _, p := range ports {
					for i := range perPort {
						clients.Add(1)
						go func() {
							defer clients.Done()
							payload := make([]byte, 1+i*37_000) // up to ~260 KB: past one yamux window
							rand.Read(payload)
							errs <- echoOnce(ctx, side, p, payload)
						}()
					}
				}
			}
			clients.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			for _, l := range ls {
				l.Close()
			}
			host.Close()
			guest.Close()
			servers.Wait()
		})
	}
}

func TestDialNoListener(t *testing.T) {
	host, guest := pair(t, socketPair)
	ctx := context.Background()
	_, err := guest.Dial(ctx, 4242)
	if !errors.Is(err, ErrNoListener) {
		t.Fatalf("Dial to an unlistened port: %v, want ErrNoListener", err)
	}
	t.Log(err)
	// The session is unharmed.
	l, err := host.Listen(4242)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	serveEcho(l, &wg)
	if err := echoOnce(ctx, guest, 4242, []byte("after")); err != nil {
		t.Fatal(err)
	}
	l.Close()
	wg.Wait()
}

func TestListenerRules(t *testing.T) {
	host, guest := pair(t, carriers["pipe"])
	l, err := host.Listen(PortControl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := host.Listen(PortControl); !errors.Is(err, ErrPortInUse) {
		t.Fatalf("second Listen: %v, want ErrPortInUse", err)
	}
	// The same port on the other side is a different namespace.
	gl, err := guest.Listen(PortControl)
	if err != nil {
		t.Fatal(err)
	}
	gl.Close()

	// A connection queued but never accepted is closed with its listener.
	ctx := context.Background()
	c, err := guest.Dial(ctx, PortControl)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read on a connection whose listener closed: %d, %v; want EOF", n, err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept on a closed listener: %v, want net.ErrClosed", err)
	}
	// The port is free again.
	l2, err := host.Listen(PortControl)
	if err != nil {
		t.Fatalf("Listen after Close: %v", err)
	}
	l2.Close()
	l.Close() // idempotent, and must not unregister l2's successor
}

// rawPeer gives a test the peer's side as a bare yamux client, to send what
// a correct Session never would.
func rawPeer(t *testing.T) (*Session, *yamux.Session) {
	a, b := socketPair(t)
	host, err := Server(a, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	raw, err := yamux.Client(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		raw.Close()
		host.Close()
	})
	return host, raw
}

func TestBadHeaderClosesOnlyThatStream(t *testing.T) {
	host, raw := rawPeer(t)
	l, err := host.Listen(PortMCP)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	serveEcho(l, &wg)
	defer wg.Wait()
	defer l.Close()

	bad := map[string][]byte{
		"magic":    {'X', 'Y', 1, 0, 0, 0, 0x13, 0x8a},
		"version":  {'C', 'S', 2, 0, 0, 0, 0x13, 0x8a},
		"reserved": {'C', 'S', 1, 7, 0, 0, 0x13, 0x8a},
	}
	for name, hdr := range bad {
		st, err := raw.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		st.Write(hdr)
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		reply, err := io.ReadAll(st)
		if err != nil {
			t.Fatalf("%s: reading the rejection: %v", name, err)
		}
		if len(reply) != ReplySize || reply[3] != replyBadHeader {
			t.Fatalf("%s: reply %q, want a bad-header reply then EOF", name, reply)
		}
		if perr := parseReply(reply, 5002); !errors.Is(perr, ErrBadHeader) {
			t.Fatalf("%s: parseReply: %v", name, perr)
		}
		st.Close()
	}
	// A stream that dies mid-header is dropped too.
	st, _ := raw.OpenStream()
	st.Write([]byte("CS"))
	st.Close()

	// The session still serves good streams, raw or not.
	st, err = raw.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	st.Write(AppendHeader(nil, PortMCP))
	reply := make([]byte, ReplySize)
	if _, err := io.ReadFull(st, reply); err != nil || parseReply(reply, PortMCP) != nil {
		t.Fatalf("good header after bad ones: %q %v", reply, err)
	}
	st.Write([]byte("ping"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(st, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo after bad headers: %q %v", got, err)
	}
	st.Close()
	select {
	case <-host.Done():
		t.Fatal("bad headers closed the whole session")
	default:
	}
}

func TestDialContextCancel(t *testing.T) {
	// The raw peer accepts the stream but never answers the header.
	host, raw := rawPeer(t)
	go func() {
		for {
			st, err := raw.AcceptStream()
			if err != nil {
				return
			}
			_ = st // held open, silent
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := host.Dial(ctx, PortControl)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial with an expiring ctx: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Dial took %v after its ctx expired", d)
	}
	if host.Err() != nil {
		t.Fatalf("a cancelled dial hurt the session: %v", host.Err())
	}
	// Already-cancelled ctx fails before any I/O.
	if _, err := host.Dial(ctx, PortControl); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial with a dead ctx: %v", err)
	}
}

func TestPeerDeath(t *testing.T) {
	// Pending calls on the host: an Accept, and a Dial the silent raw peer
	// never answers. Killing the peer's carrier must fail both at once.
	host, raw := rawPeer(t)
	go func() {
		for {
			if _, err := raw.AcceptStream(); err != nil {
				return
			}
		}
	}()
	l, err := host.Listen(PortControl)
	if err != nil {
		t.Fatal(err)
	}
	acceptErr := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		acceptErr <- err
	}()
	dialErr := make(chan error, 1)
	go func() {
		_, err := host.Dial(context.Background(), PortExecOutput)
		dialErr <- err
	}()
	time.Sleep(100 * time.Millisecond) // let both block
	raw.Close()                        // the guest dies: its end of the carrier closes

	deadline := time.After(5 * time.Second)
	select {
	case <-host.Done():
	case <-deadline:
		t.Fatal("Done not closed after the peer died")
	}
	for name, ch := range map[string]chan error{"Accept": acceptErr, "Dial": dialErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("pending %s: %v, want ErrClosed", name, err)
			}
			t.Logf("pending %s: %v", name, err)
		case <-deadline:
			t.Fatalf("pending %s still blocked after the peer died", name)
		}
	}
	if _, err := host.Dial(context.Background(), PortControl); !errors.Is(err, ErrClosed) {
		t.Errorf("Dial after death: %v", err)
	}
	if _, err := host.Listen(PortTerminal); !errors.Is(err, ErrClosed) {
		t.Errorf("Listen after death: %v", err)
	}
	if err := host.Err(); !errors.Is(err, ErrClosed) {
		t.Errorf("Err after death: %v", err)
	}
}

func TestPeerSessionCloseSeenAsDeath(t *testing.T) {
	host, guest := pair(t, socketPair)
	l, err := guest.Listen(PortTerminal)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := l.Accept(); errc <- err }()
	host.Close()
	select {
	case <-guest.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("guest Done not closed after the host closed")
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("guest Accept: %v", err)
	}
	if err := host.Err(); err == nil || !errors.Is(err, ErrClosed) {
		t.Fatalf("host Err: %v", err)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 3 {
		a, b := socketPair(t)
		host, _ := Server(a, nil)
		guest, _ := Client(b, nil)
		l, _ := host.Listen(PortControl)
		var wg sync.WaitGroup
		serveEcho(l, &wg)
		for range 10 {
			if err := echoOnce(context.Background(), guest, PortControl, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		// Leave one stream open and one Accept pending across Close.
		c, err := guest.Dial(context.Background(), PortControl)
		if err != nil {
			t.Fatal(err)
		}
		gl, _ := guest.Listen(PortMCP)
		go gl.Accept()
		host.Close()
		guest.Close()
		c.Close()
		wg.Wait()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloseIdempotent(t *testing.T) {
	host, guest := pair(t, carriers["pipe"])
	for range 3 {
		if err := host.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := host.Err(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Err: %v", err)
	}
	<-guest.Done()
}

func TestPing(t *testing.T) {
	host, guest := pair(t, socketPair)
	for _, s := range []*Session{host, guest} {
		if _, err := s.Ping(); err != nil {
			t.Fatal(err)
		}
	}
	host.Close()
	if _, err := host.Ping(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
}

// recordingConn records the size of every Write.
type recordingConn struct {
	io.ReadWriteCloser
	mu     sync.Mutex
	writes []int
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, len(p))
	r.mu.Unlock()
	return r.ReadWriteCloser.Write(p)
}

// TestDataFramesAreOneWrite: a yamux data frame reaches the carrier with
// its header and as much of its body as one port write carries in one
// write (which matters on virtio-serial), and the rest of a larger body
// in a write of its own, never copied.
func TestDataFramesAreOneWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   int
		writes []int // the frame's writes, in order
	}{
		{"small", 1000, []int{yamuxHeaderSize + 1000}},
		{"one port write", portWriteMax - yamuxHeaderSize, []int{portWriteMax}},
		{"larger", 100 << 10, []int{portWriteMax, 100<<10 - (portWriteMax - yamuxHeaderSize)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := socketPair(t)
			rec := &recordingConn{ReadWriteCloser: a}
			host, err := Server(rec, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			guest, err := Client(b, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			defer host.Close()
			defer guest.Close()
			l, _ := guest.Listen(PortControl)
			var wg sync.WaitGroup
			serveEcho(l, &wg)
			defer wg.Wait()
			defer l.Close()
			payload := make([]byte, tc.body)
			rand.Read(payload)
			if err := echoOnce(context.Background(), host, PortControl, payload); err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			// The frame's first write is the only one of its size: the
			// stream's header and the window updates are far smaller.
			for i, n := range rec.writes {
				if n != tc.writes[0] {
					continue
				}
				if got := rec.writes[i:min(len(rec.writes), i+len(tc.writes))]; !slices.Equal(got, tc.writes) {
					t.Errorf("a %d-byte body went as writes %v, want %v (all writes %v)", tc.body, got, tc.writes, rec.writes)
				}
				return
			}
			t.Errorf("no %d-byte write (header and the body's start): writes %v", tc.writes[0], rec.writes)
		})
	}
}

// TestReceiveWindows: what one side sends on a stream nobody reads stops
// at the other side's receive window: on the host HostReceiveWindow (the
// bound on what the guest can make it hold), or HostDataWindow for a
// stream the host raised; in the guest the larger GuestReceiveWindow.
func TestReceiveWindows(t *testing.T) {
	host, guest := pair(t, socketPair)
	for _, tc := range []struct {
		name       string
		from, to   *Session
		raise      bool
		wantWindow int
	}{
		{"host to guest", host, guest, false, GuestReceiveWindow},
		{"guest to host", guest, host, false, HostReceiveWindow},
		{"guest to host, raised", guest, host, true, HostDataWindow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.to.Listen(PortMCP)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					close(accepted)
					return
				}
				if tc.raise {
					c.(ReceiveWindowRaiser).RaiseReceiveWindow()
				}
				accepted <- c // and nobody reads it
			}()
			c, err := tc.from.Dial(context.Background(), PortMCP)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if peer := <-accepted; peer != nil {
				defer peer.Close()
			}
			c.SetWriteDeadline(time.Now().Add(time.Second))
			n, err := c.Write(make([]byte, 4*HostDataWindow))
			if err == nil {
				t.Fatalf("a write of %d bytes to a stream nobody reads completed", 4*HostDataWindow)
			}
			// The acceptor has read the stream's header out of the window.
			if want := tc.wantWindow - HeaderSize; n != want {
				t.Errorf("%d bytes went before the write blocked, want %d (the receive window less the stream header)", n, want)
			}
		})
	}
}

// TestBulkThroughWindows: streams moving far more than their window, read
// as they come, neither stall nor lose a byte, whether the host raised
// their window or not (the flow gate grants what it held back as the
// stream is read).
func TestBulkThroughWindows(t *testing.T) {
	host, guest := pair(t, socketPair)
	const size = 8 << 20
	for _, tc := range []struct {
		name     string
		from, to *Session
		raise    bool
	}{
		{"guest to host", guest, host, false},
		{"guest to host, raised", guest, host, true},
		{"host to guest", host, guest, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.to.Listen(PortExecOutput)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			payload := make([]byte, size)
			rand.Read(payload)
			got := make(chan []byte, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					close(got)
					return
				}
				defer c.Close()
				if tc.raise {
					c.(ReceiveWindowRaiser).RaiseReceiveWindow()
				}
				b, _ := io.ReadAll(c)
				got <- b
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := tc.from.Dial(ctx, PortExecOutput)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			if _, err := c.Write(payload); err != nil {
				t.Fatalf("writing %d bytes: %v", size, err)
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
			select {
			case b := <-got:
				if !bytes.Equal(b, payload) {
					t.Fatalf("%d bytes arrived, not the %d sent", len(b), size)
				}
			case <-ctx.Done():
				t.Fatal("the stream stalled")
			}
		})
	}
}
