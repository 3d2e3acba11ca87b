package guestfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

// noiseWithoutMagic is random bytes that cannot contain the XZ magic.
func noiseWithoutMagic(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.IntN(0xFD)) // never 0xFD, the magic's first byte
	}
	return b
}

// fakeBzImage is prefix + payload + the 4-byte size the kernel appends +
// suffix; with header it also carries a boot-protocol setup header whose
// payload_offset points at the payload.
func fakeBzImage(prefix, payload []byte, header bool) []byte {
	img := bytes.Clone(prefix)
	if header {
		const setupSects = 3
		if len(img) < (setupSects+1)*512 {
			img = append(img, make([]byte, (setupSects+1)*512-len(img))...)
		}
		img[0x1f1] = setupSects
		copy(img[0x202:], "HdrS")
		binary.LittleEndian.PutUint16(img[0x206:], 0x20f)
		binary.LittleEndian.PutUint32(img[0x248:], uint32(len(img)-(setupSects+1)*512))
		binary.LittleEndian.PutUint32(img[0x24c:], uint32(len(payload)+4))
	}
	img = append(img, payload...)
	img = binary.LittleEndian.AppendUint32(img, 12345)
	return append(img, noiseWithoutMagic(300, 9)...)
}

func TestExtractVmlinux(t *testing.T) {
	kernel := fakeKernelELF(t, true, elf.EM_X86_64, false)
	stream := xzCompress(t, kernel, xz.CRC32)
	bcjStream, err := os.ReadFile("testdata/bcj-x86.xz")
	if err != nil {
		t.Fatal(err)
	}
	notELF := xzCompress(t, []byte("a decoy xz stream that is not a kernel"), xz.CRC32)
	for _, tc := range []struct {
		name string
		img  []byte
		want []byte
	}{
		{"scan for magic", fakeBzImage(noiseWithoutMagic(5000, 1), stream, false), kernel},
		{"setup header", fakeBzImage(noiseWithoutMagic(3000, 2), stream, true), kernel},
		{"decoy before payload", fakeBzImage(append(noiseWithoutMagic(700, 3), notELF...), stream, false), kernel},
		{"broken magic before payload", fakeBzImage(append(noiseWithoutMagic(700, 4), xzMagic...), stream, false), kernel},
		{"x86 BCJ payload", fakeBzImage(noiseWithoutMagic(2048, 5), bcjStream, true), bcjSample()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ExtractVmlinux(tc.img)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("extracted %d bytes, want the %d-byte ELF", len(got), len(tc.want))
			}
		})
	}
}

func TestExtractVmlinuxFailures(t *testing.T) {
	notELF := xzCompress(t, []byte("no ELF in here"), xz.CRC32)
	for _, tc := range []struct {
		name, want string
		img        []byte
	}{
		{"no payload", "no XZ-compressed payload", noiseWithoutMagic(4096, 6)},
		{"payload not ELF", "not an ELF", fakeBzImage(noiseWithoutMagic(1024, 7), notELF, false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ExtractVmlinux(tc.img)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestHasPVHNote(t *testing.T) {
	for _, pvh := range []bool{true, false} {
		ok, err := HasPVHNote(bytes.NewReader(fakeKernelELF(t, pvh, elf.EM_X86_64, false)))
		if err != nil {
			t.Fatal(err)
		}
		if ok != pvh {
			t.Fatalf("HasPVHNote = %v, want %v", ok, pvh)
		}
	}
	if _, err := HasPVHNote(bytes.NewReader([]byte("not an elf"))); err == nil {
		t.Fatal("HasPVHNote accepted a non-ELF")
	}
}
