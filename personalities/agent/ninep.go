package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// A suspend ends the workspace server the guest's 9P client talks to: the
// restored VM's per-VM process runs a new one, which knows none of the
// client's fids. So that processes keep their working directories and open
// files in the workspace, the agent's relay follows the conversation
// (fidTracker: which fid names which path, opened how) and, once the VM is
// restored, replays it to the new server before the client's next request:
// its version, its attaches, a walk to each fid's path and the open of each
// opened one. The client never learns the server changed. What cannot be
// replayed is dropped, and the client's next use of it fails as a stale
// file handle would: a fid whose file was removed meanwhile, an extended
// attribute fid, a lock.

// 9P2000.L message types the tracker reads (T, and R = T+1).
const (
	p9Rlerror     = 7
	p9Tlopen      = 12
	p9Tlcreate    = 14
	p9Trename     = 20
	p9Txattrwalk  = 30
	p9Txattrcreat = 32
	p9Trenameat   = 74
	p9Tversion    = 100
	p9Tattach     = 104
	p9Tflush      = 108
	p9Twalk       = 110
	p9Tclunk      = 120
	p9Tremove     = 122
)

// p9NoTag is the tag of Tversion; p9ReplayTag the tag of replayed requests
// (none of the client's is in flight then).
const (
	p9NoTag     = 0xFFFF
	p9ReplayTag = 0xFFFE
	// p9MaxWalk is the most names one Twalk may carry.
	p9MaxWalk = 16
	// p9HeaderSize is size[4] type[1] tag[2].
	p9HeaderSize = 7
)

// Open flags that made a file rather than opened it: a replayed open
// leaves them out.
const p9MadeFlags = 0o100 | 0o200 | 0o1000 // O_CREAT | O_EXCL | O_TRUNC

// errP9Short is a message shorter than its fields.
var errP9Short = errors.New("9p: message too short for its fields")

// p9Reader reads a message's fields in order.
type p9Reader struct {
	b   []byte
	err error
}

func (r *p9Reader) take(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.err = errP9Short
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *p9Reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *p9Reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *p9Reader) str() string {
	n := r.u16()
	return string(r.take(int(n)))
}

// p9Message splits a whole message into its type, tag and body.
func p9Message(msg []byte) (typ byte, tag uint16, body []byte, err error) {
	if len(msg) < p9HeaderSize || int(binary.LittleEndian.Uint32(msg)) != len(msg) {
		return 0, 0, nil, fmt.Errorf("9p: a message of %d bytes whose size field says otherwise", len(msg))
	}
	return msg[4], binary.LittleEndian.Uint16(msg[5:]), msg[p9HeaderSize:], nil
}

// readP9Message reads one whole message of at most max bytes into buf
// (grown when too small) and returns it.
func readP9Message(r io.Reader, buf []byte, max int) ([]byte, error) {
	if cap(buf) < 4 {
		buf = make([]byte, 4, 64<<10)
	}
	buf = buf[:4]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	size := int(binary.LittleEndian.Uint32(buf))
	if size < p9HeaderSize || size > max {
		return nil, fmt.Errorf("9p: a message of %d bytes (bounds %d to %d)", size, p9HeaderSize, max)
	}
	if cap(buf) < size {
		buf = append(buf[:4], make([]byte, size-4)...)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf[4:]); err != nil {
		return nil, err
	}
	return buf, nil
}

// trackedFid is what the server knows of one of the client's fids.
type trackedFid struct {
	root  uint32   // the attach fid it was walked from
	path  []string // names from that root
	open  bool
	flags uint32
	// lost: a fid no replay can make again (extended attributes).
	lost bool
}

// p9Request is what a reply needs of its request.
type p9Request struct {
	typ         byte
	fid, newfid uint32
	names       []string
	flags       uint32
	name        string
	dfid        uint32 // Trename's new directory; Trenameat's new directory
	newname     string // Trenameat
	attach      []byte // a Tattach whole, kept to replay
	flushedTag  uint16
}

// fidTracker follows one 9P2000.L connection: every request (Request) and
// every reply (Reply), in the order they pass.
type fidTracker struct {
	version []byte            // the client's Tversion, whole
	attach  map[uint32][]byte // Tattach messages by their fid, whole
	fids    map[uint32]*trackedFid
	pending map[uint16]p9Request
	// broken: a message the tracker could not follow; no replay then.
	broken error
}

func newFidTracker() *fidTracker {
	return &fidTracker{attach: map[uint32][]byte{}, fids: map[uint32]*trackedFid{}, pending: map[uint16]p9Request{}}
}

