package guestfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"strings"
	"testing"
)

// testSection is one section of an ELF file built by buildELF.
type testSection struct {
	name        string
	typ         elf.SectionType
	flags       elf.SectionFlag
	addr        uint64
	data        []byte
	link, info  uint32
	entsize     uint64
	align       uint64
	offOverride uint64 // when set, the header claims this offset
}

// buildELF lays out a little-endian ELF64 file of the given type and
// machine; section 0 (null) and .shstrtab are added.
func buildELF(typ elf.Type, machine elf.Machine, secs []testSection) []byte {
	shstr := []byte{0}
	names := make([]uint32, len(secs))
	for i, s := range secs {
		names[i] = uint32(len(shstr))
		shstr = append(append(shstr, s.name...), 0)
	}
	shstrName := uint32(len(shstr))
	shstr = append(append(shstr, ".shstrtab"...), 0)
	var out bytes.Buffer
	out.Write(make([]byte, 64))
	offs := make([]uint64, len(secs))
	for i, s := range secs {
		for out.Len()%8 != 0 {
			out.WriteByte(0)
		}
		offs[i] = uint64(out.Len())
		out.Write(s.data)
	}
	shstrOff := uint64(out.Len())
	out.Write(shstr)
	for out.Len()%8 != 0 {
		out.WriteByte(0)
	}
	shoff := uint64(out.Len())
	binary.Write(&out, binary.LittleEndian, elf.Section64{})
	for i, s := range secs {
		off := offs[i]
		if s.offOverride != 0 {
			off = s.offOverride
		}
		align := s.align
		if align == 0 {
			align = 1
		}
		binary.Write(&out, binary.LittleEndian, elf.Section64{
			Name: names[i], Type: uint32(s.typ), Flags: uint64(s.flags), Addr: s.addr, Off: off,
			Size: uint64(len(s.data)), Link: s.link, Info: s.info, Addralign: align, Entsize: s.entsize,
		})
	}
	binary.Write(&out, binary.LittleEndian, elf.Section64{Name: shstrName, Type: uint32(elf.SHT_STRTAB), Off: shstrOff, Size: uint64(len(shstr)), Addralign: 1})
	b := out.Bytes()
	hdr := elf.Header64{
		Type: uint16(typ), Machine: uint16(machine), Version: 1, Shoff: shoff,
		Ehsize: 64, Shentsize: 64, Shnum: uint16(len(secs) + 2), Shstrndx: uint16(len(secs) + 1),
	}
	copy(hdr.Ident[:], elfMagic)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	var h bytes.Buffer
	binary.Write(&h, binary.LittleEndian, hdr)
	copy(b, h.Bytes())
	return b
}

type testSym struct {
	name  string
	info  byte // bind<<4 | type
	shndx uint16
	value uint64
}

type testRela struct {
	off    uint64
	sym    uint32
	typ    uint32
	addend int64
}

func symtabBytes(syms []testSym) (symtab, strtab []byte) {
	strtab = []byte{0}
	symtab = make([]byte, elf64SymSize) // the null symbol
	for _, s := range syms {
		e := make([]byte, elf64SymSize)
		if s.name != "" {
			binary.LittleEndian.PutUint32(e, uint32(len(strtab)))
			strtab = append(append(strtab, s.name...), 0)
		}
		e[4] = s.info
		binary.LittleEndian.PutUint16(e[6:], s.shndx)
		binary.LittleEndian.PutUint64(e[8:], s.value)
		symtab = append(symtab, e...)
	}
	return symtab, strtab
}

func relaBytes(rs []testRela) []byte {
	var b []byte
	for _, r := range rs {
		e := make([]byte, elf64RelaSize)
		binary.LittleEndian.PutUint64(e, r.off)
		binary.LittleEndian.PutUint64(e[8:], uint64(r.sym)<<32|uint64(r.typ))
		binary.LittleEndian.PutUint64(e[16:], uint64(r.addend))
		b = append(b, e...)
	}
	return b
}

