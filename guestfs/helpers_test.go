package guestfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

// fakeKernelELF returns a minimal x86-64 ELF executable with one PT_NOTE
// segment; with pvh the segment holds the Xen PHYS32_ENTRY note that QEMU
// looks for. Extra bytes pad it so compression has something to do.
func fakeKernelELF(t testing.TB, pvh bool, machine elf.Machine, interp bool) []byte {
	t.Helper()
	var note bytes.Buffer
	writeNote := func(name string, typ uint32, desc []byte) {
		n := append([]byte(name), 0)
		binary.Write(&note, binary.LittleEndian, uint32(len(n)))
		binary.Write(&note, binary.LittleEndian, uint32(len(desc)))
		binary.Write(&note, binary.LittleEndian, typ)
		note.Write(n)
		note.Write(make([]byte, align4(uint64(len(n)))-uint64(len(n))))
		note.Write(desc)
		note.Write(make([]byte, align4(uint64(len(desc)))-uint64(len(desc))))
	}
	writeNote("GNU", 3, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	if pvh {
		writeNote("Xen", xenElfnotePhys32Entry, []byte{0x00, 0x10, 0x00, 0x01})
	}
	nprogs := 1
	if interp {
		nprogs = 2
	}
	const ehsize, phsize = 64, 56
	noteOff := uint64(ehsize + phsize*nprogs)
	interpPath := []byte("/lib64/ld-linux-x86-64.so.2\x00")
	interpOff := noteOff + uint64(note.Len())
	var out bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: 1,
		Entry: 0x1000000, Phoff: ehsize, Ehsize: ehsize,
		Phentsize: phsize, Phnum: uint16(nprogs),
	}
	copy(hdr.Ident[:], elfMagic)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&out, binary.LittleEndian, hdr)
	binary.Write(&out, binary.LittleEndian, elf.Prog64{
		Type: uint32(elf.PT_NOTE), Off: noteOff, Filesz: uint64(note.Len()), Memsz: uint64(note.Len()), Align: 4,
	})
	if interp {
		binary.Write(&out, binary.LittleEndian, elf.Prog64{
			Type: uint32(elf.PT_INTERP), Off: interpOff, Filesz: uint64(len(interpPath)), Memsz: uint64(len(interpPath)), Align: 1,
		})
	}
	out.Write(note.Bytes())
	if interp {
		out.Write(interpPath)
	}
	r := rand.New(rand.NewPCG(1, 2))
	pad := make([]byte, 8192)
	for i := range pad {
		pad[i] = byte(r.IntN(16))
	}
	out.Write(pad)
	return out.Bytes()
}

// fakeModule returns a minimal ELF relocatable object with a .modinfo
// section holding the given key=value strings, like a kernel module.
func fakeModule(t testing.TB, modinfo ...string) []byte {
	t.Helper()
	info := []byte(strings.Join(modinfo, "\x00") + "\x00")
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shsize = 64, 64
	infoOff := uint64(ehsize)
	shstrOff := infoOff + uint64(len(info))
	shOff := (shstrOff + uint64(len(shstr)) + 7) &^ 7
	var out bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_REL), Machine: uint16(elf.EM_X86_64), Version: 1,
		Shoff: shOff, Ehsize: ehsize, Shentsize: shsize, Shnum: 3, Shstrndx: 2,
	}
	copy(hdr.Ident[:], elfMagic)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	binary.Write(&out, binary.LittleEndian, hdr)
	out.Write(info)
	out.Write(shstr)
	out.Write(make([]byte, shOff-uint64(out.Len())))
	binary.Write(&out, binary.LittleEndian, elf.Section64{})
	binary.Write(&out, binary.LittleEndian, elf.Section64{
		Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: infoOff, Size: uint64(len(info)), Addralign: 1,
	})
	binary.Write(&out, binary.LittleEndian, elf.Section64{
		Name: 10, Type: uint32(elf.SHT_STRTAB), Off: shstrOff, Size: uint64(len(shstr)), Addralign: 1,
	})
	return out.Bytes()
}

// xzCompress compresses with ulikunitz/xz (LZMA2 only, no BCJ).
func xzCompress(t testing.TB, data []byte, check byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := xz.WriterConfig{CheckSum: check}.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// bcjSample is x86-looking data: an ELF magic, then random bytes with
// frequent E8/E9 (call/jmp rel32) whose displacements have a 00 or FF top
// byte, which is what the BCJ filter converts. testdata/bcj-x86.xz is
// `xz --format=xz --check=crc32 --x86 --lzma2=preset=6` of exactly this.
func bcjSample() []byte {
	r := rand.New(rand.NewPCG(42, 7))
	out := append([]byte{}, elfMagic...)
	for len(out) < 64<<10 {
		switch r.IntN(6) {
		case 0:
			out = append(out, 0xE8, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(4)), 0x00)
		case 1:
			out = append(out, 0xE9, byte(r.IntN(256)), byte(r.IntN(256)), 0xFF, 0xFF)
		case 2:
			out = append(out, 0xE8, 0xE8, byte(r.IntN(256)), 0x00, 0x00, 0xFF)
		default:
			out = append(out, byte(r.IntN(256)), byte(r.IntN(8)))
		}
	}
	return out
}
