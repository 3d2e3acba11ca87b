package guestchan

import (
	"encoding/binary"
	"strings"
	"testing"
)

func windowUpdate(flags uint16, id, delta uint32) []byte {
	b := binary.BigEndian.AppendUint16([]byte{0, yamuxTypeWindowUpdate}, flags)
	b = binary.BigEndian.AppendUint32(b, id)
	return binary.BigEndian.AppendUint32(b, delta)
}

func dataHeader(flags uint16, id, length uint32) []byte {
	b := binary.BigEndian.AppendUint16([]byte{0, yamuxTypeData}, flags)
	b = binary.BigEndian.AppendUint32(b, id)
	return binary.BigEndian.AppendUint32(b, length)
}

// grantsOf reads the grant frames waiting in g as id → total delta.
func grantsOf(t *testing.T, g *flowGate) map[uint32]int64 {
	t.Helper()
	out := map[uint32]int64{}
	b := g.takeGrants()
	for len(b) > 0 {
		if len(b) < yamuxHeaderSize || b[1] != yamuxTypeWindowUpdate || binary.BigEndian.Uint16(b[2:]) != 0 {
			t.Fatalf("a grant is not a plain window update: %x", b)
		}
		out[binary.BigEndian.Uint32(b[4:])] += int64(binary.BigEndian.Uint32(b[8:]))
		b = b[yamuxHeaderSize:]
	}
	return out
}

const (
	yamuxFlagACK = 2
	testStream   = 7
	// yamux's grant when it accepts a stream: up to its own window.
	acceptGrant = HostDataWindow - yamuxInitialWindow
)

// TestFlowGate walks one stream the peer opens through the gate.
func TestFlowGate(t *testing.T) {
	type step struct {
		do   string // "in" (the peer's header), "out" (yamux's), "read" n, "raise"
		hdr  []byte
		n    int
		want string // for "in": "" or a part of the error; for "out": "same", "drop" or "delta=N"
		// grants expected after the step (nil: none)
		grants map[uint32]int64
	}
	accept := []step{
		{do: "in", hdr: windowUpdate(yamuxFlagSYN, testStream, 0)},
		{do: "out", hdr: windowUpdate(yamuxFlagACK, testStream, acceptGrant), want: "delta=0"},
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a stream starts at the initial window and may not go past it", append(accept,
			step{do: "in", hdr: dataHeader(0, testStream, HostReceiveWindow)},
			step{do: "in", hdr: dataHeader(0, testStream, 1), want: "past the 0 its receive window allowed"},
		)},
		{"a small read grants nothing yet", append(accept,
			step{do: "in", hdr: dataHeader(0, testStream, HostReceiveWindow)},
			step{do: "read", n: HostReceiveWindow/2 - 1},
		)},
		{"half the window read grants it back", append(accept,
			step{do: "in", hdr: dataHeader(0, testStream, HostReceiveWindow)},
			step{do: "read", n: HostReceiveWindow / 2, grants: map[uint32]int64{testStream: HostReceiveWindow / 2}},
			step{do: "in", hdr: dataHeader(0, testStream, HostReceiveWindow/2)},
			step{do: "in", hdr: dataHeader(0, testStream, 1), want: "past the 0"},
		)},
		{"yamux's own grant is cut to the limit", append(accept,
			step{do: "in", hdr: dataHeader(0, testStream, HostReceiveWindow)},
			step{do: "read", n: HostReceiveWindow/2 - 1},
			step{do: "out", hdr: windowUpdate(0, testStream, 1<<20), want: "delta=131071"},
		)},
		{"a pure grant with nothing to give is dropped", append(accept,
			step{do: "out", hdr: windowUpdate(0, testStream, 1<<20), want: "drop"},
		)},
		{"raised, the stream is granted the data window at once", append(accept,
			step{do: "raise", grants: map[uint32]int64{testStream: acceptGrant}},
			step{do: "in", hdr: dataHeader(0, testStream, HostDataWindow)},
			step{do: "in", hdr: dataHeader(0, testStream, 1), want: "past the 0"},
		)},
		{"raised, yamux's grants pass whole", append(accept,
			step{do: "raise", grants: map[uint32]int64{testStream: acceptGrant}},
			step{do: "in", hdr: dataHeader(0, testStream, HostDataWindow)},
			step{do: "read", n: HostDataWindow / 2},
			step{do: "out", hdr: windowUpdate(0, testStream, HostDataWindow/2), want: "same"},
		)},
		{"a reset from the peer forgets the stream", append(accept,
			step{do: "in", hdr: windowUpdate(yamuxFlagRST, testStream, 0)},
			step{do: "in", hdr: dataHeader(0, testStream, 1<<30)}, // yamux's to refuse now
		)},
		{"a reset from here forgets the stream", append(accept,
			step{do: "out", hdr: windowUpdate(yamuxFlagRST, testStream, 0), want: "same"},
			step{do: "in", hdr: dataHeader(0, testStream, 1<<30)},
		)},
		{"a stream this side opens is followed from its SYN", []step{
			{do: "out", hdr: windowUpdate(yamuxFlagSYN, testStream+1, acceptGrant), want: "delta=0"},
			{do: "in", hdr: dataHeader(0, testStream+1, HostReceiveWindow)},
			{do: "in", hdr: dataHeader(0, testStream+1, 1), want: "past the 0"},
		}},
		{"frames of streams the gate does not follow pass", []step{
			{do: "out", hdr: windowUpdate(0, 99, 12345), want: "same"},
			{do: "in", hdr: dataHeader(0, 99, 1<<30)},
			{do: "out", hdr: []byte{0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9}, want: "same"}, // ping
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFlowGate()
			for i, st := range tc.steps {
				switch st.do {
				case "in":
					err := g.incoming(st.hdr)
					switch {
					case st.want == "" && err != nil:
						t.Fatalf("step %d: %v", i, err)
					case st.want != "" && (err == nil || !strings.Contains(err.Error(), st.want)):
						t.Fatalf("step %d: error %v, want one saying %q", i, err, st.want)
					}
				case "out":
					got := g.outgoing(st.hdr)
					var desc string
					switch {
					case got == nil:
						desc = "drop"
					case string(got) == string(st.hdr):
						desc = "same"
					default:
						if string(got[:8]) != string(st.hdr[:8]) {
							t.Fatalf("step %d: the gate changed more than the grant: %x → %x", i, st.hdr, got)
						}
						desc = "delta=" + itoa(binary.BigEndian.Uint32(got[8:]))
					}
					if desc != st.want {
						t.Fatalf("step %d: %x went out as %s, want %s", i, st.hdr, desc, st.want)
					}
				case "read":
					g.consumed(testStream, st.n)
				case "raise":
					g.raise(testStream)
				}
				got := grantsOf(t, g)
				if len(got) != len(st.grants) {
					t.Fatalf("step %d (%s): grants %v, want %v", i, st.do, got, st.grants)
				}
				for id, d := range st.grants {
					if got[id] != d {
						t.Fatalf("step %d (%s): grants %v, want %v", i, st.do, got, st.grants)
					}
				}
			}
		})
	}
}

