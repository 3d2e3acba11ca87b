package httpserve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serve runs New(h, o) on a Unix socket and returns its path.
func serve(t *testing.T, h http.Handler, o Options) (string, *Server) {
	t.Helper()
	dir, err := os.MkdirTemp("", "hs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := New(h, o)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ln)
	}()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return sock, s
}

// client is an HTTP client of the socket that opens a connection per
// request.
func client(sock string) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
}

func routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("POST /echo", func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b)
	})
	// A stream: the body read, then chunks for a while.
	mux.HandleFunc("POST /stream", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		for i := range 5 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(300 * time.Millisecond):
			}
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
		}
	})
	// A terminal: the body read, then the connection taken over and
	// echoed until the client closes it.
	mux.HandleFunc("POST /hijack", func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		c, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		io.Copy(c, rw)
	})
	return mux
}

// slowClient sends text a byte at a time, every gap, until the server
// closes the connection or stop closes; it reports whether the server
// closed it.
func slowClient(sock, text string, gap time.Duration, stop <-chan struct{}) bool {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return true
	}
	defer c.Close()
	for i := 0; ; i++ {
		if _, err := c.Write([]byte{text[i%len(text)]}); err != nil {
			return true
		}
		select {
		case <-stop:
			return false
		case <-time.After(gap):
		}
	}
}

