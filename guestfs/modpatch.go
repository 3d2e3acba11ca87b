package guestfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"strings"
)

// Module code patching, done on the host ahead of the guest kernel.
//
// When a module loads, the kernel rewrites parts of its code before it
// runs. Two of those rewrites dominated module loading under TCG (ftrace
// of the boot: ext4 took 224 ms, 120 ms of it here):
//
//   - Static call sites. A module's calls through static_call() (every
//     tracepoint, and with PREEMPT_DYNAMIC every preempt_enable,
//     cond_resched and might_sleep) are compiled as `call __SCT__<key>`, a
//     call to the key's trampoline. At load the kernel rewrites each site
//     to what the key holds (a direct call, or a NOP when the key is NULL),
//     one site at a time with text_poke_bp: three cross-CPU sync IPIs per
//     site, each stalling the other vCPU's module loading too. It skips a
//     site whose bytes already match. ext4 has 382 sites.
//   - ftrace records. Every function starts with `call __fentry__`; at
//     load ftrace turns each into a NOP and validates it with a symbol
//     lookup that scans the module's whole symbol table (ext4: 854
//     functions × 3,600 symbols).
//
// patchModule writes the same instructions into the file:
//
//   - A static call site gets the instruction its key will hold, where
//     that is known from the files alone: keys the module defines (its
//     tracepoints) start at the target their initialiser names, or NULL;
//     the kernel's preemption keys hold, under Debian's default voluntary
//     preemption, NULL (preempt_schedule, preempt_schedule_notrace) or
//     __cond_resched (cond_resched, might_resched). A direct call is
//     written by retargeting the site's relocation (adding an undefined
//     __cond_resched symbol, and its modversions CRC from the kernel, when
//     the module lacks them); a NOP by writing it and voiding the
//     relocation. Nothing depends on the prediction: the kernel still
//     visits every site and rewrites one that differs, so a wrong guess
//     (another preemption model on the command line) costs only the poke
//     it would have cost anyway. Tail calls and sites in any other shape
//     are left to the kernel.
//   - Every `call __fentry__` becomes the NOP ftrace would write, and the
//     __mcount_loc table is no longer loaded, so ftrace does not know the
//     module's functions. The cost: the function tracer cannot trace
//     module functions in the guest (kprobes still can). Modules whose
//     sites are not all in the expected shape are left whole.
//
// Two more tables are processed at every load and used by nothing a sandbox
// needs; patchModule keeps them from loading (dropTables):
//
//   - The ORC unwind tables (.orc_unwind, .orc_unwind_ip): module_finalize
//     heap-sorts them at every load, through indirect compare and swap
//     calls (ext4: 13,781 entries). The cost: a guest kernel stack trace
//     through module code is marked unreliable (the unwinder falls back to
//     guessing frames, and oopses still list the module's addresses with
//     "?").
//   - The trace event list (_ftrace_events): each event becomes a tracefs
//     directory of files at load (ext4: 113 events, jbd2: 21). The cost:
//     the modules' events are not in tracefs or perf by name; their
//     tracepoints stay, and BPF raw tracepoints still attach.
//
// Measured together (8 interleaved boots each, guest clock, "Run /init" to
// the control connection): median 581 -> 556 ms; summed module load time in
// one boot pair 432 -> 283 ms, ext4 alone 95 -> 58 ms.

// x86-64 instructions and relocation types the patcher reads and writes.
var x86Nop5 = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00} // the kernel's x86_nops[5]

const (
	x86CallOpcode = 0xe8
	rX8664None    = 0
	rX866464      = 1
	rX8664PC32    = 2
	rX8664PLT32   = 4

	elf64SymSize  = 24
	elf64RelaSize = 24
	// struct modversion_info: u64 crc, then a NUL-padded name.
	modversionSize = 64
)

// Flags objtool keeps in the low bits of a static call site's key.
const (
	staticCallSiteTail  = 1
	staticCallSiteFlags = 3
)

// kernelPreemptTargets is what the kernel's own static call keys reached
// by modules hold after a boot with voluntary preemption: "" is NULL.
var kernelPreemptTargets = map[string]string{
	"preempt_schedule":         "",
	"preempt_schedule_notrace": "",
	"cond_resched":             "__cond_resched",
	"might_resched":            "__cond_resched",
}