func versionEntry(name string, crc uint32) []byte {
	v := make([]byte, modversionSize)
	binary.LittleEndian.PutUint64(v, uint64(crc))
	copy(v[8:], name)
	return v
}

// Offsets in the fake module's .text.
const (
	siteTracepoint = 0x05 // call __SCT__tp_func_tp: key starts at __traceiter_tp
	siteNullKey    = 0x0a // call __SCT__tp_func_nul: key starts NULL
	sitePreempt    = 0x0f // call __SCT__preempt_schedule: NULL at run time
	siteMightRes   = 0x14 // call __SCT__might_resched: __cond_resched at run time
	siteOther      = 0x19 // call __SCT__other: a kernel key we cannot predict
	siteTail       = 0x1e // tail call to __SCT__preempt_schedule: left alone
	fnTraceiter    = 0x40 // __traceiter_tp
)

// Symbol indexes in the fake module (0 is the null symbol).
const (
	symText = 1 + iota
	symData
	symTraceiter
	symKeyTp
	symKeyNul
	symTrampTp
	symTrampNul
	symTrampPreempt
	symTrampMight
	symTrampOther
	symFentry
	symCount // the next index: where an added symbol lands
)

type fakeModOpts struct {
	machine      elf.Machine
	noVersions   bool
	badFentry    bool   // the second fentry site is not a call
	relaEntsize  uint64 // overrides the relocation entry size
	textPastEOF  bool
	extraVersion bool // __versions already lists __cond_resched
}

