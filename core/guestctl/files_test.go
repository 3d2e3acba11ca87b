package guestctl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capsem/capsem/core/guestchan"
	"github.com/capsem/capsem/core/guestwire"
)

// The tests here drive ReadFileTo and WriteFileFrom against a scripted
// guest that misbehaves on purpose (root in the VM can make the agent say
// and stream anything), and check that the caller gets an error rather
// than a file taken as whole, that the transfer's slot comes back, that a
// transfer left behind is cancelled in the guest, and that no goroutine
// outlives its client.

// fileStreamTimeout is the clients' Options.StreamTimeout here: how long a
// transfer waits for a data stream the guest's answer promised.
const fileStreamTimeout = 300 * time.Millisecond

// checkNoGoroutineLeaks fails t when, after every later cleanup (the
// client's and the channel's), more goroutines run than when it was
// called. Call it first, so its cleanup runs last.
func checkNoGoroutineLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("%d goroutines before the test, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// guestScript is what a test's fake guest sees: the host's requests in
// order, and the cancels the host sent (each already answered ok, as the
// agent does).
type guestScript struct {
	t       *testing.T
	g       *fakeGuest
	c       *Client
	msgs    chan *guestwire.Message
	cancels chan uint64
}

// script connects a client to a fake guest whose control connection is
// read into s.msgs and s.cancels until it closes.
func script(t *testing.T) *guestScript {
	t.Helper()
	c, g, err := connect(t, goodHello(), Options{StreamTimeout: fileStreamTimeout})
	if err != nil {
		t.Fatal(err)
	}
	s := &guestScript{t: t, g: g, c: c, msgs: make(chan *guestwire.Message, 256), cancels: make(chan uint64, 256)}
	go func() {
		defer close(s.msgs)
		for {
			var m guestwire.Message
			if g.r.Read(&m) != nil {
				return
			}
			if m.Type == guestwire.TypeCancel {
				s.cancels <- m.Target
				g.w.Write(&guestwire.Message{Type: guestwire.TypeOK, ID: m.ID})
				continue
			}
			s.msgs <- &m
		}
	}()
	return s
}

// request returns the host's next request, which must be of type typ.
func (s *guestScript) request(typ string) *guestwire.Message {
	select {
	case m, ok := <-s.msgs:
		if !ok {
			s.t.Errorf("the control connection closed while the guest waited for %s", typ)
			return nil
		}
		if m.Type != typ {
			s.t.Errorf("the guest got %q, want %q", m.Type, typ)
		}
		return m
	case <-time.After(5 * time.Second):
		s.t.Errorf("no %s request came", typ)
		return nil
	}
}

// noRequest checks that the host sends nothing more for a while.
func (s *guestScript) noRequest(within time.Duration) {
	select {
	case m := <-s.msgs:
		s.t.Errorf("the guest got %q (id %d), want nothing", m.Type, m.ID)
	case <-time.After(within):
	}
}

// cancelled waits for the host's cancel of request id.
func (s *guestScript) cancelled(id uint64) {
	s.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case target := <-s.cancels:
			if target == id {
				return
			}
		case <-deadline:
			s.t.Errorf("the host never cancelled request %d in the guest", id)
			return
		}
	}
}

// open opens a data stream on port 5005 the way the agent does.
func (s *guestScript) open(id uint64, which string) net.Conn {
	conn, err := s.g.ch.Dial(context.Background(), guestchan.PortExecOutput)
	if err != nil {
		s.t.Errorf("dial the data port: %v", err)
		return nil
	}
	if err := guestwire.WriteStreamHeader(conn, guestwire.StreamHeader{ID: id, Which: which}); err != nil {
		s.t.Errorf("stream header: %v", err)
	}
	return conn
}

