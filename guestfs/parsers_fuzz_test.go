package guestfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

// FuzzExtractVmlinux: whatever the image, extraction returns an ELF file or
// an error naming the problem, and never panics (the setup header's offsets
// come from the downloaded file).
func FuzzExtractVmlinux(f *testing.F) {
	elfPayload := xzCompress(f, append([]byte("\x7fELF"), bytes.Repeat([]byte{0x90}, 200)...), xz.CRC32)
	f.Add(fakeBzImage(noiseWithoutMagic(700, 1), elfPayload, true))
	f.Add(fakeBzImage(noiseWithoutMagic(700, 2), elfPayload, false))
	f.Add(fakeBzImage(noiseWithoutMagic(700, 3), xzCompress(f, []byte("not an elf"), xz.CRC32), true))
	broken := fakeBzImage(noiseWithoutMagic(700, 4), elfPayload, true)
	binary.LittleEndian.PutUint32(broken[0x248:], 0xfffffff0) // payload_offset far past the end
	f.Add(broken)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, img []byte) {
		out, err := ExtractVmlinux(img)
		if err != nil {
			if !strings.Contains(err.Error(), "extracting vmlinux") {
				t.Fatalf("error does not say what failed: %v", err)
			}
			return
		}
		if !bytes.HasPrefix(out, elfMagic) {
			t.Fatalf("extracted %d bytes that are not ELF", len(out))
		}
	})
}

// FuzzHasNote walks ELF notes whose sizes come from the file.
func FuzzHasNote(f *testing.F) {
	note := binary.LittleEndian.AppendUint32(nil, 4)
	note = binary.LittleEndian.AppendUint32(note, 4)
	note = binary.LittleEndian.AppendUint32(note, xenElfnotePhys32Entry)
	note = append(note, "Xen\x00\x01\x02\x03\x04"...)
	f.Add(note)
	f.Add(note[:13])
	f.Add(bytes.Repeat([]byte{0xff}, 24))
	f.Fuzz(func(t *testing.T, data []byte) {
		found := hasNote(data, binary.LittleEndian, "Xen", xenElfnotePhys32Entry)
		if found && len(data) < 12+4 {
			t.Fatalf("found a Xen note in %d bytes", len(data))
		}
	})
}

