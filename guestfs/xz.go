package guestfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"io"

	"github.com/ulikunitz/xz/lzma"
)

// The kernel's bzImage payload is an xz stream whose block runs the x86 BCJ
// filter before LZMA2 (scripts/xz_wrap.sh passes --x86). ulikunitz/xz reads
// only LZMA2-only blocks, so this file parses the xz container itself, hands
// the raw LZMA2 data to ulikunitz/xz/lzma, and undoes the BCJ filter here.

var xzMagic = []byte{0xFD, '7', 'z', 'X', 'Z', 0x00}

const (
	xzFilterX86   = 0x04
	xzFilterLZMA2 = 0x21

	// xzMaxDict bounds the LZMA2 dictionary a stream may ask for, so a
	// corrupt header cannot make us allocate gigabytes. The kernel uses
	// 32 MiB; modules use 1 MiB or less.
	xzMaxDict = 64 << 20
)

var crc64Table = crc64.MakeTable(crc64.ECMA)

// xzCheckSizes maps the stream's check type (0..15) to the check's size.
var xzCheckSizes = [16]int{0, 4, 4, 4, 8, 8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 64}

// decodeXZ decodes the first xz stream in data (anything after it is
// ignored, like the size word the kernel appends) and returns at most
// maxOut bytes of output. It supports the filter chains the kernel and
// module packaging use: LZMA2 alone, or x86 BCJ then LZMA2.
func decodeXZ(data []byte, maxOut int64) ([]byte, error) {
	return decodeXZDict(data, maxOut, xzMaxDict)
}

func decodeXZDict(data []byte, maxOut int64, maxDict int) ([]byte, error) {
	if len(data) < 12 || !bytes.Equal(data[:6], xzMagic) {
		return nil, errors.New("xz: missing stream header magic")
	}
	flags := data[6:8]
	if crc32.ChecksumIEEE(flags) != binary.LittleEndian.Uint32(data[8:12]) {
		return nil, errors.New("xz: stream header CRC mismatch")
	}
	if flags[0] != 0 || flags[1]&0xF0 != 0 {
		return nil, fmt.Errorf("xz: unsupported stream flags %#x %#x", flags[0], flags[1])
	}
	checkType := int(flags[1] & 0x0F)
	checkSize := xzCheckSizes[checkType]

	r := bytes.NewReader(data[12:])
	var out []byte
	for {
		first, err := r.ReadByte()
		if err != nil {
			return nil, errors.New("xz: truncated before the index")
		}
		if first == 0 {
			// The index follows the last block. Its sizes only repeat what
			// the blocks and checks above already proved, so stop here.
			return out, nil
		}
		block, err := decodeXZBlock(r, first, checkType, checkSize, maxOut-int64(len(out)), maxDict)
		if err != nil {
			return nil, err
		}
		out = append(out, block...)
	}
}

// decodeXZBlock decodes one block whose header size byte was already read.
func decodeXZBlock(r *bytes.Reader, first byte, checkType, checkSize int, maxOut int64, maxDict int) ([]byte, error) {
	hdrSize := (int(first) + 1) * 4
	hdr := make([]byte, hdrSize)
	hdr[0] = first
	if _, err := io.ReadFull(r, hdr[1:]); err != nil {
		return nil, errors.New("xz: truncated block header")
	}
	if crc32.ChecksumIEEE(hdr[:hdrSize-4]) != binary.LittleEndian.Uint32(hdr[hdrSize-4:]) {
		return nil, errors.New("xz: block header CRC mismatch")
	}
	h := bytes.NewReader(hdr[1 : hdrSize-4])
	bflags, _ := h.ReadByte()
	if bflags&0x3C != 0 {
		return nil, fmt.Errorf("xz: reserved block flags %#x", bflags)
	}
	compSize, uncompSize := int64(-1), int64(-1)
	if bflags&0x40 != 0 {
		v, err := readXZVarint(h)
		if err != nil {
			return nil, err
		}
		compSize = int64(v)
	}
	if bflags&0x80 != 0 {
		v, err := readXZVarint(h)
		if err != nil {
			return nil, err
		}
		uncompSize = int64(v)
	}
	nfilters := int(bflags&0x03) + 1
	bcj, bcjStart, dictCap := false, uint32(0), -1
	for i := range nfilters {
		id, err := readXZVarint(h)
		if err != nil {
			return nil, err
		}
		psize, err := readXZVarint(h)
		if err != nil {
			return nil, err
		}
		if psize > uint64(h.Len()) {
			return nil, errors.New("xz: filter properties overrun the block header")
		}
		props := make([]byte, psize)
		_, _ = io.ReadFull(h, props)
		last := i == nfilters-1
		switch {
		case id == xzFilterX86 && !last && !bcj:
			bcj = true
			switch len(props) {
			case 0:
			case 4:
				bcjStart = binary.LittleEndian.Uint32(props)
			default:
				return nil, errors.New("xz: bad x86 BCJ filter properties")
			}
		case id == xzFilterLZMA2 && last:
			if len(props) != 1 || props[0] > 40 {
				return nil, errors.New("xz: bad LZMA2 filter properties")
			}
			dictCap = lzma2DictSize(props[0])
		default:
			return nil, fmt.Errorf("xz: unsupported filter chain (filter %#x at position %d of %d)", id, i+1, nfilters)
		}
	}
	for h.Len() > 0 {
		if b, _ := h.ReadByte(); b != 0 {
			return nil, errors.New("xz: non-zero block header padding")
		}
	}
	if dictCap > maxDict {
		return nil, fmt.Errorf("xz: LZMA2 dictionary of %d bytes exceeds the %d-byte limit", dictCap, maxDict)
	}
	if dictCap < lzma.MinDictCap {
		dictCap = lzma.MinDictCap
	}
	if uncompSize > maxOut {
		return nil, fmt.Errorf("xz: block of %d bytes exceeds the %d-byte output limit", uncompSize, maxOut)
	}

	start := r.Size() - int64(r.Len())
	lr, err := lzma.Reader2Config{DictCap: dictCap}.NewReader2(r)
	if err != nil {
		return nil, fmt.Errorf("xz: starting LZMA2: %w", err)
	}
	var buf bytes.Buffer
	if uncompSize >= 0 {
		buf.Grow(int(uncompSize))
	}
	n, err := io.Copy(&buf, io.LimitReader(lr, maxOut+1))
	if err != nil {
		return nil, fmt.Errorf("xz: decoding LZMA2: %w", err)
	}
	if n > maxOut {
		return nil, fmt.Errorf("xz: output exceeds the %d-byte limit", maxOut)
	}
	if !lr.EOS() {
		return nil, errors.New("xz: LZMA2 data lacks its end marker")
	}
	consumed := r.Size() - int64(r.Len()) - start
	if compSize >= 0 && consumed != compSize {
		return nil, fmt.Errorf("xz: block compressed size %d, header says %d", consumed, compSize)
	}
	if uncompSize >= 0 && n != uncompSize {
		return nil, fmt.Errorf("xz: block uncompressed size %d, header says %d", n, uncompSize)
	}
	for pad := (4 - consumed%4) % 4; pad > 0; pad-- {
		if b, err := r.ReadByte(); err != nil || b != 0 {
			return nil, errors.New("xz: bad block padding")
		}
	}
	out := buf.Bytes()
	if bcj {
		bcjX86Decode(out, bcjStart)
	}
	check := make([]byte, checkSize)
	if _, err := io.ReadFull(r, check); err != nil {
		return nil, errors.New("xz: truncated block check")
	}
	if err := verifyXZCheck(checkType, check, out); err != nil {
		return nil, err
	}
	return out, nil
}