// closedByHost checks that the host closes a stream it must not take:
// what the guest wrote on it goes nowhere, and its reads end.
func (s *guestScript) closedByHost(conn net.Conn, what string) {
	if conn == nil {
		return
	}
	defer conn.Close()
	conn.Write([]byte("not part of the file"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		s.t.Errorf("the host kept %s open", what)
	}
}

func (s *guestScript) answer(id uint64, bytes int64) {
	s.g.w.Write(&guestwire.Message{Type: guestwire.TypeFileResult, ID: id, FileResult: &guestwire.FileResult{Bytes: bytes}})
}

func (s *guestScript) refuse(id uint64, code, msg string) {
	s.g.w.Write(&guestwire.Message{Type: guestwire.TypeError, ID: id, Error: guestwire.Errorf(code, "%s", msg)})
}

// transferIdle checks that the client holds no slot and waits for no stream.
func transferIdle(t *testing.T, c *Client) {
	t.Helper()
	c.mu.Lock()
	files := len(c.files)
	c.mu.Unlock()
	if slots := len(c.transfers); slots != 0 || files != 0 {
		t.Errorf("after the transfer returned, %d slots are held and %d transfers wait for a stream", slots, files)
	}
}

// endlessReader yields bytes until stopped; it never ends on its own.
type endlessReader struct{ read atomic.Int64 }

func (r *endlessReader) Read(p []byte) (int, error) {
	r.read.Add(int64(len(p)))
	return len(p), nil
}

// stallingReader yields its first bytes, then blocks until Abandon, as a
// request body from a sender that stopped sending does.
type stallingReader struct {
	first     []byte
	abandoned chan struct{}
	once      sync.Once
	at        time.Time
}

func (r *stallingReader) Read(p []byte) (int, error) {
	if len(r.first) > 0 {
		n := copy(p, r.first)
		r.first = r.first[n:]
		return n, nil
	}
	<-r.abandoned
	return 0, errors.New("the sender was abandoned")
}

func (r *stallingReader) Abandon() {
	r.once.Do(func() {
		r.at = time.Now()
		close(r.abandoned)
	})
}

// failingReader yields some bytes, then fails, as a host file that cannot
// be read does.
type failingReader struct{ left int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, errors.New("disk read error on the host")
	}
	n := min(len(p), r.left)
	r.left -= n
	return n, nil
}

// readChunks reads a file_write data stream as the agent does, checking
// every chunk against the protocol: at most MaxChunk, then the end marker,
// then the end of the stream.
func readChunks(t *testing.T, conn net.Conn) ([]byte, error) {
	var got []byte
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return got, err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			if rest, err := io.ReadAll(conn); err != nil || len(rest) != 0 {
				t.Errorf("after the end marker: %d bytes, %v", len(rest), err)
			}
			return got, nil
		}
		if n > guestwire.MaxChunk {
			t.Errorf("the host sent a chunk of %d bytes, the limit is %d", n, guestwire.MaxChunk)
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(conn, buf); err != nil {
			return got, err
		}
		got = append(got, buf...)
	}
}

func isCode(err error, code string) bool {
	var we *guestwire.Error
	return errors.As(err, &we) && we.Code == code
}

// cappedBuffer is a read's destination that counts what reached it.
type cappedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *cappedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *cappedBuffer) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Len()
}