func itoa(n uint32) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
		if n == 0 {
			return string(b)
		}
	}
}

// FuzzFlowGate: whatever the peer's frames and yamux's grants, and however
// the stream is read, the gate never lets a stream hold more than its
// limit (received unread plus granted), never grants what yamux did not,
// and never lets data in past what it granted.
func FuzzFlowGate(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 1, 255, 1, 255, 2, 3, 255, 255})
	f.Fuzz(func(t *testing.T, ops []byte) {
		g := newFlowGate()
		const id = 3
		granted := int64(yamuxInitialWindow) // what the peer was told, in all
		yamuxGranted := int64(yamuxInitialWindow)
		var received, read int64
		limit := int64(HostReceiveWindow)
		g.incoming(windowUpdate(yamuxFlagSYN, id, 0))
		for i := 0; i+1 < len(ops); i += 2 {
			arg := int64(ops[i+1]) << 12 // up to ~1 MiB
			switch ops[i] % 4 {
			case 0: // the peer sends, perhaps past its window
				n := min(arg, 1<<20)
				if err := g.incoming(dataHeader(0, id, uint32(n))); err == nil {
					received += n
				} else if received+n <= granted {
					t.Fatalf("data within the grant (%d+%d of %d) refused: %v", received, n, granted, err)
				}
			case 1: // yamux grants
				d := min(arg, HostDataWindow)
				yamuxGranted += d
				if out := g.outgoing(windowUpdate(0, id, uint32(d))); out != nil {
					granted += int64(binary.BigEndian.Uint32(out[8:]))
				}
			case 2: // the application reads
				n := min(arg, received-read)
				read += n
				g.consumed(id, int(n))
			case 3:
				g.raise(id)
				limit = HostDataWindow
			}
			for _, d := range grantsOf(t, g) {
				granted += d
			}
			if received > granted {
				t.Fatalf("%d bytes let in, %d granted", received, granted)
			}
			if granted > yamuxGranted {
				t.Fatalf("%d granted, yamux granted %d", granted, yamuxGranted)
			}
			if held := granted - read; held > limit {
				t.Fatalf("the stream may hold %d bytes (granted %d, read %d), past its limit %d", held, granted, read, limit)
			}
		}
	})
}