// Inflight is how many requests await their reply.
func (t *fidTracker) Inflight() int { return len(t.pending) }

func (t *fidTracker) fail(err error) {
	if t.broken == nil {
		t.broken = err
	}
}

// Request notes a request of the client's on its way to the server.
func (t *fidTracker) Request(msg []byte) {
	typ, tag, body, err := p9Message(msg)
	if err != nil {
		t.fail(err)
		return
	}
	r := &p9Reader{b: body}
	req := p9Request{typ: typ}
	switch typ {
	case p9Tversion:
		t.version = slices.Clone(msg)
		// A new session: the server forgets every fid.
		clear(t.fids)
		clear(t.attach)
	case p9Tattach:
		req.fid = r.u32()
		req.attach = slices.Clone(msg)
	case p9Twalk:
		req.fid, req.newfid = r.u32(), r.u32()
		n := r.u16()
		for range n {
			req.names = append(req.names, r.str())
		}
	case p9Tlopen:
		req.fid, req.flags = r.u32(), r.u32()
	case p9Tlcreate:
		req.fid, req.name, req.flags = r.u32(), r.str(), r.u32()
	case p9Trename:
		req.fid, req.dfid, req.name = r.u32(), r.u32(), r.str()
	case p9Trenameat:
		req.fid, req.name, req.dfid, req.newname = r.u32(), r.str(), r.u32(), r.str()
	case p9Txattrwalk:
		req.fid, req.newfid = r.u32(), r.u32()
	case p9Txattrcreat, p9Tclunk, p9Tremove:
		req.fid = r.u32()
	case p9Tflush:
		req.flushedTag = r.u16()
	}
	if r.err != nil {
		t.fail(fmt.Errorf("9p: request type %d: %w", typ, r.err))
	}
	t.pending[tag] = req
}

// Reply notes the server's reply and applies what its request did.
func (t *fidTracker) Reply(msg []byte) {
	typ, tag, body, err := p9Message(msg)
	if err != nil {
		t.fail(err)
		return
	}
	req, ok := t.pending[tag]
	if !ok {
		return // a reply to no request: the client drops it
	}
	delete(t.pending, tag)
	if req.typ == p9Tflush {
		delete(t.pending, req.flushedTag)
	}
	failed := typ == p9Rlerror
	switch req.typ {
	case p9Tclunk, p9Tremove:
		// The fid is gone whatever the answer.
		delete(t.fids, req.fid)
		delete(t.attach, req.fid)
		return
	}
	if failed || typ != req.typ+1 {
		return
	}
	switch req.typ {
	case p9Tattach:
		t.attach[req.fid] = req.attach
		t.fids[req.fid] = &trackedFid{root: req.fid}
	case p9Twalk:
		r := &p9Reader{b: body}
		if nwqid := r.u16(); r.err != nil || int(nwqid) != len(req.names) {
			return // a partial walk makes no fid
		}
		from := t.fids[req.fid]
		if from == nil {
			t.fids[req.newfid] = &trackedFid{lost: true}
			return
		}
		t.fids[req.newfid] = &trackedFid{root: from.root, path: append(slices.Clone(from.path), req.names...), lost: from.lost}
	case p9Tlopen:
		if f := t.fids[req.fid]; f != nil {
			f.open, f.flags = true, req.flags
		}
	case p9Tlcreate:
		if f := t.fids[req.fid]; f != nil {
			f.path = append(slices.Clone(f.path), req.name)
			f.open, f.flags = true, req.flags
		}
	case p9Trename:
		if f, d := t.fids[req.fid], t.fids[req.dfid]; f != nil && d != nil {
			t.moved(f.root, f.path, append(slices.Clone(d.path), req.name))
		}
	case p9Trenameat:
		if from, to := t.fids[req.fid], t.fids[req.dfid]; from != nil && to != nil {
			t.moved(from.root, append(slices.Clone(from.path), req.name), append(slices.Clone(to.path), req.newname))
		}
	case p9Txattrwalk:
		t.fids[req.newfid] = &trackedFid{lost: true}
	case p9Txattrcreat:
		if f := t.fids[req.fid]; f != nil {
			f.lost = true
		}
	}
}

// moved renames every fid at or under from (names from root's attach) to
// the same place under to.
func (t *fidTracker) moved(root uint32, from, to []string) {
	for _, f := range t.fids {
		if f.root == root && len(f.path) >= len(from) && slices.Equal(f.path[:len(from)], from) {
			f.path = append(slices.Clone(to), f.path[len(from):]...)
		}
	}
}