func (w *cappedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestReadFileFromAHostileGuest: every way a guest can answer a file_read
// wrongly ends in an error for the caller (or, where the guest's stream
// is whole, the right bytes), never a part of a file taken as the whole;
// the slot comes back; a transfer the host leaves is cancelled in the
// guest.
func TestReadFileFromAHostileGuest(t *testing.T) {
	const file = "the whole file"
	cases := []struct {
		name    string
		maxSize int64
		timeout time.Duration // the caller's (5 s when 0)
		guest   func(s *guestScript, id uint64, cancelCaller func())
		check   func(t *testing.T, err error, got *cappedBuffer, took time.Duration)
		cancel  bool // the host must cancel the request in the guest
	}{{
		name: "answers ok but never opens the data stream",
		guest: func(s *guestScript, id uint64, _ func()) {
			s.answer(id, int64(len(file)))
		},
		check: func(t *testing.T, err error, got *cappedBuffer, took time.Duration) {
			if err == nil || !strings.Contains(err.Error(), "did not come within") {
				t.Fatalf("got %v", err)
			}
			if took > fileStreamTimeout+2*time.Second {
				t.Fatalf("gave up after %v, the bound is %v", took, fileStreamTimeout)
			}
		},
	}, {
		name:    "neither answers nor opens the data stream",
		timeout: 200 * time.Millisecond,
		guest:   func(s *guestScript, id uint64, _ func()) {},
		check: func(t *testing.T, err error, got *cappedBuffer, took time.Duration) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("got %v", err)
			}
		},
		cancel: true,
	}, {
		name: "opens streams with an unknown id, a wrong kind and a bad kind first",
		guest: func(s *guestScript, id uint64, _ func()) {
			s.closedByHost(s.open(id+1000, guestwire.StreamFile), "a file stream for an unknown request")
			s.closedByHost(s.open(id, guestwire.StreamStdout), "a stdout stream with a file request's id")
			s.closedByHost(s.open(id, "payload"), "a stream of an unknown kind")
			conn := s.open(id, guestwire.StreamFile)
			conn.Write([]byte(file))
			conn.Close()
			s.answer(id, int64(len(file)))
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if err != nil || got.String() != file {
				t.Fatalf("got %q, %v", got.String(), err)
			}
		},
	}, {
		name: "opens a second stream for the same request",
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			conn.Write([]byte(file[:4]))
			waitFor(s.t, "the host to take the first stream", func() bool {
				s.c.mu.Lock()
				defer s.c.mu.Unlock()
				return s.c.files[id] == nil
			})
			s.closedByHost(s.open(id, guestwire.StreamFile), "a second stream for one transfer")
			conn.Write([]byte(file[4:]))
			conn.Close()
			s.answer(id, int64(len(file)))
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if err != nil || got.String() != file {
				t.Fatalf("got %q, %v", got.String(), err)
			}
		},
	}, {
		name: "answers before its data stream arrives",
		guest: func(s *guestScript, id uint64, _ func()) {
			s.answer(id, int64(len(file)))
			time.Sleep(50 * time.Millisecond)
			conn := s.open(id, guestwire.StreamFile)
			conn.Write([]byte(file))
			conn.Close()
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if err != nil || got.String() != file {
				t.Fatalf("got %q, %v", got.String(), err)
			}
		},
	}, {
		name: "cuts the stream short and counts the whole file",
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			conn.Write([]byte(file[:5]))
			conn.Close()
			s.answer(id, int64(len(file)))
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if err == nil || !strings.Contains(err.Error(), "cut short") {
				t.Fatalf("got %v", err)
			}
		},
	}, {
		name: "sends more bytes than it counts",
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			conn.Write([]byte(file + " and then some"))
			conn.Close()
			s.answer(id, int64(len(file)))
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if err == nil || !strings.Contains(err.Error(), "counted 14 bytes") {
				t.Fatalf("got %v", err)
			}
		},
	}, {
		name:    "sends more than the caller's max size and counts it",
		maxSize: 1000,
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			n, _ := conn.Write(make([]byte, 1000+64<<10))
			conn.Close()
			s.answer(id, int64(n))
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if !isCode(err, guestwire.CodeTooLarge) || got.Len() > 1000 {
				t.Fatalf("%d bytes reached the caller, who asked for at most 1000: %v", got.Len(), err)
			}
		},
		cancel: true,
	}, {
		name:    "streams past the caller's max size without end",
		maxSize: 1000,
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			buf := make([]byte, 64<<10)
			for {
				if _, err := conn.Write(buf); err != nil {
					break
				}
			}
			conn.Close()
			s.refuse(id, guestwire.CodeIO, "the host closed the stream")
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if err == nil || got.Len() > 1000 {
				t.Fatalf("%d bytes reached the caller, who asked for at most 1000: %v", got.Len(), err)
			}
		},
		cancel: true,
	}, {
		name: "refuses before opening the stream",
		guest: func(s *guestScript, id uint64, _ func()) {
			s.refuse(id, guestwire.CodeNotFound, "read /f: no such file or directory")
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if !errors.Is(err, fs.ErrNotExist) || got.Len() != 0 {
				t.Fatalf("got %q, %v", got.String(), err)
			}
		},
	}, {
		name: "fails after streaming part of the file",
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			conn.Write([]byte(file[:5]))
			conn.Close()
			s.refuse(id, guestwire.CodeIO, "read /f: input/output error")
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if !isCode(err, guestwire.CodeIO) {
				t.Fatalf("got %v", err)
			}
		},
	}, {
		name: "streams slowly until the caller gives up",
		guest: func(s *guestScript, id uint64, cancelCaller func()) {
			conn := s.open(id, guestwire.StreamFile)
			defer conn.Close()
			conn.Write([]byte(file[:5]))
			time.Sleep(50 * time.Millisecond)
			cancelCaller()
			// The host closes the stream: the guest's next writes fail.
			conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
			for {
				if _, err := conn.Write([]byte(file)); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						s.t.Errorf("the host kept reading after its caller gave up")
					}
					return
				}
			}
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want the caller's cancellation", err)
			}
		},
		cancel: true,
	}, {
		name: "is given up before it opens the stream",
		guest: func(s *guestScript, id uint64, cancelCaller func()) {
			cancelCaller()
		},
		check: func(t *testing.T, err error, got *cappedBuffer, _ time.Duration) {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v", err)
			}
		},
		cancel: true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkNoGoroutineLeaks(t)
			s := script(t)
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 5 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			guestDone := make(chan struct{})
			go func() {
				defer close(guestDone)
				m := s.request(guestwire.TypeFileRead)
				if m == nil {
					return
				}
				if m.File == nil || m.File.MaxSize != tc.maxSize {
					s.t.Errorf("request %+v", m.File)
				}
				tc.guest(s, m.ID, cancel)
				if tc.cancel {
					s.cancelled(m.ID)
				}
			}()
			got := &cappedBuffer{}
			start := time.Now()
			_, err := s.c.ReadFileTo(ctx, &guestwire.FileRequest{Path: "/f", MaxSize: tc.maxSize}, got)
			took := time.Since(start)
			transferIdle(t, s.c)
			<-guestDone // its checks first: a failure here closes the client
			tc.check(t, err, got, took)
		})
	}
}

