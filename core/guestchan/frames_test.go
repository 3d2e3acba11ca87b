package guestchan

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// chunkedReader returns its data in reads of the given sizes, in turn.
type chunkedReader struct {
	data  []byte
	sizes []int
	i     int
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(p)
	if len(c.sizes) > 0 {
		n = min(n, max(1, c.sizes[c.i%len(c.sizes)]))
		c.i++
	}
	n = copy(p, c.data[:min(n, len(c.data))])
	c.data = c.data[n:]
	return n, nil
}

// splitFrames cuts a yamux byte stream into its frames; a trailing partial
// frame is returned as the last element.
func splitFrames(b []byte) [][]byte {
	var frames [][]byte
	for len(b) > 0 {
		n := yamuxHeaderSize
		if len(b) >= yamuxHeaderSize && b[1] == yamuxTypeData {
			n += int(binary.BigEndian.Uint32(b[8:]))
		}
		n = min(n, len(b))
		frames = append(frames, b[:n])
		b = b[n:]
	}
	return frames
}

// checkInjected reads everything through a frameReader that is asked to
// reset stream resetAfter[i] after its i-th read, with the peer's bytes
// arriving in reads of the given sizes, and checks that the output is the
// input with whole RST frames added between the input's frames only.
func checkInjected(t *testing.T, input []byte, readSizes []int, resetAfter map[int]uint32, bufSize int) {
	t.Helper()
	f := &frameReader{r: &chunkedReader{data: input, sizes: readSizes}}
	var out []byte
	buf := make([]byte, bufSize)
	asked := map[uint32]int{}
	for reads := 0; ; reads++ {
		if id, ok := resetAfter[reads]; ok {
			f.reset(id)
			asked[id]++
		}
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			break
		}
		if reads > 1<<20 {
			t.Fatal("no end")
		}
	}
	in := splitFrames(input)
	next, injected := 0, 0
	for _, fr := range splitFrames(out) {
		if next < len(in) && bytes.Equal(fr, in[next]) {
			next++
			continue
		}
		id := uint32(0)
		if len(fr) == yamuxHeaderSize {
			id = binary.BigEndian.Uint32(fr[4:])
		}
		if !bytes.Equal(fr, appendRST(nil, id)) || asked[id] == 0 {
			t.Fatalf("frame %x in the output is neither the input's frame %d nor a reset asked for", fr, next)
		}
		asked[id]--
		injected++
	}
	if next != len(in) {
		t.Fatalf("the output has %d of the input's %d frames", next, len(in))
	}
	queued := len(f.inject) / yamuxHeaderSize
	total := 0
	for _, n := range asked {
		total += n
	}
	if total != queued {
		t.Fatalf("%d resets neither injected nor queued (%d queued)", total, queued)
	}
}

func sampleStream() []byte {
	var b []byte
	b = appendSYN(b, 1)
	b = appendData(b, 1, AppendHeader(nil, PortControl))
	b = appendData(b, 1, bytes.Repeat([]byte("x"), 5000))
	b = append(b, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7) // ping
	b = appendSYN(b, 3)
	b = appendData(b, 3, nil)
	b = appendData(b, 3, []byte("y"))
	return b
}

func TestFrameReaderInjectsBetweenFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int
		buf   int
	}{
		{"whole reads", nil, 4096},
		{"byte by byte", []int{1}, 4096},
		{"odd chunks", []int{5, 13, 7, 4000, 1}, 4096},
		{"small buffer", nil, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resets := map[int]uint32{0: 101, 1: 103, 2: 105, 3: 107, 7: 109, 20: 111}
			checkInjected(t, sampleStream(), tc.sizes, resets, tc.buf)
		})
	}
}

// FuzzFrameReader: whatever the peer sends and however it is cut, the
// frameReader passes it on unchanged, with its own frames only between
// the peer's.
func FuzzFrameReader(f *testing.F) {
	f.Add(sampleStream(), []byte{1, 5, 13}, uint16(7), []byte{0, 1, 2})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 'a', 'b', 'c'}, []byte{2}, uint16(1), []byte{0})
	f.Add([]byte{}, []byte{}, uint16(12), []byte{})
	f.Fuzz(func(t *testing.T, input, sizes []byte, bufSize uint16, resetAt []byte) {
		if len(input) > 1<<16 {
			return
		}
		readSizes := make([]int, len(sizes))
		for i, s := range sizes {
			readSizes[i] = int(s)
		}
		resets := map[int]uint32{}
		for i, r := range resetAt {
			resets[int(r)] = 1<<31 + uint32(i)
		}
		checkInjected(t, input, readSizes, resets, int(bufSize%4096)+1)
	})
}
