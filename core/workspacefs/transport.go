package workspacefs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// 9P message types the transport looks at.
const (
	msgRlerror      = 7
	msgTxattrwalk   = 30
	msgRxattrwalk   = 31
	msgTxattrcreate = 32
	msgTversion     = 100
)

const headerLen = 7 // size[4] type[1] tag[2]

// Errors the guest's kernel gets for xattr requests, which the transport
// answers itself (see framedConn).
const (
	errnoENODATA    = 61
	errnoEOPNOTSUPP = 95
)

var errConnClosed = errors.New("workspacefs: connection closed")

// framedConn sits between a guest's byte stream and p9.Server. It reads the
// size[4] prefix of every message in both directions, which lets it:
//
//   - refuse a message outside [7, maxMessage] bytes by closing the
//     connection (the library would allocate up to 4 MiB for one);
//   - stop reading while maxInflight requests are unanswered. The library
//     starts a goroutine per message it has read and holds each message's
//     payload until its reply is sent, so without this a guest that never
//     reads replies makes it hold every request it sends. Every T message
//     the library reads gets exactly one R (errors included); only a
//     request reusing a tag that is still in flight gets none, which no
//     correct client sends: such a client only stalls its own connection;
//   - clamp Tversion's msize to maxMessage, which bounds every reply;
//   - answer Txattrwalk and Txattrcreate itself: the library keeps a
//     Txattrcreate's value in memory up to a size the client names (up to
//     2^64) and answers a failed Txattrwalk with EINVAL, so the guest gets
//     ENODATA (get), an empty list (list) and EOPNOTSUPP (set, remove) from
//     here and the library never sees either message.
type framedConn struct {
	conn        io.ReadWriteCloser
	log         *slog.Logger
	maxMessage  uint32
	maxInflight int

	mu       sync.Mutex
	cond     sync.Cond
	inflight int
	closed   bool
	reason   error

	// Read side: the library reads from one goroutine at a time.
	rhdr  [headerLen + 4]byte
	rpend []byte // header bytes not yet handed to the library
	rleft uint32 // body bytes of the current message not yet handed over
	rbuf  [512]byte
	ended bool // a read error was returned

	// Write side: wmu serializes writes to conn (the library's and
	// inject's); mu guards the bytes left of the reply being written.
	wmu   sync.Mutex
	whdr  [4]byte
	whdrN int
	wleft uint32

	closeOnce atomic.Bool
}

func newFramedConn(conn io.ReadWriteCloser, log *slog.Logger, maxMessage uint32, maxInflight int) *framedConn {
	fc := &framedConn{conn: conn, log: log, maxMessage: maxMessage, maxInflight: maxInflight}
	fc.cond.L = &fc.mu
	return fc
}

// fail closes the connection for reason (the first reason is kept).
func (fc *framedConn) fail(reason error) {
	fc.mu.Lock()
	if fc.reason == nil && reason != nil {
		fc.reason = reason
	}
	fc.mu.Unlock()
	fc.close()
}

func (fc *framedConn) close() {
	if fc.closeOnce.Swap(true) {
		return
	}
	fc.conn.Close() // unblocks a Write in progress

	fc.mu.Lock()
	fc.closed = true
	fc.cond.Broadcast()
	fc.mu.Unlock()
}

// err is why the connection was closed by the transport (nil when the
// peer closed it or it was closed from outside).
func (fc *framedConn) err() error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.reason
}

// endGrace and endWait shape how a connection's end reaches the library.
// p9.Server (v0.3.0) counts a goroutine in the WaitGroup Handle waits on
// only once that goroutine runs (both a newly started receiver and a
// handler looping back to receive), so Handle can return while one is
// still about to start, misusing the WaitGroup. Before the first read
// error is returned, the connection is closed (replies in flight then fail
// at once), every request in flight is waited for (up to endWait: a
// request reusing a tag never gets a reply) and then endGrace passes, so
// those goroutines are back, counted, before the library sees the error.
const (
	endGrace = 20 * time.Millisecond
	endWait  = time.Second
)

func (fc *framedConn) Read(p []byte) (int, error) {
	n, err := fc.read(p)
	if err != nil && !fc.ended {
		fc.ended = true
		fc.close()
		deadline := time.Now().Add(endWait)
		fc.mu.Lock()
		for fc.inflight > 0 && time.Now().Before(deadline) {
			fc.mu.Unlock()
			time.Sleep(time.Millisecond)
			fc.mu.Lock()
		}
		fc.mu.Unlock()
		time.Sleep(endGrace)
	}
	return n, err
}

func (fc *framedConn) read(p []byte) (int, error) {
	if len(fc.rpend) > 0 {
		n := copy(p, fc.rpend)
		fc.rpend = fc.rpend[n:]
		return n, nil
	}
	if fc.rleft > 0 {
		if uint32(len(p)) > fc.rleft {
			p = p[:fc.rleft]
		}
		n, err := fc.conn.Read(p)
		fc.rleft -= uint32(n)
		return n, err
	}
	if err := fc.nextMessage(); err != nil {
		return 0, err
	}
	n := copy(p, fc.rpend)
	fc.rpend = fc.rpend[n:]
	return n, nil
}