// TestSlowClientsDoNotLockOthersOut attacks as the issue found: slow
// connections, sending their headers or their body a byte at a time, used
// up the service's descriptors. Here 400 of them, each redialing when let
// go, press a server bound to 64 connections: the bound holds, and a client
// asking in the meantime is answered every time.
func TestSlowClientsDoNotLockOthersOut(t *testing.T) {
	sock, s := serve(t, routes(), Options{MaxConns: 64, HeaderTimeout: 2 * time.Second, BodyTimeout: 2 * time.Second, BodyMinRate: 1000})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 400 {
		text := "GET /ok HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("a", 1000) + "\r\n\r\n"
		if i%2 == 1 {
			text = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + strings.Repeat("b", 100000)
		}
		wg.Go(func() {
			for {
				slowClient(sock, text, 50*time.Millisecond, stop)
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	time.Sleep(500 * time.Millisecond) // the attack under way
	cl := client(sock)
	for i := range 5 {
		resp, err := cl.Get("http://x/ok")
		if err != nil {
			t.Fatalf("request %d during the attack: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "ok" {
			t.Fatalf("request %d during the attack: %q", i, b)
		}
		if n := s.conns.len(); n > 64 {
			t.Fatalf("%d connections open, over the bound of 64", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBodyDeadline: a body must come at the minimum rate: a client that
// sends its body slower is cut off once its time is out, and one as slow
// overall but keeping the rate is served, however long its body takes.
func TestBodyDeadline(t *testing.T) {
	sock, _ := serve(t, routes(), Options{BodyTimeout: 300 * time.Millisecond, BodyMinRate: 1000})

	start := time.Now()
	stop := make(chan struct{})
	defer close(stop)
	cut := make(chan bool, 1)
	go func() {
		cut <- slowClient(sock, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("b", 100000), 2*time.Millisecond, stop)
	}()
	select {
	case closed := <-cut:
		// Headers (60 bytes) at 500 B/s, then body bytes at 500 B/s for a
		// deadline of 300 ms plus 1 ms a byte: let go in about 0.6 s.
		if !closed || time.Since(start) > 10*time.Second {
			t.Fatalf("a body sent at half the minimum rate: closed %v after %v", closed, time.Since(start))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a body sent at half the minimum rate was never cut off")
	}

	// 2,000 bytes in 10 pieces 100 ms apart: 1 s in all, over the 300 ms
	// base, at 2,000 B/s.
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n")
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		if _, err := c.Write([]byte(strings.Repeat("c", 200))); err != nil {
			t.Fatalf("a body at twice the minimum rate: %v", err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || len(b) != 2000 {
		t.Fatalf("a body at twice the minimum rate: %d, %d bytes", resp.StatusCode, len(b))
	}
}

// TestLongAnswersOutliveTheDeadlines: a stream answering for longer than
// the header and body deadlines, and a connection taken over (a terminal),
// go on for as long as they need.
func TestLongAnswersOutliveTheDeadlines(t *testing.T) {
	// 1.5 s of answer for deadlines of 1 s.
	sock, _ := serve(t, routes(), Options{HeaderTimeout: time.Second, BodyTimeout: time.Second})
	resp, err := client(sock).Post("http://x/stream", "text/plain", strings.NewReader("go"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || strings.Count(string(b), "chunk") != 5 {
		t.Fatalf("the stream: %q, %v", b, err)
	}

	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /hijack HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\ngo")
	br := bufio.NewReader(c)
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("taking over: %v %v", resp, err)
	}
	for i := range 5 {
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintf(c, "line %d\n", i)
		line, err := br.ReadString('\n')
		if err != nil || line != fmt.Sprintf("line %d\n", i) {
			t.Fatalf("the taken-over connection after %d ms: %q, %v", (i+1)*300, line, err)
		}
	}
}

// TestRoomIsMadeFromWaitingConnections: at the bound, a new connection
// closes the oldest one not yet past its request, never one being answered;
// with every connection being answered, the new one is refused.
func TestRoomIsMadeFromWaitingConnections(t *testing.T) {
	release := make(chan struct{})
	mux := routes()
	mux.HandleFunc("GET /hold", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
	})
	sock, s := serve(t, mux, Options{MaxConns: 4})
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	defer releaseAll()

	// Two connections being answered.
	held := make([]net.Conn, 2)
	for i := range held {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("hold %d: %v", i, err)
		}
		held[i] = c
	}
	// Two waiting with half a request, the first the older.
	waiting := make([]net.Conn, 2)
	for i := range waiting {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /ok HTTP/1.1\r\n")
		waiting[i] = c
		waitFor(t, func() bool { return s.conns.len() == 2+i+1 })
		time.Sleep(10 * time.Millisecond)
	}
	// A fifth closes the older waiting one, and is served.
	resp, err := client(sock).Get("http://x/ok")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !closedByServer(waiting[0]) {
		t.Error("the oldest waiting connection was not closed for room")
	}
	if closedByServer(held[0]) || closedByServer(held[1]) {
		t.Error("a connection being answered was closed for room")
	}

	// With the other two being answered as well, a new connection is
	// refused.
	waitFor(t, func() bool { return s.conns.len() == 3 })
	fmt.Fprintf(waiting[1], "Host: x\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(waiting[1]), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("the younger waiting connection: %v", err)
	}
	waitFor(t, func() bool { return s.conns.inPhase(phaseIdle) == 1 }) // the server is done with it
	for i := range 2 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("hold %d: %v", i+2, err)
		}
	}
	waitFor(t, func() bool { return s.conns.len() <= 4 })
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
	if !closedByServer(c) {
		t.Error("a connection past the bound, all others being answered, was not refused")
	}
	if closedByServer(held[0]) {
		t.Error("a connection being answered was closed")
	}
	releaseAll()
}

// closedByServer reports whether the server closed c: a read gets EOF or
// a reset within a moment, rather than timing out.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 1)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // what the server had answered before
		}
		var ne net.Error
		return !(errors.As(err, &ne) && ne.Timeout())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// inPhase and len tell the table's state to the tests.
func (t *connTable) inPhase(p connPhase) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, info := range t.conns {
		if info.phase == p {
			n++
		}
	}
	return n
}

func (t *connTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.conns)
}

// TestAnsweredTellsStatusAndTime: Answered hears of each request once its
// handler returns, with the status written (200 when none was, the first
// when several were) and the handler's time.
func TestAnsweredTellsStatusAndTime(t *testing.T) {
	type heard struct {
		pattern string
		status  int
		took    time.Duration
	}
	got := make(chan heard, 8)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(150 * time.Millisecond)
		w.WriteHeader(http.StatusTeapot)
		w.WriteHeader(http.StatusInternalServerError) // ignored, as net/http does
	})
	sock, _ := serve(t, mux, Options{Answered: func(r *http.Request, status int, took time.Duration) {
		got <- heard{r.Pattern, status, took}
	}})
	c := client(sock)
	for _, path := range []string{"/ok", "/slow", "/nowhere"} {
		resp, err := c.Get("http://x" + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, want := range []heard{{"GET /ok", 200, 0}, {"GET /slow", http.StatusTeapot, 150 * time.Millisecond}, {"", http.StatusNotFound, 0}} {
		h := <-got
		if h.pattern != want.pattern || h.status != want.status || h.took < want.took {
			t.Errorf("heard %+v, want %+v", h, want)
		}
	}
}
