package netstack

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/capsem/capsem/core/netpolicy"
)

// A credential's placeholder is what the guest holds instead of the
// secret; sent anywhere but the credential's own header on the credential
// path, it is an attempt to move the credential. Plain HTTP requests are
// checked where their heads are parsed, but a body, an upgraded
// connection or a protocol allowed by address alone is a byte stream: it
// is searched as it is spliced (exfiltrationGuard).

// streamMatcher finds any of a set of patterns in a stream it sees one
// chunk at a time. A pattern split across chunks starts in the last
// len(pattern)-1 bytes of what came before, so those are kept and searched
// together with the start of the next chunk: each chunk costs one search
// of itself and one of that short junction, however long the stream.
type streamMatcher struct {
	tail     []byte // the stream's last bytes: the longest pattern's length - 1
	junction []byte // scratch: tail followed by the chunk's start
}

// next adds chunk to the stream and returns the index of a pattern the
// stream now holds (-1: none). A stream is searched only until its first
// match. Empty patterns match nothing.
func (m *streamMatcher) next(chunk []byte, patterns [][]byte) int {
	longest := 0
	for _, p := range patterns {
		longest = max(longest, len(p))
	}
	keep := max(longest-1, 0)
	if len(m.tail) > 0 && keep > 0 {
		m.junction = append(append(m.junction[:0], m.tail...), chunk[:min(len(chunk), keep)]...)
	}
	found := -1
	for i, p := range patterns {
		if len(p) == 0 {
			continue
		}
		if bytes.Contains(chunk, p) || (len(m.tail) > 0 && bytes.Contains(m.junction, p)) {
			found = i
			break
		}
	}
	if len(chunk) >= keep {
		m.tail = append(m.tail[:0], chunk[len(chunk)-keep:]...)
	} else {
		m.tail = append(m.tail, chunk...)
		if over := len(m.tail) - keep; over > 0 {
			m.tail = append(m.tail[:0], m.tail[over:]...)
		}
	}
	return found
}

var errPlaceholderInStream = errors.New("a credential placeholder in the guest's stream: the connection is cut")

// exfiltrationGuard is the way out of a plaintext splice (plain HTTP, or
// a connection allowed by address, whatever it carries: a placeholder
// turning up in ciphertext is as likely as guessing it). Each chunk is
// searched for the placeholders of the credentials in force before it is
// written; a chunk that completes one is not written: the connection is
// cut and the attempt recorded, as every exfiltration refusal is.
type exfiltrationGuard struct {
	s   *Stack
	up  io.Writer
	cut func() // ends both sides of the connection
	ev  *ConnEvent

	matcher  streamMatcher
	creds    []netpolicy.CredentialRule // whose placeholders patterns hold
	patterns [][]byte
	tripped  bool
}

func (s *Stack) newExfiltrationGuard(up io.Writer, ev *ConnEvent, cut func()) *exfiltrationGuard {
	return &exfiltrationGuard{s: s, up: up, ev: ev, cut: cut}
}

func (g *exfiltrationGuard) Write(p []byte) (int, error) {
	if g.tripped {
		return 0, errPlaceholderInStream
	}
	g.refresh()
	i := g.matcher.next(p, g.patterns)
	if i < 0 {
		return g.up.Write(p)
	}
	g.tripped = true
	g.cut()
	c := g.creds[i]
	over := "over plain HTTP"
	if g.ev.Kind != KindHTTP {
		over = "on a TCP connection allowed by address"
	}
	to := g.ev.Name
	if to == "" {
		to = g.ev.Addr.String()
	}
	v := netpolicy.Verdict{Rule: RuleExfiltration,
		Reason: fmt.Sprintf("the placeholder of %s (credential for %s) was sent %s to %s", c.GuestEnv, c.Host, over, to)}
	g.s.cfg.Recorder.Conn(ConnEvent{Start: time.Now(), Name: g.ev.Name, Addr: g.ev.Addr, Kind: g.ev.Kind, Verdict: v, Owner: g.ev.Owner})
	g.ev.Err = "cut: " + v.Reason
	return 0, errPlaceholderInStream
}

// refresh takes the placeholders of the credentials in force now, so a
// reload applies to the rest of an open connection.
func (g *exfiltrationGuard) refresh() {
	creds := g.s.policy().Credentials()
	same := len(creds) == len(g.creds)
	for i := 0; same && i < len(creds); i++ {
		same = creds[i].Placeholder == g.creds[i].Placeholder
	}
	if same {
		return
	}
	g.creds, g.patterns = creds, g.patterns[:0]
	for _, c := range creds {
		g.patterns = append(g.patterns, []byte(c.Placeholder))
	}
}

// CloseWrite passes the end of the guest's side on.
func (g *exfiltrationGuard) CloseWrite() error {
	if cw, ok := g.up.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