// nextMessage waits for room in flight, reads the next message's header
// and either stages it for the library or answers it here.
func (fc *framedConn) nextMessage() error {
	for {
		fc.mu.Lock()
		for fc.inflight >= fc.maxInflight && !fc.closed {
			fc.cond.Wait()
		}
		closed := fc.closed
		fc.mu.Unlock()
		if closed {
			return errConnClosed
		}
		if _, err := io.ReadFull(fc.conn, fc.rhdr[:headerLen]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				fc.fail(fmt.Errorf("9p stream ended inside a message header"))
			}
			return err
		}
		size := binary.LittleEndian.Uint32(fc.rhdr[0:4])
		typ := fc.rhdr[4]
		tag := binary.LittleEndian.Uint16(fc.rhdr[5:7])
		if size < headerLen || size > fc.maxMessage {
			err := fmt.Errorf("9p message of %d bytes (type %d) outside [%d, %d]", size, typ, headerLen, fc.maxMessage)
			fc.log.Warn("workspacefs: closing connection", "reason", err)
			fc.fail(err)
			return err
		}
		body := size - headerLen
		switch typ {
		case msgTxattrwalk, msgTxattrcreate:
			// Txattrwalk: fid[4] newfid[4] name[s]. An empty name asks
			// for the list.
			emptyName := typ == msgTxattrwalk && body == 10
			if err := fc.discard(body); err != nil {
				return err
			}
			var reply []byte
			switch {
			case typ == msgTxattrcreate:
				reply = rlerror(tag, errnoEOPNOTSUPP)
			case emptyName:
				reply = rxattrwalkEmpty(tag)
			default:
				reply = rlerror(tag, errnoENODATA)
			}
			if err := fc.inject(reply); err != nil {
				return err
			}
			continue
		case msgTversion:
			if body < 4 {
				err := fmt.Errorf("9p Tversion of %d bytes", size)
				fc.log.Warn("workspacefs: closing connection", "reason", err)
				fc.fail(err)
				return err
			}
			if _, err := io.ReadFull(fc.conn, fc.rhdr[headerLen:headerLen+4]); err != nil {
				return err
			}
			if binary.LittleEndian.Uint32(fc.rhdr[headerLen:]) > fc.maxMessage {
				binary.LittleEndian.PutUint32(fc.rhdr[headerLen:], fc.maxMessage)
			}
			fc.rpend = fc.rhdr[:headerLen+4]
			fc.rleft = body - 4
		default:
			fc.rpend = fc.rhdr[:headerLen]
			fc.rleft = body
		}
		fc.mu.Lock()
		fc.inflight++
		fc.mu.Unlock()
		return nil
	}
}

func (fc *framedConn) discard(n uint32) error {
	for n > 0 {
		chunk := fc.rbuf[:]
		if uint32(len(chunk)) > n {
			chunk = chunk[:n]
		}
		m, err := io.ReadFull(fc.conn, chunk)
		n -= uint32(m)
		if err != nil {
			return err
		}
	}
	return nil
}

// inject writes a reply of our own between two of the library's replies.
func (fc *framedConn) inject(msg []byte) error {
	for {
		fc.mu.Lock()
		for !fc.atBoundaryLocked() && !fc.closed {
			fc.cond.Wait()
		}
		closed := fc.closed
		fc.mu.Unlock()
		if closed {
			return errConnClosed
		}
		fc.wmu.Lock()
		fc.mu.Lock()
		ok := fc.atBoundaryLocked()
		fc.mu.Unlock()
		if ok {
			// wmu keeps the library from starting a reply meanwhile.
			_, err := fc.conn.Write(msg)
			fc.wmu.Unlock()
			return err
		}
		fc.wmu.Unlock()
	}
}

func (fc *framedConn) atBoundaryLocked() bool { return fc.wleft == 0 && fc.whdrN == 0 }

// Write passes the library's replies through and counts each finished one.
// It does not hold mu while writing, so a peer that reads slowly never
// blocks the reader's in-flight check.
func (fc *framedConn) Write(p []byte) (int, error) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	n, err := fc.conn.Write(p)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.track(p[:n])
	if err != nil && (n == 0 || !fc.atBoundaryLocked()) {
		// The library abandons a reply whose write fails.
		fc.wleft, fc.whdrN = 0, 0
		fc.replied()
	}
	if err != nil && !fc.closed {
		// The peer is gone: wake the reader, which may be waiting for
		// replies that will never be sent.
		fc.closed = true
		fc.cond.Broadcast()
	}
	return n, err
}

// track follows reply boundaries in bytes written; mu held.
func (fc *framedConn) track(p []byte) {
	for len(p) > 0 {
		if fc.wleft == 0 {
			c := copy(fc.whdr[fc.whdrN:], p)
			fc.whdrN += c
			p = p[c:]
			if fc.whdrN < 4 {
				return
			}
			fc.whdrN = 0
			size := binary.LittleEndian.Uint32(fc.whdr[:])
			if size <= 4 {
				fc.replied()
				continue
			}
			fc.wleft = size - 4
			continue
		}
		c := uint32(len(p))
		if c > fc.wleft {
			c = fc.wleft
		}
		fc.wleft -= c
		p = p[c:]
		if fc.wleft == 0 {
			fc.replied()
		}
	}
}

func (fc *framedConn) replied() {
	if fc.inflight > 0 {
		fc.inflight--
	}
	fc.cond.Broadcast()
}

func rlerror(tag uint16, errno uint32) []byte {
	b := make([]byte, headerLen+4)
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)))
	b[4] = msgRlerror
	binary.LittleEndian.PutUint16(b[5:], tag)
	binary.LittleEndian.PutUint32(b[7:], errno)
	return b
}

func rxattrwalkEmpty(tag uint16) []byte {
	b := make([]byte, headerLen+8)
	binary.LittleEndian.PutUint32(b[0:], uint32(len(b)))
	b[4] = msgRxattrwalk
	binary.LittleEndian.PutUint16(b[5:], tag)
	return b
}

// readerEnd and writerEnd give p9.Server.Handle the two halves; closing
// either closes the connection.
type readerEnd struct{ *framedConn }

func (r readerEnd) Close() error { r.close(); return nil }

type writerEnd struct{ *framedConn }

func (w writerEnd) Close() error { w.close(); return nil }
