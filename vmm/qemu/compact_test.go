package qemu

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// stateBuilder writes a migration stream the way QEMU 7.2 lays one out.
type stateBuilder struct {
	b     []byte
	last  string
	ramID uint32
}

func newStateBuilder(blocks map[string]uint64, order []string) *stateBuilder {
	s := &stateBuilder{ramID: 2}
	s.b = append(s.b, stateMagic...)
	s.b = append(s.b, 0x07, 0, 0, 0, 3, 'q', '3', '5') // configuration
	s.b = append(s.b, sectionStart)
	s.b = binary.BigEndian.AppendUint32(s.b, s.ramID)
	s.b = append(s.b, 3, 'r', 'a', 'm')
	s.b = binary.BigEndian.AppendUint32(s.b, 0) // instance
	s.b = binary.BigEndian.AppendUint32(s.b, 4) // version
	var total uint64
	for _, n := range order {
		total += blocks[n]
	}
	s.b = binary.BigEndian.AppendUint64(s.b, total|ramFlagMemSize)
	for _, n := range order {
		s.b = append(s.b, byte(len(n)))
		s.b = append(s.b, n...)
		s.b = binary.BigEndian.AppendUint64(s.b, blocks[n])
	}
	s.eos()
	return s
}

func (s *stateBuilder) eos() {
	s.b = binary.BigEndian.AppendUint64(s.b, ramFlagEOS)
	s.b = appendFooter(s.b, s.ramID)
}

func (s *stateBuilder) section(typ byte) {
	s.b = append(s.b, typ)
	s.b = binary.BigEndian.AppendUint32(s.b, s.ramID)
}

func (s *stateBuilder) record(block string, addr uint64, zero bool, fill byte) {
	flags := uint64(ramFlagPage)
	if zero {
		flags = ramFlagZero
	}
	if block == s.last {
		flags |= ramFlagContinue
	}
	s.b = binary.BigEndian.AppendUint64(s.b, addr|flags)
	if block != s.last {
		s.b = append(s.b, byte(len(block)))
		s.b = append(s.b, block...)
		s.last = block
	}
	if zero {
		s.b = append(s.b, fill)
	} else {
		s.b = append(s.b, bytes.Repeat([]byte{fill}, pageSize)...)
	}
}

// deviceState stands for the device sections after RAM: opaque bytes.
var deviceState = []byte("\x04\x00\x00\x00\x05\x06timer\x00\x00\x00\x00\x00\x00\x00\x02opaque-device-bytes\x08")

const mib = 1 << 20

// sampleState: pc.ram of 8 MiB whose stretch 0 holds a data page, stretch 1
// only zero records, stretch 2 a page filled with 0xff by a zero record,
// stretch 3 a data page in the END section; pc.bios zero records only.
func sampleState() []byte {
	s := newStateBuilder(map[string]uint64{"pc.ram": 8 * mib, "pc.bios": 64 << 10}, []string{"pc.ram", "pc.bios"})
	s.section(sectionPart)
	s.record("pc.ram", 0, true, 0)
	s.record("pc.ram", 0x1000, false, 0xab)
	s.record("pc.ram", 0x2000, true, 0)
	for a := uint64(2 * mib); a < 2*mib+4*pageSize; a += pageSize {
		s.record("pc.ram", a, true, 0)
	}
	s.record("pc.ram", 4*mib, true, 0xff)
	s.record("pc.ram", 4*mib+pageSize, true, 0)
	s.record("pc.bios", 0, true, 0)
	s.eos()
	s.section(sectionEnd)
	s.record("pc.ram", 6*mib, true, 0)
	s.record("pc.ram", 6*mib+pageSize, false, 0x01)
	s.eos()
	s.b = append(s.b, deviceState...)
	return s.b
}