func verifyXZCheck(checkType int, check, data []byte) error {
	var want []byte
	switch checkType {
	case 0:
		return nil
	case 1:
		want = binary.LittleEndian.AppendUint32(nil, crc32.ChecksumIEEE(data))
	case 4:
		want = binary.LittleEndian.AppendUint64(nil, crc64.Checksum(data, crc64Table))
	case 10:
		sum := sha256.Sum256(data)
		want = sum[:]
	default:
		// Reserved check types: the size is known, so the stream can still
		// be read, but there is nothing to compare against.
		return nil
	}
	if !bytes.Equal(check, want) {
		return errors.New("xz: block check mismatch (corrupt data)")
	}
	return nil
}

func readXZVarint(r *bytes.Reader) (uint64, error) {
	var v uint64
	for i := 0; i < 9; i++ {
		b, err := r.ReadByte()
		if err != nil {
			return 0, errors.New("xz: truncated integer in block header")
		}
		v |= uint64(b&0x7F) << (7 * i)
		if b&0x80 == 0 {
			if b == 0 && i > 0 {
				return 0, errors.New("xz: non-minimal integer encoding")
			}
			return v, nil
		}
	}
	return 0, errors.New("xz: integer too long")
}

// lzma2DictSize decodes the LZMA2 dictionary-size property byte (0..40).
func lzma2DictSize(p byte) int {
	if p == 40 {
		return 0xFFFFFFFF
	}
	return (2 | int(p&1)) << (p/2 + 11)
}

// bcjX86Decode undoes the x86 BCJ filter in place: the encoder turned the
// relative targets of E8/E9 (call/jmp rel32) into absolute ones to help
// compression. A port of xz-embedded's bcj_x86; the whole buffer is one
// call, which is what the streaming decoder does over its lifetime (the
// last four bytes are never converted).
func bcjX86Decode(buf []byte, startPos uint32) {
	maskAllowed := [8]bool{true, true, true, false, true, false, false, false}
	maskBitNum := [8]uint32{0, 1, 2, 2, 3, 3, 3, 3}
	testMSByte := func(b byte) bool { return b == 0x00 || b == 0xFF }

	if len(buf) <= 4 {
		return
	}
	size := len(buf) - 4
	prevPos := -1
	prevMask := uint32(0)
	for i := 0; i < size; i++ {
		if buf[i]&0xFE != 0xE8 {
			continue
		}
		d := i - prevPos
		if d > 3 {
			prevMask = 0
		} else {
			prevMask = (prevMask << (d - 1)) & 7
			if prevMask != 0 {
				b := buf[i+4-int(maskBitNum[prevMask])]
				if !maskAllowed[prevMask] || testMSByte(b) {
					prevPos = i
					prevMask = (prevMask << 1) | 1
					continue
				}
			}
		}
		prevPos = i
		if !testMSByte(buf[i+4]) {
			prevMask = (prevMask << 1) | 1
			continue
		}
		src := binary.LittleEndian.Uint32(buf[i+1:])
		var dest uint32
		for {
			dest = src - (startPos + uint32(i) + 5)
			if prevMask == 0 {
				break
			}
			j := maskBitNum[prevMask] * 8
			if !testMSByte(byte(dest >> (24 - j))) {
				break
			}
			src = dest ^ (1<<(32-j) - 1)
		}
		dest &= 0x01FFFFFF
		dest |= 0 - (dest & 0x01000000)
		binary.LittleEndian.PutUint32(buf[i+1:], dest)
		i += 4
	}
}