// Replay makes the server at rw, a new one, know the client's fids as the
// last one did: the client's Tversion and attaches, then a walk to each
// fid's path (the shortest first) and the open of each opened one. A fid
// that cannot be made again is forgotten (the client's next use of it
// fails); it returns how many were, and an error only when the server
// cannot be spoken to or refuses the version or an attach.
func (t *fidTracker) Replay(rw io.ReadWriter, max int) (lost int, err error) {
	if t.broken != nil {
		return 0, fmt.Errorf("9p: the conversation was not followed: %w", t.broken)
	}
	if len(t.pending) > 0 {
		return 0, fmt.Errorf("9p: %d requests still await their reply", len(t.pending))
	}
	if t.version == nil {
		return 0, errors.New("9p: the client never said its version")
	}
	buf := make([]byte, 0, 64<<10)
	call := func(msg []byte, want byte) error {
		if _, err := rw.Write(msg); err != nil {
			return err
		}
		reply, err := readP9Message(rw, buf, max)
		if err != nil {
			return err
		}
		typ, _, body, err := p9Message(reply)
		switch {
		case err != nil:
			return err
		case typ == p9Rlerror:
			r := &p9Reader{b: body}
			return fmt.Errorf("9p: errno %d", r.u32())
		case typ != want:
			return fmt.Errorf("9p: a reply of type %d, not %d", typ, want)
		}
		if typ == p9Twalk+1 {
			// Only a whole walk made the fid.
			r := &p9Reader{b: body}
			if n := r.u16(); int(n) != int(binary.LittleEndian.Uint16(msg[p9HeaderSize+8:])) {
				return fmt.Errorf("9p: walked %d names of %d", n, binary.LittleEndian.Uint16(msg[p9HeaderSize+8:]))
			}
		}
		return nil
	}
	if err := call(t.version, p9Tversion+1); err != nil {
		return 0, fmt.Errorf("9p: version: %w", err)
	}
	for _, fid := range slices.Sorted(maps.Keys(t.attach)) {
		if err := call(t.attach[fid], p9Tattach+1); err != nil {
			return 0, fmt.Errorf("9p: attach of fid %d: %w", fid, err)
		}
	}
	fids := slices.Sorted(maps.Keys(t.fids))
	slices.SortStableFunc(fids, func(a, b uint32) int { return len(t.fids[a].path) - len(t.fids[b].path) })
	for _, fid := range fids {
		f := t.fids[fid]
		if _, isRoot := t.attach[fid]; isRoot && f.root == fid && len(f.path) == 0 {
			if f.open {
				if err := call(p9Lopen(fid, f.flags&^p9MadeFlags), p9Tlopen+1); err != nil {
					delete(t.fids, fid)
					lost++
				}
			}
			continue
		}
		err := error(nil)
		if f.lost {
			err = errors.New("not replayable")
		}
		// From the root, then on from the fid itself: at least one walk
		// (of no names, a clone of the root), 16 names at most in each.
		for i, from := 0, f.root; err == nil; i, from = i+p9MaxWalk, fid {
			err = call(p9Walk(from, fid, f.path[i:min(i+p9MaxWalk, len(f.path))]), p9Twalk+1)
			if i+p9MaxWalk >= len(f.path) {
				break
			}
		}
		if err == nil && f.open {
			err = call(p9Lopen(fid, f.flags&^p9MadeFlags), p9Tlopen+1)
		}
		if err != nil {
			delete(t.fids, fid)
			lost++
		}
	}
	return lost, nil
}

// p9Build makes a message of typ with the replay tag and body.
func p9Build(typ byte, body []byte) []byte {
	msg := make([]byte, p9HeaderSize, p9HeaderSize+len(body))
	binary.LittleEndian.PutUint32(msg, uint32(p9HeaderSize+len(body)))
	msg[4] = typ
	binary.LittleEndian.PutUint16(msg[5:], p9ReplayTag)
	return append(msg, body...)
}

func p9Walk(fid, newfid uint32, names []string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, fid)
	b = binary.LittleEndian.AppendUint32(b, newfid)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(names)))
	for _, n := range names {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(n)))
		b = append(b, n...)
	}
	return p9Build(p9Twalk, b)
}

func p9Lopen(fid, flags uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, fid)
	return p9Build(p9Tlopen, binary.LittleEndian.AppendUint32(b, flags))
}

// String describes the tracked fids, for logs and tests.
func (t *fidTracker) String() string {
	var parts []string
	for _, fid := range slices.Sorted(maps.Keys(t.fids)) {
		f := t.fids[fid]
		parts = append(parts, fmt.Sprintf("%d:%d/%s open=%v", fid, f.root, strings.Join(f.path, "/"), f.open))
	}
	return strings.Join(parts, " ")
}