func TestCompactState(t *testing.T) {
	in := sampleState()
	out, st, err := CompactState(in)
	if err != nil {
		t.Fatal(err)
	}
	// Stretch 1's four zero records go; everything else stays.
	if st.Records != 12 || st.Dropped != 4 {
		t.Fatalf("stats %+v, want 12 records, 4 dropped", st)
	}
	// Four zero records of 9 bytes, and the two RAM sections become one
	// (one section header, end marker and footer fewer: 18 bytes).
	if len(out) != len(in)-4*9-18 {
		t.Fatalf("compacted to %d bytes from %d, want 54 fewer", len(out), len(in))
	}
	if !bytes.HasSuffix(out, deviceState) {
		t.Fatal("the device state after RAM changed")
	}
	ramStart, _, _ := findRAMSection(in)
	if !bytes.Equal(out[:ramStart], in[:ramStart]) {
		t.Fatal("the header and configuration changed")
	}
	// The compacted stream parses and has nothing more to drop.
	again, st2, err := CompactState(out)
	if err != nil || st2.Dropped != 0 || !bytes.Equal(again, out) {
		t.Fatalf("compacting twice: %+v %v (same: %v)", st2, err, bytes.Equal(again, out))
	}
	// The pages with data, the 0xff fill and the firmware block are all there.
	for _, want := range [][]byte{bytes.Repeat([]byte{0xab}, pageSize), bytes.Repeat([]byte{0x01}, pageSize), []byte("pc.bios")} {
		if !bytes.Contains(out, want) {
			t.Fatalf("compacted stream lacks %.20q", want)
		}
	}
}

func TestCompactStateRefuses(t *testing.T) {
	good := sampleState()
	ramStart, _, _ := findRAMSection(good)
	xbzrle := newStateBuilder(map[string]uint64{"pc.ram": 4 * mib}, []string{"pc.ram"})
	xbzrle.section(sectionPart)
	xbzrle.b = binary.BigEndian.AppendUint64(xbzrle.b, 0x40) // an XBZRLE record
	foreign := newStateBuilder(map[string]uint64{"pc.ram": 4 * mib}, []string{"pc.ram"})
	foreign.b = append(foreign.b, sectionPart, 0, 0, 0, 9)
	for name, tc := range map[string]struct {
		in   []byte
		want string
	}{
		"not QEMU":          {[]byte("hello world, this is not a state"), "not a version 3 QEMU migration stream"},
		"no RAM section":    {append(append([]byte{}, stateMagic...), bytes.Repeat([]byte{0}, 64)...), "no RAM section"},
		"truncated":         {good[:len(good)-len(deviceState)-20], "truncated"},
		"unknown record":    {xbzrle.b, "flags 0x40"},
		"foreign section":   {foreign.b, "section 9"},
		"no size":           {append(append([]byte{}, good[:ramStart+17]...), bytes.Repeat([]byte{0}, 16)...), "does not start with its size"},
		"continues nothing": {continuesNothing(), "continues no block"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := CompactState(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	// No prefix of a good stream is mistaken for a whole one.
	for n := 0; n < len(good)-len(deviceState); n += 97 {
		if _, _, err := CompactState(good[:n]); err == nil {
			t.Fatalf("a stream cut at byte %d compacted", n)
		}
	}
}

func continuesNothing() []byte {
	s := newStateBuilder(map[string]uint64{"pc.ram": 4 * mib}, []string{"pc.ram"})
	s.section(sectionPart)
	s.b = binary.BigEndian.AppendUint64(s.b, ramFlagZero|ramFlagContinue)
	s.b = append(s.b, 0)
	return s.b
}

func FuzzCompactState(f *testing.F) {
	f.Add(sampleState())
	f.Add(continuesNothing())
	f.Add([]byte("QEVM\x00\x00\x00\x03"))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, st, err := CompactState(in)
		if err != nil {
			return
		}
		if st.Dropped > st.Records {
			t.Fatalf("stats %+v", st)
		}
		again, st2, err := CompactState(out)
		if err != nil || st2.Dropped != 0 || !bytes.Equal(again, out) {
			t.Fatalf("a compacted stream did not compact to itself: %+v %v", st2, err)
		}
	})
}