// fakeStaticCallModule builds a module with one static call site of each
// kind, two ftrace sites and a __versions table.
func fakeStaticCallModule(o fakeModOpts) []byte {
	text := make([]byte, 0x80)
	call := func(at int, op byte) { text[at] = op } // rel32 stays zero: relocations fill it
	call(0x00, x86CallOpcode)                       // __fentry__
	for _, at := range []int{siteTracepoint, siteNullKey, sitePreempt, siteMightRes, siteOther} {
		call(at, x86CallOpcode)
	}
	call(siteTail, 0xe9) // jmp
	if !o.badFentry {
		call(fnTraceiter, x86CallOpcode)
	}
	text[fnTraceiter+5] = 0xc3
	text[0x60], text[0x61] = 0xc3, 0xc3 // the module's own trampolines

	const (
		secText = 1 + iota
		secRelaText
		secData
		secRelaData
		secSites
		secRelaSites
		secMcount
		secRelaMcount
		secVersions
		secSymtab
		secStrtab
	)
	global, local := byte(elf.STB_GLOBAL)<<4, byte(elf.STB_LOCAL)<<4
	syms := []testSym{
		{"", local | byte(elf.STT_SECTION), secText, 0},
		{"", local | byte(elf.STT_SECTION), secData, 0},
		{"__traceiter_tp", global | byte(elf.STT_FUNC), secText, fnTraceiter},
		{"__SCK__tp_func_tp", global | byte(elf.STT_OBJECT), secData, 0},
		{"__SCK__tp_func_nul", global | byte(elf.STT_OBJECT), secData, 16},
		{"__SCT__tp_func_tp", global | byte(elf.STT_FUNC), secText, 0x60},
		{"__SCT__tp_func_nul", global | byte(elf.STT_FUNC), secText, 0x61},
		{"__SCT__preempt_schedule", global, 0, 0},
		{"__SCT__might_resched", global, 0, 0},
		{"__SCT__other", global, 0, 0},
		{"__fentry__", global, 0, 0},
	}
	symtab, strtab := symtabBytes(syms)
	plt := func(at uint64, sym uint32) testRela { return testRela{at + 1, sym, rX8664PLT32, -4} }
	textRelas := []testRela{
		plt(0, symFentry), plt(fnTraceiter, symFentry),
		plt(siteTracepoint, symTrampTp), plt(siteNullKey, symTrampNul), plt(sitePreempt, symTrampPreempt),
		plt(siteMightRes, symTrampMight), plt(siteOther, symTrampOther), plt(siteTail, symTrampPreempt),
	}
	type site struct {
		at    int64
		key   uint32
		flags int64
	}
	sites := []site{
		{siteTracepoint, symKeyTp, 0}, {siteNullKey, symKeyNul, 0}, {sitePreempt, symTrampPreempt, 0},
		{siteMightRes, symTrampMight, 0}, {siteOther, symTrampOther, 0}, {siteTail, symTrampPreempt, staticCallSiteTail},
	}
	var siteRelas []testRela
	for i, s := range sites {
		siteRelas = append(siteRelas,
			testRela{uint64(8 * i), symText, rX8664PC32, s.at},
			testRela{uint64(8*i + 4), s.key, rX8664PC32, s.flags})
	}
	versions := versionEntry("__fentry__", 0xbdfb6dbb)
	if o.extraVersion {
		versions = append(versions, versionEntry("__cond_resched", 0x0800473f)...)
	}
	entsize := uint64(elf64RelaSize)
	if o.relaEntsize != 0 {
		entsize = o.relaEntsize
	}
	info := elf.SHF_INFO_LINK
	secs := []testSection{
		{name: ".text", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC | elf.SHF_EXECINSTR, data: text, align: 16},
		{name: ".rela.text", typ: elf.SHT_RELA, flags: info, data: relaBytes(textRelas), link: secSymtab, info: secText, entsize: entsize, align: 8},
		{name: ".data", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC | elf.SHF_WRITE, data: make([]byte, 32), align: 8},
		{name: ".rela.data", typ: elf.SHT_RELA, flags: info, data: relaBytes([]testRela{{0, symTraceiter, rX866464, 0}}), link: secSymtab, info: secData, entsize: entsize, align: 8},
		{name: ".static_call_sites", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC | elf.SHF_WRITE, data: make([]byte, 8*len(sites)), align: 1},
		{name: ".rela.static_call_sites", typ: elf.SHT_RELA, flags: info, data: relaBytes(siteRelas), link: secSymtab, info: secSites, entsize: entsize, align: 8},
		{name: "__mcount_loc", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, data: make([]byte, 16), align: 1},
		{name: ".rela__mcount_loc", typ: elf.SHT_RELA, flags: info, data: relaBytes([]testRela{{0, symText, rX866464, 0}, {8, symText, rX866464, fnTraceiter}}), link: secSymtab, info: secMcount, entsize: entsize, align: 8},
		{name: "__versions", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, data: versions, align: 32},
		{name: ".symtab", typ: elf.SHT_SYMTAB, data: symtab, link: secStrtab, info: symTraceiter, entsize: elf64SymSize, align: 8},
		{name: ".strtab", typ: elf.SHT_STRTAB, data: strtab, align: 1},
	}
	if o.noVersions {
		secs[secVersions-1].name = ".note.other"
	}
	if o.textPastEOF {
		secs[0].offOverride = 1 << 20
	}
	machine := o.machine
	if machine == 0 {
		machine = elf.EM_X86_64
	}
	return buildELF(elf.ET_REL, machine, secs)
}

// patchedView reads back what the patch did to the fake module.
type patchedView struct {
	t    *testing.T
	f    *elf.File
	data []byte
}

func viewOf(t *testing.T, data []byte) patchedView {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the patched module does not parse: %v", err)
	}
	return patchedView{t, f, data}
}

func (v patchedView) textAt(off int) []byte {
	text := v.f.Section(".text")
	b, _ := text.Data()
	return b[off : off+5]
}

// textRela returns the relocation at .text offset off.
func (v patchedView) textRela(off uint64) rela {
	relas, err := relocations(v.f, v.data)
	if err != nil {
		v.t.Fatal(err)
	}
	return relas[1][off]
}

func (v patchedView) symbol(i uint32) elf.Symbol {
	syms, err := v.f.Symbols()
	if err != nil || i == 0 || int(i) > len(syms) {
		v.t.Fatalf("no symbol %d (%v)", i, err)
	}
	return syms[i-1]
}

