package guestfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// maxVmlinux bounds the decompressed kernel: Debian's is about 65 MB.
const maxVmlinux = 512 << 20

// xenElfnotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the 32-bit PVH entry
// point that lets QEMU's -kernel load the ELF directly.
const xenElfnotePhys32Entry = 18

var elfMagic = []byte("\x7fELF")

// ExtractVmlinux returns the uncompressed ELF kernel inside an x86 bzImage
// whose payload is XZ-compressed (Debian's). Booting the ELF skips the
// in-guest decompression, which is slow under TCG (make bench prints the
// boot times). The payload is found through the setup header's payload_offset
// when present, else by scanning for the XZ magic.
func ExtractVmlinux(bzImage []byte) ([]byte, error) {
	var firstErr error
	try := func(off int) []byte {
		out, err := decodeXZ(bzImage[off:], maxVmlinux)
		if err == nil && !bytes.HasPrefix(out, elfMagic) {
			err = errors.New("decompressed payload is not an ELF file")
		}
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("payload at offset %d: %w", off, err)
			}
			return nil
		}
		return out
	}
	tried := map[int]bool{}
	if off, ok := bzImagePayloadOffset(bzImage); ok {
		tried[off] = true
		if out := try(off); out != nil {
			return out, nil
		}
	}
	for start := 0; ; {
		i := bytes.Index(bzImage[start:], xzMagic)
		if i < 0 {
			break
		}
		off := start + i
		if !tried[off] {
			tried[off] = true
			if out := try(off); out != nil {
				return out, nil
			}
		}
		start = off + 1
	}
	if firstErr != nil {
		return nil, fmt.Errorf("extracting vmlinux: %w", firstErr)
	}
	return nil, errors.New("extracting vmlinux: no XZ-compressed payload found (is the kernel XZ-compressed?)")
}

// bzImagePayloadOffset reads the boot protocol header (Documentation/x86/
// boot.rst): the payload starts payload_offset bytes into the protected-
// mode code, which follows (setup_sects+1) 512-byte sectors.
func bzImagePayloadOffset(img []byte) (int, bool) {
	if len(img) < 0x250 || string(img[0x202:0x206]) != "HdrS" {
		return 0, false
	}
	if binary.LittleEndian.Uint16(img[0x206:]) < 0x208 {
		return 0, false // payload_offset exists since protocol 2.08
	}
	setup := int(img[0x1f1])
	if setup == 0 {
		setup = 4
	}
	off := (setup+1)*512 + int(binary.LittleEndian.Uint32(img[0x248:]))
	if off < 0 || off+len(xzMagic) > len(img) || !bytes.Equal(img[off:off+len(xzMagic)], xzMagic) {
		return 0, false
	}
	return off, true
}

// HasPVHNote reports whether the ELF kernel carries the Xen PVH entry note
// (name "Xen", type XEN_ELFNOTE_PHYS32_ENTRY), which QEMU needs to boot an
// uncompressed x86 kernel with -kernel.
func HasPVHNote(r io.ReaderAt) (bool, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return false, fmt.Errorf("reading kernel ELF: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(p.Open(), 1<<20))
		if err != nil {
			return false, fmt.Errorf("reading ELF note segment: %w", err)
		}
		if hasNote(data, f.ByteOrder, "Xen", xenElfnotePhys32Entry) {
			return true, nil
		}
	}
	return false, nil
}

// hasNote walks ELF notes: namesz, descsz, type, then name and desc each
// padded to 4 bytes.
func hasNote(data []byte, bo binary.ByteOrder, name string, typ uint32) bool {
	for len(data) >= 12 {
		namesz, descsz, t := bo.Uint32(data), bo.Uint32(data[4:]), bo.Uint32(data[8:])
		data = data[12:]
		nlen, dlen := align4(uint64(namesz)), align4(uint64(descsz))
		if nlen+dlen > uint64(len(data)) {
			return false
		}
		n := string(bytes.TrimRight(data[:namesz], "\x00"))
		if t == typ && n == name {
			return true
		}
		data = data[nlen+dlen:]
	}
	return false
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }
