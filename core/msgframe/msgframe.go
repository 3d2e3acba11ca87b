// Package msgframe is the length-prefixed msgpack framing shared by the
// aggregator protocol (aggwire) and the guest control protocol (guestwire):
// each message is [u32 big-endian length][msgpack body]. The wire types and
// their versions stay in those packages; this one only moves bytes, so a fix
// to the framing (bounds, resynchronisation, allocation limits) lands in
// both at once.
package msgframe

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/tinylib/msgp/msgp"

	"github.com/capsem/capsem/core/procs"
)

// ErrFrameTooLarge is returned for a message above the limit. When reading,
// the oversized body has been consumed, so the stream stays in sync.
var ErrFrameTooLarge = errors.New("message exceeds the frame limit")

// Append appends m as one frame to dst. Protocol names the wire in errors
// ("aggwire"), what names the message ("file_write"). On error dst comes
// back unchanged.
func Append(dst []byte, m msgp.Marshaler, limit int, protocol, what string) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst, err := m.MarshalMsg(dst)
	if err != nil {
		return dst[:start], fmt.Errorf("%s: encode %s: %w", protocol, what, err)
	}
	n := len(dst) - start - 4
	if n > limit {
		return dst[:start], fmt.Errorf("%s: %w: %s is %d bytes, the limit is %d", protocol, ErrFrameTooLarge, what, n, limit)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// Writer writes frames; it is safe for concurrent use, so answers from
// concurrent handlers never interleave, and frames written at the same
// moment go out in one write (procs.GroupWriter).
type Writer struct {
	protocol string
	limit    int
	w        *procs.GroupWriter
}

// NewWriter returns a Writer over w for frames of at most limit bytes.
func NewWriter(w io.Writer, limit int, protocol string) *Writer {
	return &Writer{protocol: protocol, limit: limit, w: procs.NewGroupWriter(w)}
}

// Write encodes and writes one message.
func (w *Writer) Write(m msgp.Marshaler, what string) error {
	frame, err := Append(nil, m, w.limit, w.protocol, what)
	if err != nil {
		return err
	}
	return w.write(frame, what)
}

// WriteFrame writes one frame made by Append.
func (w *Writer) WriteFrame(frame []byte) error {
	return w.write(frame, "frame")
}

func (w *Writer) write(frame []byte, what string) error {
	if _, err := w.w.Write(frame); err != nil {
		return fmt.Errorf("%s: write %s: %w", w.protocol, what, err)
	}
	return nil
}

// Reader reads frames; it is not safe for concurrent use.
type Reader struct {
	protocol string
	limit    int
	r        *bufio.Reader
	buf      []byte
}

// NewReader returns a Reader over r for frames of at most limit bytes.
func NewReader(r io.Reader, limit int, protocol string) *Reader {
	return &Reader{protocol: protocol, limit: limit, r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next frame's body, valid until the following call.
// io.EOF means a clean end between frames. ErrFrameTooLarge leaves the
// stream in sync (the body was skipped); any other error does not.
func (r *Reader) Next() ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("%s: short length prefix: %w", r.protocol, err)
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(r.limit) {
		if _, err := io.CopyN(io.Discard, r.r, int64(n)); err != nil {
			return nil, fmt.Errorf("%s: skipping oversized message: %w", r.protocol, io.ErrUnexpectedEOF)
		}
		return nil, fmt.Errorf("%s: %w: %d bytes, the limit is %d", r.protocol, ErrFrameTooLarge, n, r.limit)
	}
	return r.readBody(int(n))
}

// readBody reads n bytes. A large frame's buffer grows as its bytes arrive,
// so a length prefix alone cannot make the reader allocate the limit.
func (r *Reader) readBody(n int) ([]byte, error) {
	const chunk = 1 << 20
	if n <= chunk {
		if cap(r.buf) < n {
			r.buf = make([]byte, n, max(n, 4<<10))
		}
		buf := r.buf[:n]
		if _, err := io.ReadFull(r.r, buf); err != nil {
			return nil, fmt.Errorf("%s: short message: %w", r.protocol, io.ErrUnexpectedEOF)
		}
		return buf, nil
	}
	buf := make([]byte, 0, chunk)
	for len(buf) < n {
		step := min(n-len(buf), chunk)
		buf = slices.Grow(buf, step)
		got, err := io.ReadFull(r.r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+got]
		if err != nil {
			return nil, fmt.Errorf("%s: short message: %w", r.protocol, io.ErrUnexpectedEOF)
		}
	}
	return buf, nil
}

// Unmarshal decodes one message body the safe way: the structure is walked
// first (msgp.Skip allocates nothing), so forged element counts fail fast
// instead of sizing huge slices.
func Unmarshal(buf []byte, m msgp.Unmarshaler) error {
	rest, err := msgp.Skip(buf)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return errors.New("trailing bytes after the message")
	}
	_, err = m.UnmarshalMsg(buf)
	return err
}
