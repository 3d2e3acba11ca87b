package qemu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"time"
)

// CompactState drops, from a saved VM state (QEMU's migration stream, as
// SaveState writes it), the "this page is zero" records of every 2 MiB
// stretch of guest RAM that holds no page with data.
//
// Why: QEMU 7.2 loads a zero record by reading the page to see whether it
// must clear it. On a fresh process every such read faults in memory (here
// with transparent huge pages, a 2 MiB page per stretch), so a restore
// touched all of guest RAM (1 GiB) although about a tenth holds data; on a
// host that hands freed memory back to its own hypervisor (free page
// reporting) that took seconds. A page the stream does not name is left as
// the new process has it: zero, unless QEMU wrote it while it set the
// machine up (the firmware's area, a kernel it loads itself). Records are
// dropped only in stretches with no data page at all, and a stretch QEMU
// writes at set-up holds data in any state saved after a boot (the
// firmware area and the kernel image), so those keep every record.
//
// The RAM section is rewritten (continuation flags and block names
// re-derived); everything before and after it is copied as it is. A
// stream with anything this does not know in the RAM section is an error,
// and the caller keeps the state as it was.
func CompactState(in []byte) ([]byte, CompactStats, error) {
	var st CompactStats
	p := &streamParser{b: in}
	start, ramID, err := findRAMSection(in)
	if err != nil {
		return nil, st, err
	}
	p.off = start
	// Section start: type, id, idstr, instance, version.
	p.byte()
	p.u32()
	p.skip(int(p.byte()))
	p.u32()
	p.u32()
	// The block list: total size with MEM_SIZE, then each block.
	hdr := p.u64()
	if hdr&ramFlagMemSize == 0 {
		return nil, st, fmt.Errorf("qemu state: the RAM section does not start with its size (header %#x)", hdr)
	}
	total := hdr &^ (pageSize - 1)
	for seen := uint64(0); seen < total && p.err == nil; {
		p.skip(int(p.byte()))
		seen += p.u64()
	}
	if p.err != nil {
		return nil, st, p.err
	}
	// Whatever follows the list up to its end-of-section marker
	// (per-block extras some capabilities add) is kept as it is.
	listEnd, err := p.scanToEOS()
	if err != nil {
		return nil, st, err
	}
	if err := p.footer(ramID); err != nil {
		return nil, st, err
	}
	prefixEnd := p.off

	// Pass 1: the page records of every later RAM section, and where the
	// RAM sections end.
	type record struct {
		block string
		addr  uint64
		zero  bool
		data  []byte // the page, or the zero record's fill byte
	}
	var recs []record
	var block string
	ended := false
	for !ended {
		typ := p.byte()
		id := p.u32()
		if p.err != nil {
			return nil, st, p.err
		}
		if id != ramID || (typ != sectionPart && typ != sectionEnd) {
			return nil, st, fmt.Errorf("qemu state: section %d (type %d) inside the RAM sections", id, typ)
		}
		ended = typ == sectionEnd
		for {
			h := p.u64()
			if p.err != nil {
				return nil, st, p.err
			}
			flags, addr := h&(pageSize-1), h&^(pageSize-1)
			if flags == ramFlagEOS {
				break
			}
			if flags&^(ramFlagContinue|ramFlagZero|ramFlagPage) != 0 || (flags&ramFlagZero != 0) == (flags&ramFlagPage != 0) {
				return nil, st, fmt.Errorf("qemu state: RAM record with flags %#x (only zero and whole pages are known)", flags)
			}
			if flags&ramFlagContinue == 0 {
				block = string(p.take(int(p.byte())))
			} else if block == "" {
				return nil, st, errors.New("qemu state: a RAM record continues no block")
			}
			r := record{block: block, addr: addr, zero: flags&ramFlagZero != 0}
			if r.zero {
				r.data = p.take(1)
			} else {
				r.data = p.take(pageSize)
			}
			if p.err != nil {
				return nil, st, p.err
			}
			recs = append(recs, r)
		}
		if err := p.footer(ramID); err != nil {
			return nil, st, err
		}
	}
	suffix := in[p.off:]

	type stretch struct {
		block string
		n     uint64
	}
	withData := map[stretch]bool{}
	for _, r := range recs {
		if !r.zero || r.data[0] != 0 || r.block != mainRAMBlock {
			withData[stretch{r.block, r.addr / stretchSize}] = true
		}
	}

	// Pass 2: one RAM section end with the kept records.
	out := make([]byte, 0, len(in))
	out = append(out, in[:listEnd]...)
	out = binary.BigEndian.AppendUint64(out, ramFlagEOS)
	out = appendFooter(out, ramID)
	if len(out) != prefixEnd {
		return nil, st, errors.New("qemu state: internal error: the RAM section's start did not round-trip")
	}
	out = append(out, sectionEnd)
	out = binary.BigEndian.AppendUint32(out, ramID)
	last := ""
	for _, r := range recs {
		st.Records++
		if r.zero && !withData[stretch{r.block, r.addr / stretchSize}] {
			st.Dropped++
			continue
		}
		flags := uint64(ramFlagPage)
		if r.zero {
			flags = ramFlagZero
		}
		if r.block == last {
			flags |= ramFlagContinue
		}
		out = binary.BigEndian.AppendUint64(out, r.addr|flags)
		if r.block != last {
			out = append(out, byte(len(r.block)))
			out = append(out, r.block...)
			last = r.block
		}
		out = append(out, r.data...)
	}
	out = binary.BigEndian.AppendUint64(out, ramFlagEOS)
	out = appendFooter(out, ramID)
	out = append(out, suffix...)
	st.Stretches = len(withData)
	return out, st, nil
}