// moduleStats counts what patchModule did.
type moduleStats struct {
	staticSites, staticDirect, staticNops int
	fentryNops                            int
	unwindTables, eventTables             int // modules whose tables no longer load
}

func (s *moduleStats) add(o moduleStats) {
	s.staticSites += o.staticSites
	s.staticDirect += o.staticDirect
	s.staticNops += o.staticNops
	s.fentryNops += o.fentryNops
	s.unwindTables += o.unwindTables
	s.eventTables += o.eventTables
}

// Load-time tables dropTables stops the kernel from processing (see the
// comment at the top of this file).
const (
	orcUnwindSection   = ".orc_unwind"
	orcUnwindIPSection = ".orc_unwind_ip"
	traceEventsSection = "_ftrace_events"
)

// dropTables keeps the module's ORC unwind tables and its trace event
// list from loading. The kernel's x86 module_finalize finds the ORC pair by
// name whether allocated or not, and would keep pointers into the
// temporary copy of a section that is not allocated, so the pair is also
// renamed to the empty string (offset 0 of the section name table, which
// ELF defines as empty). _ftrace_events is found only as an allocated
// section. Relocations against sections that are not allocated are skipped
// by the loader, so nothing is written into them.
func (m *modFile) dropTables(st *moduleStats) error {
	var orc []int
	unwind, unwindIP := false, false
	for i, sec := range m.f.Sections {
		switch sec.Name {
		case orcUnwindSection:
			unwind = true
			orc = append(orc, i)
		case orcUnwindIPSection:
			unwindIP = true
			orc = append(orc, i)
		case traceEventsSection:
			if sec.Flags&elf.SHF_ALLOC != 0 {
				m.setSectionFlags(i, uint64(sec.Flags&^elf.SHF_ALLOC))
				st.eventTables = 1
			}
		}
	}
	if !unwind || !unwindIP {
		return nil
	}
	shstrndx := int(binary.LittleEndian.Uint16(m.out[0x3e:])) // e_shstrndx
	if shstrndx == 0 || shstrndx >= len(m.f.Sections) {
		return fmt.Errorf("section name table index %d is not one of the %d sections", shstrndx, len(m.f.Sections))
	}
	if names := m.f.Sections[shstrndx]; names.Type != elf.SHT_STRTAB || names.Size == 0 || m.out[names.Offset] != 0 {
		return fmt.Errorf("section name table (section %d) does not start with the empty name", shstrndx)
	}
	for _, i := range orc {
		binary.LittleEndian.PutUint32(m.shdr(i)[0:], 0) // sh_name
		m.setSectionFlags(i, uint64(m.f.Sections[i].Flags&^elf.SHF_ALLOC))
	}
	st.unwindTables = 1
	return nil
}

// rela is one Elf64_Rela entry and where it sits in the file.
type rela struct {
	fileOff uint64
	sym     uint32
	typ     uint32
	addend  int64
}

// modFile is a module being patched: out is the copy being written, f and
// the indexes describe the original layout (appends never move it).
type modFile struct {
	out   []byte
	f     *elf.File
	syms  []elf.Symbol
	relas map[int]map[uint64]rela // target section → offset → entry
	crcs  map[string]uint32
	added map[string]uint32 // undefined symbols added, by name
}

// patchModule returns the module with its static call sites and ftrace
// sites prepatched (data itself when there is nothing to do). crcs are the
// kernel's modversions CRCs by symbol (see kernelCRCs); without one for a
// symbol a site would need, that site is left to the kernel. A module
// whose tables point outside it is an error naming the problem.
func patchModule(data []byte, crcs map[string]uint32) ([]byte, moduleStats, error) {
	var st moduleStats
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, st, err
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_REL {
		return data, st, nil // only x86-64 modules have these sites
	}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_NOBITS && (s.Offset > uint64(len(data)) || s.Size > uint64(len(data))-s.Offset) {
			return nil, st, fmt.Errorf("section %s (%d bytes at %d) runs past the end of the %d-byte file", s.Name, s.Size, s.Offset, len(data))
		}
	}
	m := &modFile{out: bytes.Clone(data), f: f, crcs: crcs, added: map[string]uint32{}}
	if err := m.dropTables(&st); err != nil {
		return nil, st, err
	}
	if f.Section("__mcount_loc") != nil || f.Section(".static_call_sites") != nil {
		if m.syms, err = f.Symbols(); err != nil {
			return nil, st, fmt.Errorf("symbol table: %w", err)
		}
		if m.relas, err = relocations(f, data); err != nil {
			return nil, st, err
		}
		if err := m.nopFentry(&st); err != nil {
			return nil, st, err
		}
		if err := m.prepatchStaticCalls(&st); err != nil {
			return nil, st, err
		}
	}
	if st.fentryNops+st.staticDirect+st.staticNops+st.unwindTables+st.eventTables == 0 {
		return data, st, nil
	}
	return m.out, st, nil
}

