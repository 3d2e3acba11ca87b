package agent

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// p9Msg builds a message of typ with tag and body.
func p9Msg(typ byte, tag uint16, body []byte) []byte {
	m := p9Build(typ, body)
	binary.LittleEndian.PutUint16(m[5:], tag)
	return m
}

func p9Str(s string) []byte {
	return append(binary.LittleEndian.AppendUint16(nil, uint16(len(s))), s...)
}

func u32s(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// TestFidTrackerFollows: walks, opens, creates, renames, clunks and
// failures move the tracked fids as the server's would.
func TestFidTrackerFollows(t *testing.T) {
	tr := newFidTracker()
	call := func(req, reply []byte) {
		tr.Request(req)
		tr.Reply(reply)
	}
	ok := func(typ byte, tag uint16, body []byte) []byte { return p9Msg(typ+1, tag, body) }
	walk := func(tag uint16, fid, newfid uint32, names ...string) {
		b := append(u32s(fid, newfid), binary.LittleEndian.AppendUint16(nil, uint16(len(names)))...)
		for _, n := range names {
			b = append(b, p9Str(n)...)
		}
		qids := binary.LittleEndian.AppendUint16(nil, uint16(len(names)))
		call(p9Msg(p9Twalk, tag, b), ok(p9Twalk, tag, append(qids, make([]byte, 13*len(names))...)))
	}
	call(p9Msg(p9Tversion, p9NoTag, append(u32s(8192), p9Str("9P2000.L")...)), ok(p9Tversion, p9NoTag, nil))
	call(p9Msg(p9Tattach, 1, append(append(u32s(1, ^uint32(0)), p9Str("root")...), append(p9Str(""), u32s(0)...)...)), ok(p9Tattach, 1, make([]byte, 13)))
	walk(2, 1, 2, "a", "b")
	walk(3, 2, 3, "c")
	call(p9Msg(p9Tlopen, 4, u32s(3, 2)), ok(p9Tlopen, 4, nil))
	walk(5, 2, 4)                                                                                                          // a clone of a/b
	call(p9Msg(p9Tlcreate, 6, append(append(u32s(4), p9Str("new")...), u32s(0o102, 0o644, 0)...)), ok(p9Tlcreate, 6, nil)) // O_CREAT|O_RDWR
	// A walk the server answers in part makes no fid.
	tr.Request(p9Msg(p9Twalk, 7, append(append(u32s(1, 9), 2, 0), append(p9Str("x"), p9Str("y")...)...)))
	tr.Reply(p9Msg(p9Twalk+1, 7, append(binary.LittleEndian.AppendUint16(nil, 1), make([]byte, 13)...)))
	// A failed open opens nothing.
	walk(8, 1, 5, "f")
	tr.Request(p9Msg(p9Tlopen, 9, u32s(5, 0)))
	tr.Reply(p9Msg(p9Rlerror, 9, u32s(13)))
	// a → z: every fid under it follows.
	call(p9Msg(p9Trenameat, 10, append(append(u32s(1), p9Str("a")...), append(u32s(1), p9Str("z")...)...)), ok(p9Trenameat, 10, nil))
	// A clunk that fails still frees the fid.
	tr.Request(p9Msg(p9Tclunk, 11, u32s(5)))
	tr.Reply(p9Msg(p9Rlerror, 11, u32s(9)))
	if got, want := tr.String(), "1:1/ open=false 2:1/z/b open=false 3:1/z/b/c open=true 4:1/z/b/new open=true"; got != want || tr.Inflight() != 0 || tr.broken != nil {
		t.Fatalf("tracked %q (inflight %d, %v), want %q", got, tr.Inflight(), tr.broken, want)
	}
	if f := tr.fids[4]; f.flags != 0o102 {
		t.Errorf("created fid's flags %o", f.flags)
	}

	// The replay: version, attach, walks shortest first, opens without
	// the flags that made the file.
	var sent bytes.Buffer
	server := &scriptedServer{sent: &sent}
	if lost, err := tr.Replay(server, 1<<20); err != nil || lost != 0 {
		t.Fatalf("replay: %d lost, %v", lost, err)
	}
	var types []byte
	var opens []uint32
	for b := sent.Bytes(); len(b) > 0; {
		n := binary.LittleEndian.Uint32(b)
		types = append(types, b[4])
		if b[4] == p9Tlopen {
			opens = append(opens, binary.LittleEndian.Uint32(b[p9HeaderSize+4:]))
		}
		b = b[n:]
	}
	if want := []byte{p9Tversion, p9Tattach, p9Twalk, p9Twalk, p9Tlopen, p9Twalk, p9Tlopen}; !bytes.Equal(types, want) {
		t.Errorf("replayed %v, want %v", types, want)
	}
	// O_RDWR both: the created file's O_CREAT is left out.
	if len(opens) != 2 || opens[0] != 2 || opens[1] != 2 {
		t.Errorf("replayed opens with flags %o", opens)
	}
}

// scriptedServer answers every request with its success reply, a walk
// with as many qids as names.
type scriptedServer struct {
	sent    *bytes.Buffer
	replies bytes.Buffer
}

func (s *scriptedServer) Write(p []byte) (int, error) {
	s.sent.Write(p)
	typ, tag, body, err := p9Message(p)
	if err != nil {
		return 0, err
	}
	var reply []byte
	if typ == p9Twalk {
		n := binary.LittleEndian.Uint16(body[8:])
		reply = append(binary.LittleEndian.AppendUint16(nil, n), make([]byte, 13*int(n))...)
	}
	s.replies.Write(p9Msg(typ+1, tag, reply))
	return len(p), nil
}

func (s *scriptedServer) Read(p []byte) (int, error) { return s.replies.Read(p) }

// FuzzFidTracker feeds the tracker whatever messages the input holds, each
// as a request and as a reply, then replays to a server that answers
// nothing: it must neither panic nor loop.
func FuzzFidTracker(f *testing.F) {
	f.Add(p9Msg(p9Twalk, 1, append(u32s(1, 2), 1, 0, 1, 0, 'a')))
	f.Add(append(p9Msg(p9Tversion, p9NoTag, append(u32s(8192), p9Str("9P2000.L")...)), p9Msg(p9Tversion+1, p9NoTag, nil)...))
	f.Add(p9Msg(p9Trenameat, 3, []byte{1, 0}))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr := newFidTracker()
		for i := 0; len(b) > 0 && i < 200; i++ {
			n := 0
			if len(b) >= 4 {
				n = int(binary.LittleEndian.Uint32(b))
			}
			if n < 4 || n > len(b) {
				n = len(b)
			}
			msg := b[:n]
			b = b[n:]
			if i%2 == 0 {
				tr.Request(msg)
			} else {
				tr.Reply(msg)
			}
		}
		tr.Replay(struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(nil), io.Discard}, 1<<16)
	})
}