// CompactStats says what CompactState did.
type CompactStats struct {
	Records, Dropped int // RAM page records read, and dropped
	Stretches        int // 2 MiB stretches whose records are all kept
}

// Bits of QEMU's migration stream (QEMU 7.2, migration/savevm.c and ram.c).
const (
	pageSize    = 4096
	stretchSize = 2 << 20 // bytes of guest RAM per stretch (a huge page)

	// mainRAMBlock is guest RAM on q35 and pc; records are dropped only
	// there (the small ROM and firmware blocks keep all of theirs).
	mainRAMBlock = "pc.ram"

	sectionStart  = 0x01
	sectionPart   = 0x02
	sectionEnd    = 0x03
	sectionFooter = 0x7e

	ramFlagZero     = 0x02
	ramFlagMemSize  = 0x04
	ramFlagPage     = 0x08
	ramFlagEOS      = 0x10
	ramFlagContinue = 0x20
)

var stateMagic = []byte("QEVM\x00\x00\x00\x03")

// findRAMSection finds the start section of "ram": it comes before any
// device state, right after the header and the configuration.
func findRAMSection(b []byte) (off int, id uint32, err error) {
	if !bytes.HasPrefix(b, stateMagic) {
		return 0, 0, errors.New("qemu state: not a version 3 QEMU migration stream")
	}
	const idstr = "\x03ram"
	// The configuration before it is small; 4 KiB is ample.
	limit := min(len(b), 4096)
	for i := len(stateMagic); i+1+4+len(idstr) <= limit; i++ {
		if b[i] == sectionStart && string(b[i+5:i+5+len(idstr)]) == idstr {
			return i, binary.BigEndian.Uint32(b[i+1:]), nil
		}
	}
	return 0, 0, errors.New("qemu state: no RAM section near the start")
}

func appendFooter(b []byte, id uint32) []byte {
	return binary.BigEndian.AppendUint32(append(b, sectionFooter), id)
}

// streamParser reads big-endian fields; the first short read sets err.
type streamParser struct {
	b   []byte
	off int
	err error
}

func (p *streamParser) take(n int) []byte {
	if p.err != nil {
		return make([]byte, n)
	}
	if n < 0 || p.off+n > len(p.b) {
		p.err = fmt.Errorf("qemu state: truncated at byte %d", p.off)
		return make([]byte, max(n, 0))
	}
	s := p.b[p.off : p.off+n]
	p.off += n
	return s
}

func (p *streamParser) skip(n int)  { p.take(n) }
func (p *streamParser) byte() byte  { return p.take(1)[0] }
func (p *streamParser) u32() uint32 { return binary.BigEndian.Uint32(p.take(4)) }
func (p *streamParser) u64() uint64 { return binary.BigEndian.Uint64(p.take(8)) }

// scanToEOS reads 8-byte words up to the RAM end-of-section marker and
// returns where the marker starts.
func (p *streamParser) scanToEOS() (int, error) {
	for p.err == nil {
		at := p.off
		if p.u64() == ramFlagEOS {
			return at, p.err
		}
	}
	return 0, p.err
}

func (p *streamParser) footer(id uint32) error {
	if p.byte() != sectionFooter || p.u32() != id {
		if p.err != nil {
			return p.err
		}
		return fmt.Errorf("qemu state: no footer for section %d at byte %d", id, p.off)
	}
	return p.err
}

// compactFile rewrites the state SaveState wrote at path without the zero
// records a restore need not read (CompactState): a resumed VM then
// touches the guest RAM that holds data, not all of it. A stream it cannot
// rewrite stays as it is.
func compactFile(log *slog.Logger, path string) {
	if log == nil {
		log = slog.Default()
	}
	t := time.Now()
	in, err := os.ReadFile(path)
	if err != nil {
		log.Warn("reading the saved state to compact it", "err", err)
		return
	}
	out, st, err := CompactState(in)
	if err != nil {
		log.Warn("the saved state stays as QEMU wrote it", "err", err)
		return
	}
	tmp := path + ".compact"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		os.Remove(tmp)
		log.Warn("writing the compacted state", "err", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		log.Warn("replacing the saved state by its compacted form", "err", err)
		return
	}
	log.Info("compacted the saved state", "records", st.Records, "dropped", st.Dropped, "stretches_kept", st.Stretches,
		"bytes", len(out), "ms", time.Since(t).Milliseconds())
	// The two copies of the state (~200 MB) go back to the system now:
	// this process serves its VM for hours.
	in, out = nil, nil
	debug.FreeOSMemory()
}