// sym returns relocation symbol n (f.Symbols drops the null symbol).
func (m *modFile) sym(n uint32) (elf.Symbol, bool) {
	if n == 0 || int(n) > len(m.syms) {
		return elf.Symbol{}, false
	}
	return m.syms[n-1], true
}

func (m *modFile) section(name string) int {
	for i, s := range m.f.Sections {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// table finds the section of 8-byte entries called name: idx is -1 when
// the module has none.
func (m *modFile) table(name string) (idx int, sec *elf.Section, err error) {
	idx = m.section(name)
	if idx < 0 {
		return -1, nil, nil
	}
	sec = m.f.Sections[idx]
	if sec.Size%8 != 0 {
		return 0, nil, fmt.Errorf("%s is %d bytes, not whole 8-byte entries", name, sec.Size)
	}
	return idx, sec, nil
}

// location resolves symbol + addend to a section index and offset.
func (m *modFile) location(symIdx uint32, addend int64) (int, uint64, bool) {
	s, ok := m.sym(symIdx)
	if !ok || int(s.Section) <= 0 || int(s.Section) >= len(m.f.Sections) {
		return 0, 0, false
	}
	at := int64(s.Value) + addend
	if at < 0 {
		return 0, 0, false
	}
	return int(s.Section), uint64(at), true
}

// callSite checks that sec+off holds `call <rel32>` whose relocation (at
// off+1, PC-relative, addend -4) exists, returning that relocation and the
// instruction's file offset.
func (m *modFile) callSite(sec int, off uint64) (rela, uint64, bool) {
	s := m.f.Sections[sec]
	if s.Type != elf.SHT_PROGBITS || s.Flags&elf.SHF_EXECINSTR == 0 || off > s.Size || s.Size-off < 5 {
		return rela{}, 0, false
	}
	insn := s.Offset + off
	if m.out[insn] != x86CallOpcode {
		return rela{}, 0, false
	}
	r, ok := m.relas[sec][off+1]
	if !ok || (r.typ != rX8664PLT32 && r.typ != rX8664PC32) || r.addend != -4 {
		return rela{}, 0, false
	}
	return r, insn, true
}

func (m *modFile) setRela(r rela, sym, typ uint32) {
	binary.LittleEndian.PutUint64(m.out[r.fileOff+8:], uint64(sym)<<32|uint64(typ))
}

// writeNop replaces the call at insn with a NOP and voids its relocation.
func (m *modFile) writeNop(insn uint64, r rela) {
	copy(m.out[insn:], x86Nop5)
	m.setRela(r, r.sym, rX8664None)
}

// nopFentry turns every `call __fentry__` listed in __mcount_loc into a
// NOP and stops __mcount_loc from loading (the kernel finds it only as an
// allocated section). All or nothing: if any listed site is not the
// expected call, the module is left as it is.
func (m *modFile) nopFentry(st *moduleStats) error {
	idx, loc, err := m.table("__mcount_loc")
	if err != nil || idx < 0 || loc.Flags&elf.SHF_ALLOC == 0 {
		return err
	}
	type site struct {
		insn uint64
		r    rela
	}
	var sites []site
	for off := uint64(0); off < loc.Size; off += 8 {
		r, ok := m.relas[idx][off]
		if !ok || r.typ != rX866464 {
			return nil
		}
		sec, at, ok := m.location(r.sym, r.addend)
		if !ok {
			return nil
		}
		call, insn, ok := m.callSite(sec, at)
		if !ok || !bytes.Equal(m.out[insn+1:insn+5], []byte{0, 0, 0, 0}) {
			return nil
		}
		if s, ok := m.sym(call.sym); !ok || s.Name != "__fentry__" {
			return nil
		}
		sites = append(sites, site{insn, call})
	}
	for _, s := range sites {
		m.writeNop(s.insn, s.r)
	}
	m.setSectionFlags(idx, uint64(loc.Flags&^elf.SHF_ALLOC))
	st.fentryNops += len(sites)
	return nil
}

// prepatchStaticCalls writes each static call site's predicted
// instruction (see the comment at the top of this file).
func (m *modFile) prepatchStaticCalls(st *moduleStats) error {
	idx, sites, err := m.table(".static_call_sites")
	if err != nil || idx < 0 {
		return err
	}
	type retarget struct {
		r      rela
		symbol string
	}
	var pending []retarget
	for off := uint64(0); off < sites.Size; off += 8 {
		st.staticSites++
		// struct static_call_site { s32 addr; s32 key; }, both PC-relative.
		addr, okA := m.relas[idx][off]
		key, okK := m.relas[idx][off+4]
		if !okA || !okK || addr.typ != rX8664PC32 || key.typ != rX8664PC32 {
			continue
		}
		sec, at, ok := m.location(addr.sym, addr.addend)
		if !ok {
			continue
		}
		ks, ok := m.sym(key.sym)
		if !ok || (int64(ks.Value)+key.addend)&staticCallSiteTail != 0 {
			continue
		}
		call, insn, ok := m.callSite(sec, at)
		if !ok {
			continue
		}
		tramp, _ := m.sym(call.sym)
		name, ok := strings.CutPrefix(tramp.Name, "__SCT__")
		if !ok {
			continue
		}
		if ks.Name != "__SCT__"+name && ks.Name != "__SCK__"+name {
			continue // a site reaching its key some other way
		}
		if ks.Section == elf.SHN_UNDEF { // a key of the kernel proper
			target, known := kernelPreemptTargets[name]
			switch {
			case !known:
			case target == "":
				m.writeNop(insn, call)
				st.staticNops++
			default:
				pending = append(pending, retarget{call, target})
			}
			continue
		}
		target, known := m.moduleKeyTarget(ks, name, (int64(ks.Value)+key.addend)&^staticCallSiteFlags)
		switch {
		case !known:
		case target == 0:
			m.writeNop(insn, call)
			st.staticNops++
		default: // the loader's own relocation now writes `call <target>`
			m.setRela(call, target, call.typ)
			st.staticDirect++
		}
	}
	for _, p := range pending {
		sym, ok, err := m.undefinedSymbol(p.symbol)
		if err != nil {
			return err
		}
		if ok {
			m.setRela(p.r, sym, p.r.typ)
			st.staticDirect++
		}
	}
	return nil
}

// moduleKeyTarget predicts what a key the module defines holds when its
// sites are initialised: the symbol index of its target, 0 for NULL, or
// known false when the file does not say.
func (m *modFile) moduleKeyTarget(key elf.Symbol, name string, keyAt int64) (target uint32, known bool) {
	if key.Name != "__SCK__"+name || int(key.Section) >= len(m.f.Sections) || keyAt < 0 {
		return 0, false
	}
	sec := m.f.Sections[key.Section]
	if uint64(keyAt) > sec.Size || sec.Size-uint64(keyAt) < 8 {
		return 0, false
	}
	// struct static_call_key starts with the target: a relocation there
	// names it; no relocation over zero bytes means NULL.
	if r, ok := m.relas[int(key.Section)][uint64(keyAt)]; ok {
		fn, ok := m.sym(r.sym)
		if r.typ != rX866464 || r.addend != 0 || !ok || elf.ST_TYPE(fn.Info) != elf.STT_FUNC || fn.Section == elf.SHN_UNDEF {
			return 0, false
		}
		return r.sym, true
	}
	if sec.Type == elf.SHT_NOBITS {
		return 0, true
	}
	if binary.LittleEndian.Uint64(m.out[sec.Offset+uint64(keyAt):]) == 0 {
		return 0, true
	}
	return 0, false
}

// undefinedSymbol returns the index of an undefined global symbol named
// name, adding it (with its modversions entry) when the module lacks it.
// ok is false when it cannot be added faithfully: no CRC for it, or a
// module without a __versions table (the kernel would then refuse it).
func (m *modFile) undefinedSymbol(name string) (uint32, bool, error) {
	if i, ok := m.added[name]; ok {
		return i, true, nil
	}
	for i, s := range m.syms {
		if s.Name == name && s.Section == elf.SHN_UNDEF && elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			return uint32(i + 1), true, nil
		}
	}
	crc, ok := m.crcs[name]
	vers := m.section("__versions")
	symtab := m.section(".symtab")
	if !ok || vers < 0 || symtab < 0 || len(name) >= modversionSize-8 {
		return 0, false, nil
	}
	st := m.f.Sections[symtab]
	if st.Type != elf.SHT_SYMTAB || int(st.Link) <= 0 || int(st.Link) >= len(m.f.Sections) || st.Size%elf64SymSize != 0 {
		return 0, false, fmt.Errorf("symbol table is malformed")
	}
	// The string table, symbol table and version table each move to the
	// end of the file, one entry longer; what they leave behind is never
	// read again.
	_, nameOff := m.sectionHeader(int(st.Link))
	strs := append(bytes.Clone(m.sectionBytes(int(st.Link))), name...)
	strs = append(strs, 0)
	symbols := m.sectionBytes(symtab)
	if len(symbols)%elf64SymSize != 0 {
		return 0, false, fmt.Errorf("symbol table is malformed")
	}
	ent := make([]byte, elf64SymSize)
	binary.LittleEndian.PutUint32(ent[0:], uint32(nameOff))
	ent[4] = byte(elf.STB_GLOBAL)<<4 | byte(elf.STT_NOTYPE)
	symbols = append(bytes.Clone(symbols), ent...)
	index := uint32(len(symbols)/elf64SymSize - 1)
	m.moveSection(int(st.Link), strs, 1)
	m.moveSection(symtab, symbols, 8)
	if !m.hasVersion(vers, name) {
		v := make([]byte, modversionSize)
		binary.LittleEndian.PutUint64(v, uint64(crc))
		copy(v[8:], name)
		m.moveSection(vers, append(bytes.Clone(m.sectionBytes(vers)), v...), 32)
	}
	m.added[name] = index
	return index, true, nil
}

// hasVersion reports whether __versions (section vers) lists name.
func (m *modFile) hasVersion(vers int, name string) bool {
	b := m.sectionBytes(vers)
	for i := 0; i+modversionSize <= len(b); i += modversionSize {
		entry := b[i+8 : i+modversionSize]
		if n := bytes.IndexByte(entry, 0); n >= 0 && string(entry[:n]) == name {
			return true
		}
	}
	return false
}

// sectionBytes is section i's current contents in out.
func (m *modFile) sectionBytes(i int) []byte {
	off, size := m.sectionHeader(i)
	return m.out[off : off+size]
}

// Section header fields, read from and written to out (ELF64 layout).
func (m *modFile) shdr(i int) []byte {
	shoff := binary.LittleEndian.Uint64(m.out[0x28:])
	entsize := uint64(binary.LittleEndian.Uint16(m.out[0x3a:]))
	return m.out[shoff+uint64(i)*entsize:]
}

func (m *modFile) sectionHeader(i int) (off, size uint64) {
	h := m.shdr(i)
	return binary.LittleEndian.Uint64(h[24:]), binary.LittleEndian.Uint64(h[32:])
}

func (m *modFile) setSectionFlags(i int, flags uint64) {
	binary.LittleEndian.PutUint64(m.shdr(i)[8:], flags)
}

// moveSection appends data at the end of the file (aligned) and points
// section i at it.
func (m *modFile) moveSection(i int, data []byte, align int) {
	for len(m.out)%align != 0 {
		m.out = append(m.out, 0)
	}
	off := uint64(len(m.out))
	m.out = append(m.out, data...)
	h := m.shdr(i)
	binary.LittleEndian.PutUint64(h[24:], off)
	binary.LittleEndian.PutUint64(h[32:], uint64(len(data)))
}

// relocations indexes every SHT_RELA section by the section it applies to,
// then by offset in that section.
func relocations(f *elf.File, data []byte) (map[int]map[uint64]rela, error) {
	out := map[int]map[uint64]rela{}
	for _, s := range f.Sections {
		if s.Type != elf.SHT_RELA {
			continue
		}
		if s.Entsize != elf64RelaSize || s.Size%elf64RelaSize != 0 {
			return nil, fmt.Errorf("relocation section %s: %d bytes in entries of %d, want entries of %d", s.Name, s.Size, s.Entsize, elf64RelaSize)
		}
		if int(s.Info) <= 0 || int(s.Info) >= len(f.Sections) {
			return nil, fmt.Errorf("relocation section %s applies to section %d, which does not exist", s.Name, s.Info)
		}
		byOff := out[int(s.Info)]
		if byOff == nil {
			byOff = map[uint64]rela{}
			out[int(s.Info)] = byOff
		}
		for o := s.Offset; o < s.Offset+s.Size; o += elf64RelaSize {
			info := binary.LittleEndian.Uint64(data[o+8:])
			byOff[binary.LittleEndian.Uint64(data[o:])] = rela{
				fileOff: o, sym: uint32(info >> 32), typ: uint32(info),
				addend: int64(binary.LittleEndian.Uint64(data[o+16:])),
			}
		}
	}
	return out, nil
}

// kernelCRCs reads the modversions CRC of every symbol a vmlinux exports:
// __ksymtab and __ksymtab_gpl hold struct kernel_symbol entries (three
// s32 offsets, each relative to itself: value, name, namespace) and
// __kcrctab and __kcrctab_gpl the CRCs in the same order. A kernel built
// without CRCs gives an empty map.
func kernelCRCs(vmlinux []byte) (map[string]uint32, error) {
	f, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return nil, fmt.Errorf("kernel exports: %w", err)
	}
	// fileRange maps a kernel address to its file offset and the end of
	// its section's bytes in the file.
	fileRange := func(va uint64) (off, end uint64, ok bool) {
		for _, s := range f.Sections {
			if s.Type == elf.SHT_NOBITS || s.Flags&elf.SHF_ALLOC == 0 || va < s.Addr || va-s.Addr >= s.Size {
				continue
			}
			if s.Offset > uint64(len(vmlinux)) || s.Size > uint64(len(vmlinux))-s.Offset {
				return 0, 0, false
			}
			return s.Offset + (va - s.Addr), s.Offset + s.Size, true
		}
		return 0, 0, false
	}
	read := func(va, n uint64) ([]byte, bool) {
		off, end, ok := fileRange(va)
		if !ok || n > end-off {
			return nil, false
		}
		return vmlinux[off : off+n], true
	}
	crcs := map[string]uint32{}
	for _, pair := range [][2]string{{"__ksymtab", "__kcrctab"}, {"__ksymtab_gpl", "__kcrctab_gpl"}} {
		ks, kc := f.Section(pair[0]), f.Section(pair[1])
		if ks == nil || kc == nil {
			continue
		}
		const entSize = 12
		if ks.Size%entSize != 0 || kc.Size != ks.Size/entSize*4 {
			return nil, fmt.Errorf("kernel exports: %s has %d bytes but %s %d, not one CRC per entry", pair[0], ks.Size, pair[1], kc.Size)
		}
		syms, ok := read(ks.Addr, ks.Size)
		crcBytes, ok2 := read(kc.Addr, kc.Size)
		if !ok || !ok2 {
			return nil, fmt.Errorf("kernel exports: %s or %s lies outside the file", pair[0], pair[1])
		}
		for i := uint64(0); i < ks.Size/entSize; i++ {
			field := ks.Addr + i*entSize + 4
			nameVA := uint64(int64(field) + int64(int32(binary.LittleEndian.Uint32(syms[i*entSize+4:]))))
			off, limit, ok := fileRange(nameVA)
			if !ok {
				return nil, fmt.Errorf("kernel exports: entry %d of %s names an address outside the kernel", i, pair[0])
			}
			// The name runs to a NUL within its section.
			name := vmlinux[off:limit]
			end := bytes.IndexByte(name, 0)
			if end < 0 {
				return nil, fmt.Errorf("kernel exports: entry %d of %s has an unterminated name", i, pair[0])
			}
			crcs[string(name[:end])] = binary.LittleEndian.Uint32(crcBytes[i*4:])
		}
	}
	return crcs, nil
}