// TestReplayWalksDeepPathsInPieces: a path past one walk's 16 names is
// walked from the root, then on from the fid; a clone of the root is one
// walk of no names.
func TestReplayWalksDeepPathsInPieces(t *testing.T) {
	tr := newFidTracker()
	tr.version = p9Msg(p9Tversion, p9NoTag, append(u32s(8192), p9Str("9P2000.L")...))
	tr.attach[1] = p9Msg(p9Tattach, 1, append(append(u32s(1, ^uint32(0)), p9Str("root")...), append(p9Str(""), u32s(0)...)...))
	tr.fids[1] = &trackedFid{root: 1}
	deep := make([]string, 20)
	for i := range deep {
		deep[i] = "d"
	}
	tr.fids[2] = &trackedFid{root: 1, path: deep}
	tr.fids[3] = &trackedFid{root: 1}
	var sent bytes.Buffer
	if lost, err := tr.Replay(&scriptedServer{sent: &sent}, 1<<20); err != nil || lost != 0 {
		t.Fatalf("replay: %d lost, %v", lost, err)
	}
	type walk struct{ fid, newfid, n uint32 }
	var walks []walk
	for b := sent.Bytes(); len(b) > 0; b = b[binary.LittleEndian.Uint32(b):] {
		if b[4] == p9Twalk {
			body := b[p9HeaderSize:]
			walks = append(walks, walk{binary.LittleEndian.Uint32(body), binary.LittleEndian.Uint32(body[4:]), uint32(binary.LittleEndian.Uint16(body[8:]))})
		}
	}
	want := []walk{{1, 3, 0}, {1, 2, 16}, {2, 2, 4}}
	if len(walks) != len(want) {
		t.Fatalf("walks %v, want %v", walks, want)
	}
	for i := range want {
		if walks[i] != want[i] {
			t.Fatalf("walks %v, want %v", walks, want)
		}
	}
}