func (v patchedView) versions() map[string]uint32 {
	out := map[string]uint32{}
	s := v.f.Section("__versions")
	if s == nil {
		return out
	}
	b, _ := s.Data()
	for i := 0; i+modversionSize <= len(b); i += modversionSize {
		out[strings.TrimRight(string(b[i+8:i+modversionSize]), "\x00")] = uint32(binary.LittleEndian.Uint64(b[i:]))
	}
	return out
}

var (
	callBytes = []byte{x86CallOpcode, 0, 0, 0, 0}
	testCRCs  = map[string]uint32{"__cond_resched": 0x0800473f, "__fentry__": 0xbdfb6dbb}
)

func TestPatchModule(t *testing.T) {
	type want struct {
		direct, nops, fentry int
		mightTarget          uint32 // symbol index the might_resched site calls (0: untouched)
		addedSymbol          bool
	}
	cases := []struct {
		name string
		opts fakeModOpts
		crcs map[string]uint32
		want want
	}{
		{"every kind of site", fakeModOpts{}, testCRCs, want{direct: 2, nops: 2, fentry: 2, mightTarget: symCount, addedSymbol: true}},
		{"no CRC for __cond_resched: its sites stay for the kernel", fakeModOpts{}, map[string]uint32{}, want{direct: 1, nops: 2, fentry: 2}},
		{"no __versions table: no symbol is added", fakeModOpts{noVersions: true}, testCRCs, want{direct: 1, nops: 2, fentry: 2}},
		{"__versions already lists it: one entry, still added to the symbols", fakeModOpts{extraVersion: true}, testCRCs, want{direct: 2, nops: 2, fentry: 2, mightTarget: symCount, addedSymbol: true}},
		{"an ftrace site not in shape: ftrace left whole", fakeModOpts{badFentry: true}, testCRCs, want{direct: 2, nops: 2, fentry: 0, mightTarget: symCount, addedSymbol: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := fakeStaticCallModule(tc.opts)
			orig := bytes.Clone(in)
			out, st, err := patchModule(in, tc.crcs)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, orig) {
				t.Fatal("patchModule changed its input")
			}
			if st.staticSites != 6 || st.staticDirect != tc.want.direct || st.staticNops != tc.want.nops || st.fentryNops != tc.want.fentry {
				t.Fatalf("stats %+v, want 6 sites, %d direct, %d NOPs, %d fentry", st, tc.want.direct, tc.want.nops, tc.want.fentry)
			}
			v := viewOf(t, out)

			// The tracepoint's site: same bytes, relocation now names the
			// key's initial target, so the loader writes `call __traceiter_tp`.
			if r := v.textRela(siteTracepoint + 1); r.sym != symTraceiter || r.typ != rX8664PLT32 || r.addend != -4 || !bytes.Equal(v.textAt(siteTracepoint), callBytes) {
				t.Errorf("tracepoint site: relocation %+v, bytes % x", r, v.textAt(siteTracepoint))
			}
			// NULL keys (the module's own, and preempt_schedule): a NOP the
			// loader leaves alone.
			for _, at := range []uint64{siteNullKey, sitePreempt} {
				if r := v.textRela(at + 1); r.typ != rX8664None || !bytes.Equal(v.textAt(int(at)), x86Nop5) {
					t.Errorf("site %#x: relocation %+v, bytes % x; want a NOP", at, r, v.textAt(int(at)))
				}
			}
			// Left for the kernel: an unknown kernel key and a tail call.
			if r := v.textRela(siteOther + 1); r.sym != symTrampOther || r.typ != rX8664PLT32 || !bytes.Equal(v.textAt(siteOther), callBytes) {
				t.Errorf("unknown key's site changed: %+v", r)
			}
			if r := v.textRela(siteTail + 1); r.sym != symTrampPreempt || r.typ != rX8664PLT32 || v.textAt(siteTail)[0] != 0xe9 {
				t.Errorf("tail call changed: %+v", r)
			}

			r := v.textRela(siteMightRes + 1)
			if tc.want.mightTarget == 0 {
				if r.sym != symTrampMight || r.typ != rX8664PLT32 {
					t.Errorf("might_resched site changed without a way to call __cond_resched: %+v", r)
				}
			} else {
				s := v.symbol(r.sym)
				if r.sym != tc.want.mightTarget || s.Name != "__cond_resched" || s.Section != elf.SHN_UNDEF || elf.ST_BIND(s.Info) != elf.STB_GLOBAL {
					t.Errorf("might_resched site calls symbol %d %+v, want an undefined global __cond_resched at %d", r.sym, s, tc.want.mightTarget)
				}
				if !bytes.Equal(v.textAt(siteMightRes), callBytes) {
					t.Errorf("might_resched site bytes % x", v.textAt(siteMightRes))
				}
			}
			vers := v.versions()
			if tc.want.addedSymbol {
				if vers["__cond_resched"] != testCRCs["__cond_resched"] {
					t.Errorf("__versions %v lacks __cond_resched's CRC", vers)
				}
				n := len(vers)
				if s := v.f.Section("__versions"); int(s.Size)/modversionSize != n {
					t.Errorf("__versions holds %d entries, %d distinct: a duplicate was added", s.Size/modversionSize, n)
				}
			}
			if vers["__fentry__"] != testCRCs["__fentry__"] && !tc.opts.noVersions {
				t.Errorf("__versions lost an entry: %v", vers)
			}

			mcount := v.f.Section("__mcount_loc")
			for _, at := range []int{0, fnTraceiter} {
				nopped := bytes.Equal(v.textAt(at), x86Nop5)
				if nopped != (tc.want.fentry > 0) {
					t.Errorf("fentry site %#x: bytes % x, want NOPs %v", at, v.textAt(at), tc.want.fentry > 0)
				}
			}
			if (mcount.Flags&elf.SHF_ALLOC == 0) != (tc.want.fentry > 0) {
				t.Errorf("__mcount_loc flags %v with %d fentry NOPs", mcount.Flags, tc.want.fentry)
			}
		})
	}
}