// TestWriteFileToAHostileGuest: what the guest does with a file_write's
// data stream and answer ends in the guest's error or a clear one, never
// a transfer taken as done; the host sends only protocol chunks and the
// end marker only for a whole file; the slot comes back.
func TestWriteFileToAHostileGuest(t *testing.T) {
	whole := bytes.Repeat([]byte("0123456789abcdef"), (3*guestwire.MaxChunk)/16+5)
	cases := []struct {
		name   string
		src    func() io.Reader
		guest  func(s *guestScript, id uint64, cancelCaller func())
		check  func(t *testing.T, err error, src io.Reader, took time.Duration)
		cancel bool
	}{{
		name: "reads the whole file",
		src:  func() io.Reader { return bytes.NewReader(whole) },
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			defer conn.Close()
			got, err := readChunks(s.t, conn)
			if err != nil || !bytes.Equal(got, whole) {
				s.t.Errorf("the guest got %d of %d bytes: %v", len(got), len(whole), err)
			}
			s.answer(id, int64(len(got)))
		},
		check: func(t *testing.T, err error, _ io.Reader, _ time.Duration) {
			if err != nil {
				t.Fatal(err)
			}
		},
	}, {
		name: "counts more than it was sent",
		src:  func() io.Reader { return bytes.NewReader(whole) },
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			defer conn.Close()
			got, _ := readChunks(s.t, conn)
			s.answer(id, int64(len(got))+1)
		},
		check: func(t *testing.T, err error, _ io.Reader, _ time.Duration) {
			if err == nil || !strings.Contains(err.Error(), "cut short") {
				t.Fatalf("got %v", err)
			}
		},
	}, {
		name: "refuses before opening the stream",
		src:  func() io.Reader { return bytes.NewReader(whole) },
		guest: func(s *guestScript, id uint64, _ func()) {
			s.refuse(id, guestwire.CodeNoSpace, "write /f: no space left on device")
		},
		check: func(t *testing.T, err error, _ io.Reader, _ time.Duration) {
			if !isCode(err, guestwire.CodeNoSpace) {
				t.Fatalf("got %v", err)
			}
		},
	}, {
		name: "runs out of space after the first chunk",
		src:  func() io.Reader { return new(endlessReader) },
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			var hdr [4]byte
			io.ReadFull(conn, hdr[:])
			io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(hdr[:])))
			s.refuse(id, guestwire.CodeNoSpace, "write /f: no space left on device")
			conn.Close()
		},
		check: func(t *testing.T, err error, _ io.Reader, took time.Duration) {
			if !isCode(err, guestwire.CodeNoSpace) {
				t.Fatalf("got %v", err)
			}
			if took > abandonAfter {
				t.Fatalf("the refusal took %v to reach the caller", took)
			}
		},
	}, {
		name: "refuses while the sender has stalled",
		src: func() io.Reader {
			return &stallingReader{first: whole[:100], abandoned: make(chan struct{})}
		},
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			defer conn.Close()
			var hdr [4]byte
			io.ReadFull(conn, hdr[:])
			s.refuse(id, guestwire.CodeTooLarge, "write /f: more than 100 bytes, the limit")
		},
		check: func(t *testing.T, err error, src io.Reader, took time.Duration) {
			r := src.(*stallingReader)
			if !isCode(err, guestwire.CodeTooLarge) || r.at.IsZero() {
				t.Fatalf("abandoned %v: %v", !r.at.IsZero(), err)
			}
			if took > abandonAfter+2*time.Second {
				t.Fatalf("the refusal took %v to reach the caller", took)
			}
		},
	}, {
		name: "gets a stream cut short when the host's source fails",
		src:  func() io.Reader { return &failingReader{left: guestwire.MaxChunk + 10} },
		guest: func(s *guestScript, id uint64, _ func()) {
			conn := s.open(id, guestwire.StreamFile)
			defer conn.Close()
			got, err := io.ReadAll(guestwire.NewChunkReader(conn))
			if !errors.Is(err, guestwire.ErrTransferCut) {
				s.t.Errorf("the guest read %d bytes and %v, want ErrTransferCut: a cut stream must never look whole", len(got), err)
			}
			s.refuse(id, guestwire.CodeIO, "write /f: the data stream ended before its end marker")
		},
		check: func(t *testing.T, err error, _ io.Reader, _ time.Duration) {
			if err == nil {
				t.Fatal("a write whose source failed succeeded")
			}
		},
		cancel: true,
	}, {
		name: "stops reading and the caller gives up",
		src:  func() io.Reader { return new(endlessReader) },
		guest: func(s *guestScript, id uint64, cancelCaller func()) {
			conn := s.open(id, guestwire.StreamFile)
			defer conn.Close()
			time.Sleep(100 * time.Millisecond) // the host blocks on a full stream
			cancelCaller()
			got, err := io.ReadAll(guestwire.NewChunkReader(conn))
			if !errors.Is(err, guestwire.ErrTransferCut) {
				s.t.Errorf("the guest read %d bytes and %v, want ErrTransferCut: a cancelled write must never look whole", len(got), err)
			}
		},
		check: func(t *testing.T, err error, _ io.Reader, _ time.Duration) {
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want the caller's cancellation", err)
			}
		},
		cancel: true,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkNoGoroutineLeaks(t)
			s := script(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			guestDone := make(chan struct{})
			go func() {
				defer close(guestDone)
				m := s.request(guestwire.TypeFileWrite)
				if m == nil {
					return
				}
				tc.guest(s, m.ID, cancel)
				if tc.cancel {
					s.cancelled(m.ID)
				}
			}()
			src := tc.src()
			start := time.Now()
			_, err := s.c.WriteFileFrom(ctx, &guestwire.FileRequest{Path: "/f"}, src)
			took := time.Since(start)
			transferIdle(t, s.c)
			<-guestDone
			tc.check(t, err, src, took)
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestTransfersBeyondTheSlotsWait: with every slot taken, another transfer
// waits (it is not sent to the guest, which would refuse it), gives up
// with its context, and goes as soon as a slot is free; none is lost.
func TestTransfersBeyondTheSlotsWait(t *testing.T) {
	checkNoGoroutineLeaks(t)
	s := script(t)
	const n = hostFileTransfers + 1
	results := make(chan error, n)
	for range n {
		go func() {
			_, err := s.c.ReadFileTo(context.Background(), &guestwire.FileRequest{Path: "/f"}, io.Discard)
			results <- err
		}()
	}
	var held []uint64
	for range hostFileTransfers {
		held = append(held, s.request(guestwire.TypeFileRead).ID)
	}
	s.noRequest(200 * time.Millisecond)
	if slots := len(s.c.transfers); slots != hostFileTransfers {
		t.Fatalf("%d slots held, want %d", slots, hostFileTransfers)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.c.ReadFileTo(ctx, &guestwire.FileRequest{Path: "/g"}, io.Discard); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "transfer slot") {
		t.Fatalf("a transfer waiting for a slot: %v", err)
	}
	s.refuse(held[0], guestwire.CodeNotFound, "read /f: no such file or directory")
	last := s.request(guestwire.TypeFileRead)
	for _, id := range append(held[1:], last.ID) {
		conn := s.open(id, guestwire.StreamFile)
		conn.Write([]byte("abc"))
		conn.Close()
		s.answer(id, 3)
	}
	var failed int
	for range n {
		select {
		case err := <-results:
			if err != nil {
				failed++
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a transfer never returned")
		}
	}
	if failed != 1 {
		t.Fatalf("%d transfers failed, want the one the guest refused", failed)
	}
	transferIdle(t, s.c)
}

// TestChannelDeathEndsEveryTransfer: when the guest channel dies, every
// transfer returns at once with ErrClosed, whatever it was doing: waiting
// for a slot, for its stream, in the middle of a read or a write, or for
// the answer after its stream ended.
func TestChannelDeathEndsEveryTransfer(t *testing.T) {
	checkNoGoroutineLeaks(t)
	s := script(t)
	type result struct {
		stage string
		err   error
	}
	results := make(chan result, 8)
	read := func(stage string, w io.Writer) {
		go func() {
			_, err := s.c.ReadFileTo(context.Background(), &guestwire.FileRequest{Path: "/" + stage}, w)
			results <- result{stage, err}
		}()
	}
	read("waiting for its stream", io.Discard)
	s.request(guestwire.TypeFileRead)

	firstBytes := make(chan struct{})
	var once sync.Once
	read("in the middle of a read", writerFunc(func(p []byte) (int, error) {
		once.Do(func() { close(firstBytes) })
		return len(p), nil
	}))
	m := s.request(guestwire.TypeFileRead)
	midRead := s.open(m.ID, guestwire.StreamFile)
	midRead.Write([]byte("part of it"))
	<-firstBytes

	src := new(endlessReader)
	go func() {
		_, err := s.c.WriteFileFrom(context.Background(), &guestwire.FileRequest{Path: "/w"}, src)
		results <- result{"in the middle of a write", err}
	}()
	m = s.request(guestwire.TypeFileWrite)
	s.open(m.ID, guestwire.StreamFile) // never read: the host's copy blocks
	waitFor(t, "the write to start", func() bool { return src.read.Load() > 0 })

	read("waiting for the answer", io.Discard)
	m = s.request(guestwire.TypeFileRead)
	ended := s.open(m.ID, guestwire.StreamFile)
	ended.Write([]byte("abc"))
	ended.Close()

	read("waiting for a slot", io.Discard)
	read("waiting for another slot", io.Discard)
	time.Sleep(100 * time.Millisecond) // let every transfer reach its stage

	s.g.ch.Close()
	for range 6 {
		select {
		case r := <-results:
			if !errors.Is(r.err, ErrClosed) {
				t.Errorf("a transfer %s: %v, want ErrClosed", r.stage, r.err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("a transfer outlived the channel")
		}
	}
	transferIdle(t, s.c)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
