package guestchan

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// flowGate gives each stream on the host its own receive window, which
// yamux cannot: yamux runs with HostDataWindow, and the gate passes on the
// window updates it sends only as far as the stream's own limit allows,
// HostReceiveWindow unless the host raised it (RaiseReceiveWindow, for a
// stream that carries data the host asked for). What it holds back it owes
// the peer, and grants as the stream is read. It also refuses data past
// what it granted: the peer sees only the limited window, so a guest that
// sends more breaks the protocol, and the session ends as yamux ends it
// for a window overrun.
//
// So a stream the guest opened and the host did not raise costs the host
// at most HostReceiveWindow, as when yamux ran with that window, and only
// the streams the host itself asked data on (bounded by its own
// requests) may hold HostDataWindow.
//
// The gate sees the frames of both directions: the peer's frame headers
// through the frameReader, before yamux does, and yamux's window updates
// on their way out, in the coalescingConn.
type flowGate struct {
	mu      sync.Mutex
	streams map[uint32]*flow
	// grants are window-update frames the gate can now send: credit it
	// held back before. The session's granter writes them.
	grants []byte
	wake   chan struct{} // has a token when grants is not empty
}

// flow is one stream's receive window as the gate keeps it.
type flow struct {
	limit    int64 // the most the stream may hold, received unread and granted
	credit   int64 // what the peer may still send (as the peer was told)
	buffered int64 // received and not yet read
	owed     int64 // credit yamux granted that the gate has not sent yet
}

// yamuxInitialWindow is the window every yamux stream starts with, in
// both directions, before any window update (yamux's initialStreamWindow).
const yamuxInitialWindow = 256 << 10

// yamuxFlagSYN opens a stream (yamux's spec.md).
const yamuxFlagSYN = 1

func newFlowGate() *flowGate {
	return &flowGate{streams: map[uint32]*flow{}, wake: make(chan struct{}, 1)}
}

// open starts following stream id, at its initial window.
func (g *flowGate) open(id uint32) *flow {
	f := &flow{limit: HostReceiveWindow, credit: yamuxInitialWindow}
	g.streams[id] = f
	return f
}

// incoming follows one of the peer's frame headers, before yamux reads
// it: a new stream starts to be followed, and data must fit the credit the
// peer was given. An error is a protocol violation that ends the session.
func (g *flowGate) incoming(hdr []byte) error {
	typ, flags := hdr[1], binary.BigEndian.Uint16(hdr[2:])
	id, length := binary.BigEndian.Uint32(hdr[4:]), binary.BigEndian.Uint32(hdr[8:])
	if typ != yamuxTypeData && typ != yamuxTypeWindowUpdate {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.streams[id]
	if f == nil && flags&yamuxFlagSYN != 0 {
		// A stream the peer opens (yamux refuses a known id itself).
		f = g.open(id)
	}
	if f == nil {
		return nil // a stream yamux does not know either, or forgot
	}
	if typ == yamuxTypeData && length > 0 {
		if int64(length) > f.credit {
			return fmt.Errorf("guestchan: the peer sent %d bytes on stream %d, past the %d its receive window allowed", length, id, f.credit)
		}
		f.credit -= int64(length)
		f.buffered += int64(length)
	}
	if flags&yamuxFlagRST != 0 {
		delete(g.streams, id)
	}
	return nil
}

// outgoing passes one of yamux's window-update headers on its way out:
// it returns the header to send instead (the same, or its grant cut to
// what the stream's limit allows), or nil when nothing is left to send.
// A stream this side opens starts to be followed here.
func (g *flowGate) outgoing(hdr []byte) []byte {
	if hdr[1] != yamuxTypeWindowUpdate {
		return hdr
	}
	flags := binary.BigEndian.Uint16(hdr[2:])
	id, delta := binary.BigEndian.Uint32(hdr[4:]), binary.BigEndian.Uint32(hdr[8:])
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.streams[id]
	if f == nil && flags&yamuxFlagSYN != 0 {
		f = g.open(id)
	}
	if flags&yamuxFlagRST != 0 {
		delete(g.streams, id)
		return hdr
	}
	if f == nil {
		return hdr // a stream the gate forgot: its grant no longer matters
	}
	f.owed += int64(delta)
	grant := f.grantable()
	f.owed -= grant
	f.credit += grant
	if grant == int64(delta) {
		return hdr
	}
	if grant == 0 && flags == 0 {
		return nil
	}
	out := append([]byte(nil), hdr...)
	binary.BigEndian.PutUint32(out[8:], uint32(grant))
	return out
}

// grantable is how much of what the stream is owed fits its limit now.
func (f *flow) grantable() int64 {
	return max(0, min(f.owed, f.limit-f.credit-f.buffered))
}

// consumed records that n bytes of stream id were read, and grants the
// stream what it is owed once that is worth a frame: half its limit, or
// all it is owed (as yamux grants at half its window).
func (g *flowGate) consumed(id uint32, n int) {
	if n <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.streams[id]
	if f == nil {
		return
	}
	f.buffered = max(0, f.buffered-int64(n))
	g.grantLocked(id, f, false)
}

// raise lets stream id hold HostDataWindow.
func (g *flowGate) raise(id uint32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.streams[id]
	if f == nil || f.limit >= HostDataWindow {
		return
	}
	f.limit = HostDataWindow
	g.grantLocked(id, f, true)
}

func (g *flowGate) grantLocked(id uint32, f *flow, now bool) {
	grant := f.grantable()
	if grant == 0 || (!now && grant < f.owed && grant < f.limit/2) {
		return
	}
	f.owed -= grant
	f.credit += grant
	g.grants = binary.BigEndian.AppendUint16(append(g.grants, 0, yamuxTypeWindowUpdate), 0)
	g.grants = binary.BigEndian.AppendUint32(g.grants, id)
	g.grants = binary.BigEndian.AppendUint32(g.grants, uint32(grant))
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// forget stops following stream id (it was reset or closed here).
func (g *flowGate) forget(id uint32) {
	g.mu.Lock()
	delete(g.streams, id)
	g.mu.Unlock()
}

// takeGrants returns the grant frames waiting to be sent.
func (g *flowGate) takeGrants() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.grants
	g.grants = nil
	return b
}

// following is how many streams the gate follows, for tests.
func (g *flowGate) following() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.streams)
}