func TestPatchModuleLeavesOthersAlone(t *testing.T) {
	arm := fakeStaticCallModule(fakeModOpts{machine: elf.EM_AARCH64})
	out, st, err := patchModule(arm, testCRCs)
	if err != nil || &out[0] != &arm[0] || st != (moduleStats{}) {
		t.Fatalf("an arm64 module was touched: %+v %v", st, err)
	}
	plain := fakeModule(t, "name=plain")
	out, st, err = patchModule(plain, testCRCs)
	if err != nil || &out[0] != &plain[0] || st != (moduleStats{}) {
		t.Fatalf("a module without sites was touched: %+v %v", st, err)
	}
}

func TestPatchModuleRejectsMalformed(t *testing.T) {
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"not ELF", []byte("not an elf file at all, just text"), "bad magic"},
		{"section past the end", fakeStaticCallModule(fakeModOpts{textPastEOF: true}), "runs past the end"},
		{"relocation entry size", fakeStaticCallModule(fakeModOpts{relaEntsize: 16}), "want entries of 24"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := patchModule(tc.data, testCRCs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// fakeKernelExports builds a vmlinux with the export tables kernelCRCs
// reads: names in __ksymtab_strings, entries with self-relative offsets.
func fakeKernelExports(t testing.TB, names []string, crcs []uint32, gplNames []string, gplCRCs []uint32) []byte {
	t.Helper()
	const ksymBase, gplBase, crcBase, gplCRCBase, strBase = 0xffffffff82000000, 0xffffffff82001000, 0xffffffff82002000, 0xffffffff82003000, 0xffffffff82004000
	var strs []byte
	nameVA := map[string]uint64{}
	for _, n := range append(append([]string(nil), names...), gplNames...) {
		nameVA[n] = strBase + uint64(len(strs))
		strs = append(append(strs, n...), 0)
	}
	table := func(base uint64, ns []string) []byte {
		var b []byte
		for i, n := range ns {
			e := make([]byte, 12)
			field := base + uint64(12*i) + 4
			binary.LittleEndian.PutUint32(e[4:], uint32(int32(int64(nameVA[n])-int64(field))))
			b = append(b, e...)
		}
		return b
	}
	crcTable := func(cs []uint32) []byte {
		var b []byte
		for _, c := range cs {
			b = binary.LittleEndian.AppendUint32(b, c)
		}
		return b
	}
	alloc := elf.SHF_ALLOC
	return buildELF(elf.ET_EXEC, elf.EM_X86_64, []testSection{
		{name: "__ksymtab", typ: elf.SHT_PROGBITS, flags: alloc, addr: ksymBase, data: table(ksymBase, names)},
		{name: "__ksymtab_gpl", typ: elf.SHT_PROGBITS, flags: alloc, addr: gplBase, data: table(gplBase, gplNames)},
		{name: "__kcrctab", typ: elf.SHT_PROGBITS, flags: alloc, addr: crcBase, data: crcTable(crcs)},
		{name: "__kcrctab_gpl", typ: elf.SHT_PROGBITS, flags: alloc, addr: gplCRCBase, data: crcTable(gplCRCs)},
		{name: "__ksymtab_strings", typ: elf.SHT_PROGBITS, flags: alloc, addr: strBase, data: strs},
	})
}

func TestKernelCRCs(t *testing.T) {
	k := fakeKernelExports(t, []string{"__cond_resched", "kmalloc_caches"}, []uint32{0x0800473f, 0x7a7caba8}, []string{"gpl_only"}, []uint32{0x12345678})
	got, err := kernelCRCs(k)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint32{"__cond_resched": 0x0800473f, "kmalloc_caches": 0x7a7caba8, "gpl_only": 0x12345678}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for n, c := range want {
		if got[n] != c {
			t.Errorf("%s: %#x, want %#x", n, got[n], c)
		}
	}

	bad := fakeKernelExports(t, []string{"a", "b"}, []uint32{1}, nil, nil)
	if _, err := kernelCRCs(bad); err == nil || !strings.Contains(err.Error(), "not one CRC per entry") {
		t.Fatalf("a CRC table one short: %v", err)
	}
	if got, err := kernelCRCs(fakeKernelELF(t, true, elf.EM_X86_64, false)); err != nil || len(got) != 0 {
		t.Fatalf("a kernel without export tables: %v %v, want none and no error", got, err)
	}
}

// fakeTablesModule builds a module with a .text section and the load-time
// tables dropTables handles: which names the sections present, and
// eventFlags are _ftrace_events' flags. index gives each table's section
// index.
func fakeTablesModule(which []string, eventFlags elf.SectionFlag) (data []byte, index map[string]int) {
	index = map[string]int{}
	const secText, secSymtab = 1, 2
	symtab, strtab := symtabBytes([]testSym{{"", byte(elf.STB_LOCAL)<<4 | byte(elf.STT_SECTION), secText, 0}})
	info := elf.SHF_INFO_LINK
	secs := []testSection{
		{name: ".text", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC | elf.SHF_EXECINSTR, data: []byte{0xc3, 0xc3, 0xc3, 0xc3}, align: 16},
		{name: ".symtab", typ: elf.SHT_SYMTAB, data: symtab, link: secSymtab + 1, info: 2, entsize: elf64SymSize, align: 8},
		{name: ".strtab", typ: elf.SHT_STRTAB, data: strtab, align: 1},
	}
	for _, name := range which {
		idx := uint32(len(secs) + 1)
		index[name] = int(idx)
		switch name {
		case orcUnwindIPSection:
			secs = append(secs,
				testSection{name: name, typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, data: make([]byte, 8), align: 4},
				testSection{name: ".rela" + name, typ: elf.SHT_RELA, flags: info, link: secSymtab, info: idx, entsize: elf64RelaSize, align: 8,
					data: relaBytes([]testRela{{0, 1, rX8664PC32, 0}, {4, 1, rX8664PC32, 2}})})
		case orcUnwindSection:
			secs = append(secs, testSection{name: name, typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC, data: make([]byte, 12), align: 2})
		case traceEventsSection:
			secs = append(secs,
				testSection{name: name, typ: elf.SHT_PROGBITS, flags: eventFlags, data: make([]byte, 8), align: 8},
				testSection{name: ".rela" + name, typ: elf.SHT_RELA, flags: info, link: secSymtab, info: idx, entsize: elf64RelaSize, align: 8,
					data: relaBytes([]testRela{{0, 1, rX866464, 0}})})
		}
	}
	return buildELF(elf.ET_REL, elf.EM_X86_64, secs), index
}

func TestPatchModuleDropsTables(t *testing.T) {
	all := []string{orcUnwindIPSection, orcUnwindSection, traceEventsSection}
	cases := []struct {
		name          string
		which         []string
		eventFlags    elf.SectionFlag
		unwind, event int  // stats
		orcKept       bool // the ORC pair still loads under its names
	}{
		{"unwind tables and trace events", all, elf.SHF_ALLOC | elf.SHF_WRITE, 1, 1, false},
		{"one ORC section alone is left (the kernel needs both anyway)", []string{orcUnwindIPSection, traceEventsSection}, elf.SHF_ALLOC | elf.SHF_WRITE, 0, 1, true},
		{"trace events not loaded already", all, elf.SHF_WRITE, 1, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in, index := fakeTablesModule(tc.which, tc.eventFlags)
			orig := bytes.Clone(in)
			out, st, err := patchModule(in, testCRCs)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(in, orig) {
				t.Fatal("patchModule changed its input")
			}
			if st.unwindTables != tc.unwind || st.eventTables != tc.event || st.staticSites+st.fentryNops != 0 {
				t.Fatalf("stats %+v, want %d unwind and %d event tables", st, tc.unwind, tc.event)
			}
			f, err := elf.NewFile(bytes.NewReader(out))
			if err != nil {
				t.Fatalf("the output does not parse: %v", err)
			}
			for _, name := range []string{orcUnwindSection, orcUnwindIPSection} {
				i, ok := index[name]
				if !ok {
					continue
				}
				s := f.Sections[i]
				loads := s.Name == name && s.Flags&elf.SHF_ALLOC != 0
				if loads != tc.orcKept {
					t.Errorf("%s: now named %q with flags %v; want it still loading: %v", name, s.Name, s.Flags, tc.orcKept)
				}
				if !tc.orcKept && s.Name != "" {
					t.Errorf("%s renamed to %q, want the empty name module_finalize does not look for", name, s.Name)
				}
			}
			if ev := f.Section(traceEventsSection); ev == nil || ev.Flags&elf.SHF_ALLOC != 0 {
				t.Errorf("_ftrace_events %+v: want it present and no longer allocated", ev)
			}
			if text, _ := f.Section(".text").Data(); !bytes.Equal(text, []byte{0xc3, 0xc3, 0xc3, 0xc3}) {
				t.Errorf(".text changed: % x", text)
			}
			// Patching the output again finds nothing more to do.
			again, st2, err := patchModule(out, testCRCs)
			if err != nil || !bytes.Equal(again, out) || st2 != (moduleStats{}) {
				t.Errorf("second patch: stats %+v, err %v, changed %v", st2, err, !bytes.Equal(again, out))
			}
		})
	}
}

func TestPatchModuleTablesNeedAnEmptyFirstName(t *testing.T) {
	in, _ := fakeTablesModule([]string{orcUnwindIPSection, orcUnwindSection}, 0)
	f, err := elf.NewFile(bytes.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	shstrndx := binary.LittleEndian.Uint16(in[0x3e:])
	in[f.Sections[shstrndx].Offset] = 'x'
	if _, _, err := patchModule(in, testCRCs); err == nil || !strings.Contains(err.Error(), "does not start with the empty name") {
		t.Fatalf("err %v, want one naming the section name table", err)
	}
}
