package netstack

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/capsem/capsem/core/netpolicy"
)

// Plain HTTP is read request by request on its way out, not spliced: on a
// keep-alive connection every request must still be allowed and name the
// host the connection was decided for (a later one naming another would
// ride on the first's decision), and none may carry a credential
// placeholder. The bytes go out as the guest sent them; only their framing
// is read.

// maxRequestHead bounds one request's line and headers.
const maxRequestHead = 64 << 10

// requestReadAhead is what the parser may read past a request's head.
const requestReadAhead = 16 << 10

var errRequestHeadTooLong = fmt.Errorf("a request's line and headers are longer than %d bytes", maxRequestHead)

// pulledReader keeps every byte read from r until they are sent, and
// refuses to read more than budget bytes (while a head is parsed).
type pulledReader struct {
	r      io.Reader
	held   []byte
	budget int // < 0: none
}

func (p *pulledReader) Read(b []byte) (int, error) {
	if p.budget == 0 {
		return 0, errRequestHeadTooLong
	}
	if p.budget > 0 && len(b) > p.budget {
		b = b[:p.budget]
	}
	n, err := p.r.Read(b)
	if p.budget > 0 {
		p.budget -= n
	}
	p.held = append(p.held, b[:n]...)
	return n, err
}

// httpRequests carries the guest's requests from src (the first flight,
// then the connection) to up, checking each, until the guest ends its
// side or a request is refused (its own row recorded); it returns the
// bytes sent.
func (s *Stack) httpRequests(up io.Writer, src io.Reader, name string, ev *ConnEvent) int64 {
	pulled := &pulledReader{r: src, budget: -1}
	br := bufio.NewReaderSize(pulled, requestReadAhead)
	var sent int64
	var werr error
	// send forwards what the parser has consumed: everything pulled but
	// what it still buffers.
	send := func() bool {
		n := len(pulled.held) - br.Buffered()
		if n > 0 && werr == nil {
			var w int
			w, werr = up.Write(pulled.held[:n])
			sent += int64(w)
		}
		if n > 0 {
			pulled.held = append(pulled.held[:0], pulled.held[n:]...)
		}
		return werr == nil
	}
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	for i := 0; ; i++ {
		pulled.budget = maxRequestHead + requestReadAhead
		if br.Buffered() == 0 {
			if _, err := br.Peek(1); err != nil {
				return sent // the guest ended its side between requests
			}
		}
		req, err := http.ReadRequest(br)
		pulled.budget = -1
		if err != nil {
			if i > 0 {
				s.refuseRequest(ev, name, i, netpolicy.Verdict{Rule: RuleNoName, Reason: fmt.Sprintf("request %d on the connection is not HTTP: %v", i+1, err)})
			}
			return sent
		}
		if v := s.checkRequest(req, name, i); !v.Allowed {
			s.refuseRequest(ev, req.Host, i, v)
			return sent
		}
		if !send() {
			return sent
		}
		for {
			n, err := req.Body.Read(*buf)
			if n > 0 && !send() {
				return sent
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					return sent
				}
				break
			}
		}
		if !send() {
			return sent
		}
		if upgrade(req) {
			// Another protocol from here on (a WebSocket): its bytes go
			// on as they are, those read ahead first.
			if len(pulled.held) > 0 {
				w, err := up.Write(pulled.held)
				sent += int64(w)
				if err != nil {
					return sent
				}
			}
			return sent + copyHalfNoClose(up, pulled.r)
		}
	}
}

// checkRequest decides the i-th request of a connection decided for name.
func (s *Stack) checkRequest(req *http.Request, name string, i int) netpolicy.Verdict {
	if i == 0 {
		// Decided by the first flight, placeholders included.
		return netpolicy.Verdict{Allowed: true}
	}
	pol := s.policy()
	if c, _, ok := placeholderInRequest(req, pol.Credentials(), nil); ok {
		return netpolicy.Verdict{Rule: RuleExfiltration,
			Reason: fmt.Sprintf("the placeholder of %s (credential for %s) was sent over plain HTTP to %s", c.GuestEnv, c.Host, req.Host)}
	}
	if req.URL.Host != "" || req.Method == http.MethodConnect {
		return netpolicy.Verdict{Rule: RuleNoName, Reason: "an HTTP request in proxy form (absolute URL or CONNECT): the guest's network is not a proxy"}
	}
	host := req.Host
	if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	norm, err := netpolicy.NormalizeHost(host)
	if err != nil || norm != name {
		return netpolicy.Verdict{Rule: RuleNameMismatch,
			Reason: fmt.Sprintf("request %d names %q on a connection decided for %s", i+1, req.Host, name)}
	}
	// A reload since the connection opened applies to its next request.
	return pol.Name(name)
}

// refuseRequest records a refused request of an allowed connection.
func (s *Stack) refuseRequest(ev *ConnEvent, host string, i int, v netpolicy.Verdict) {
	name, err := netpolicy.NormalizeHost(strings.Split(host, ":")[0])
	if err != nil {
		name = host
	}
	s.cfg.Recorder.Conn(ConnEvent{Start: time.Now(), Name: name, Addr: ev.Addr, Kind: KindHTTP, Verdict: v, Owner: ev.Owner})
	ev.Err = fmt.Sprintf("ended at request %d: %s", i+1, v.Reason)
}

// upgrade reports whether a request switches the connection to another
// protocol.
func upgrade(req *http.Request) bool {
	for _, v := range req.Header.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// copyHalfNoClose copies src to dst until src ends.
func copyHalfNoClose(dst io.Writer, src io.Reader) int64 {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	n, _ := io.CopyBuffer(onlyWriter{dst}, onlyReader{src}, *bp)
	return n
}