// FuzzParseModulesDep: a parsed modules.dep names modules, never paths or
// file names, and a parse error names the line.
func FuzzParseModulesDep(f *testing.F) {
	f.Add("kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko kernel/fs/mbcache.ko\n# comment\n\nkernel/fs/jbd2/jbd2.ko:\n")
	f.Add("kernel/a.ko.xz: kernel/b-c.ko.zst\n")
	f.Add("no colon here\n")
	f.Add("a.txt: b.ko\n")
	f.Fuzz(func(t *testing.T, text string) {
		deps, err := parseModulesDep(strings.NewReader(text))
		if err != nil {
			if !strings.Contains(err.Error(), "modules.dep") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for name, list := range deps {
			for _, n := range append([]string{name}, list...) {
				if !isModuleName(n) {
					t.Fatalf("module name %q is not a kernel module name", n)
				}
			}
		}
	})
}

// FuzzParseModinfo reads .modinfo strings from a module file.
func FuzzParseModinfo(f *testing.F) {
	f.Add([]byte("depends=jbd2,mbcache,crc16\x00softdep=pre: crc32c post: x\x00alias=fs-ext4\x00"))
	f.Add([]byte("depends=\x00=\x00softdep=\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		mi := parseModinfo(data)
		for _, d := range mi.Depends {
			if d == "" || strings.ContainsAny(d, ",-") || strings.TrimSpace(d) != d {
				t.Fatalf("dependency %q is not a normalized module name", d)
			}
		}
		for _, p := range mi.SoftPre {
			if p == "" || p == "pre:" || p == "post:" || strings.ContainsAny(p, " \t\n") {
				t.Fatalf("soft dependency %q", p)
			}
		}
	})
}

// FuzzParseStanzas reads apt-cache output.
func FuzzParseStanzas(f *testing.F) {
	f.Add("Package: busybox-static\nVersion: 1:1.35\nDescription: x\n more\n\nPackage: b\n")
	f.Add("\n\n \nbad line\n")
	f.Add(" continuation first\nK: v\n")
	f.Fuzz(func(t *testing.T, text string) {
		records, err := parseStanzas(strings.NewReader(text))
		if err != nil {
			if !strings.Contains(err.Error(), "apt record") {
				t.Fatalf("error does not say what failed: %v", err)
			}
			return
		}
		for _, r := range records {
			if len(r) == 0 {
				t.Fatal("an empty record")
			}
			for k := range r {
				if strings.ContainsAny(k, ":\n") {
					t.Fatalf("key %q", k)
				}
			}
		}
	})
}

// FuzzStripModuleSignature: a stripped module is a prefix of the input that
// still starts as ELF; input without the marker comes back unchanged.
func FuzzStripModuleSignature(f *testing.F) {
	body := append([]byte("\x7fELF"), make([]byte, 60)...)
	f.Add(body)
	f.Add(signedModule(body, []byte{0, 0, 2, 0, 0, 0, 0, 0}, 40))
	f.Add(signedModule(body, []byte{0, 0, 2, 0, 0, 0, 0, 0}, 70))
	f.Add(moduleSigMarker)
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := stripModuleSignature(data)
		if err != nil {
			if !bytes.HasSuffix(data, moduleSigMarker) {
				t.Fatalf("error on input without a signature: %v", err)
			}
			return
		}
		if !bytes.HasPrefix(data, got) {
			t.Fatal("output is not a prefix of the input")
		}
		if !bytes.HasSuffix(data, moduleSigMarker) {
			if len(got) != len(data) {
				t.Fatal("unsigned input changed")
			}
			return
		}
		if len(got) >= len(data) || !bytes.HasPrefix(got, []byte("\x7fELF")) {
			t.Fatalf("signed input of %d bytes stripped to %d", len(data), len(got))
		}
	})
}

// FuzzPatchModule: any input either fails with an error or comes back as
// an ELF file no shorter than it, the input itself untouched; a patched
// module still parses, and patching it again finds nothing more to do.
func FuzzPatchModule(f *testing.F) {
	f.Add(fakeStaticCallModule(fakeModOpts{}))
	f.Add(fakeStaticCallModule(fakeModOpts{badFentry: true, noVersions: true}))
	f.Add(fakeModule(f, "name=plain"))
	tables, _ := fakeTablesModule([]string{orcUnwindIPSection, orcUnwindSection, traceEventsSection}, elf.SHF_ALLOC)
	f.Add(tables)
	f.Fuzz(func(t *testing.T, data []byte) {
		orig := bytes.Clone(data)
		out, st, err := patchModule(data, testCRCs)
		if !bytes.Equal(data, orig) {
			t.Fatal("the input was modified")
		}
		if err != nil {
			return
		}
		if len(out) < len(data) {
			t.Fatalf("output of %d bytes from %d", len(out), len(data))
		}
		if st.staticDirect+st.staticNops+st.fentryNops+st.unwindTables+st.eventTables == 0 {
			if !bytes.Equal(out, data) {
				t.Fatal("nothing patched, yet the output differs")
			}
			return
		}
		again, st2, err := patchModule(out, testCRCs)
		if err != nil {
			t.Fatalf("the patched module does not patch again: %v", err)
		}
		if st2.fentryNops != 0 || st2.staticNops != 0 || st2.unwindTables != 0 || st2.eventTables != 0 ||
			(st2.staticDirect != 0 && len(again) != len(out)) {
			t.Fatalf("patching twice did more work: %+v", st2)
		}
	})
}
