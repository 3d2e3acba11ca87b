package guestwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/tinylib/msgp/msgp"

	"github.com/capsem/capsem/core/msgframe"
)

// ErrFrameTooLarge is returned for a message above MaxFrame. When reading, the
// oversized payload has been consumed, so the stream stays in sync.
var ErrFrameTooLarge = msgframe.ErrFrameTooLarge

// Writer writes length-prefixed messages; it is safe for concurrent use, so
// answers from concurrent handlers never interleave.
type Writer struct{ w *msgframe.Writer }

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{msgframe.NewWriter(w, MaxFrame, "guestwire")} }

// Write encodes and flushes one message.
func (w *Writer) Write(m *Message) error { return w.w.Write(m, m.Type) }

// WriteFrame writes one frame made by AppendFrame.
func (w *Writer) WriteFrame(frame []byte) error { return w.w.WriteFrame(frame) }

// AppendFrame appends m as one frame ([u32 BE length][msgpack]) to dst. It
// copies everything m holds, so the caller may reuse m's buffers at once.
func AppendFrame(dst []byte, m *Message) ([]byte, error) {
	return msgframe.Append(dst, m, MaxFrame, "guestwire", m.Type)
}

// Reader reads length-prefixed messages; not safe for concurrent use.
type Reader struct{ r *msgframe.Reader }

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader { return &Reader{msgframe.NewReader(r, MaxFrame, "guestwire")} }

// Read decodes the next message into m. io.EOF means a clean end. A
// *DecodeError or ErrFrameTooLarge leaves the stream in sync for the next
// Read (see IsRecoverable).
func (r *Reader) Read(m *Message) error {
	buf, err := r.r.Next()
	if err != nil {
		return err
	}
	*m = Message{}
	if err := Unmarshal(buf, m); err != nil {
		de := &DecodeError{Err: err}
		var h Header
		if _, err := h.UnmarshalMsg(buf); err == nil {
			de.ID = h.ID
		}
		return de
	}
	return nil
}

// DecodeError is a well-framed message whose msgpack did not decode. ID is
// the frame's id when that much could be read (0 otherwise), so the answer
// can still reach its caller.
type DecodeError struct {
	ID  uint64
	Err error
}

func (e *DecodeError) Error() string { return "guestwire: decode: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// IsRecoverable reports whether a Read error left the stream usable.
func IsRecoverable(err error) bool {
	var de *DecodeError
	return errors.As(err, &de) || errors.Is(err, ErrFrameTooLarge)
}

// maxStreamHeader bounds a StreamHeader frame; a real one is ~30 bytes.
const maxStreamHeader = 256

// WriteStreamHeader writes the frame that opens a data stream.
func WriteStreamHeader(w io.Writer, h StreamHeader) error {
	b, err := h.MarshalMsg(make([]byte, 4, 64))
	if err != nil {
		return fmt.Errorf("guestwire: encode stream header: %w", err)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("guestwire: write stream header: %w", err)
	}
	return nil
}

// ReadStreamHeader reads the frame that opens a data stream, and not one
// byte more: what follows is the raw data.
func ReadStreamHeader(r io.Reader) (StreamHeader, error) {
	var h StreamHeader
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return h, fmt.Errorf("guestwire: stream header length: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxStreamHeader {
		return h, fmt.Errorf("guestwire: stream header of %d bytes, the limit is %d", n, maxStreamHeader)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return h, fmt.Errorf("guestwire: short stream header: %w", io.ErrUnexpectedEOF)
	}
	if _, err := h.UnmarshalMsg(buf); err != nil {
		return h, fmt.Errorf("guestwire: stream header: %w", err)
	}
	if h.Which != StreamStdout && h.Which != StreamStderr && h.Which != StreamFile {
		return h, fmt.Errorf("guestwire: stream header names %q, want %q, %q or %q", h.Which, StreamStdout, StreamStderr, StreamFile)
	}
	return h, nil
}

// Unmarshal decodes one message body, walking its structure first so forged
// element counts fail fast (see msgframe.Unmarshal).
func Unmarshal(buf []byte, m msgp.Unmarshaler) error { return msgframe.Unmarshal(buf, m) }

// MaxChunk bounds one chunk of a file_write's data stream.
const MaxChunk = 256 << 10

// ErrTransferCut is returned by ChunkReader for a data stream that ended
// before its end marker: the sender gave up, so the bytes so far are not
// the whole file and must not replace it.
var ErrTransferCut = errors.New("guestwire: the data stream ended before its end marker")

// A file_write's data stream is chunked, [u32 BE length][bytes] with
// 0 < length <= MaxChunk, and ends with a zero length. A stream's EOF
// alone cannot tell a finished file from a sender that gave up (a
// multiplexed stream's close is the same in both), and a file cut short
// must never replace the old one.

// ChunkWriter frames what is written to it as data stream chunks; End
// writes the end marker.
type ChunkWriter struct {
	w   io.Writer
	buf []byte
}

// NewChunkWriter returns a ChunkWriter on w.
func NewChunkWriter(w io.Writer) *ChunkWriter { return &ChunkWriter{w: w} }

// Write sends p as one or more chunks, each header and body in one write.
func (c *ChunkWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n := min(len(p), MaxChunk)
		c.buf = binary.BigEndian.AppendUint32(c.buf[:0], uint32(n))
		c.buf = append(c.buf, p[:n]...)
		if _, err := c.w.Write(c.buf); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// ReadFrom copies r to the stream in chunks of up to MaxChunk, reading
// straight into the buffer that carries the header. Large chunks matter to
// the guest, which pays for every read of a chunk's header and of its body
// far more than for the bytes.
func (c *ChunkWriter) ReadFrom(r io.Reader) (int64, error) {
	const size = MaxChunk
	if cap(c.buf) < 4+size {
		c.buf = make([]byte, 4+size)
	}
	buf := c.buf[:4+size]
	var total int64
	for {
		n, err := r.Read(buf[4:])
		if n > 0 {
			binary.BigEndian.PutUint32(buf, uint32(n))
			if _, werr := c.w.Write(buf[:4+n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// End writes the end marker: the file is whole.
func (c *ChunkWriter) End() error {
	_, err := c.w.Write([]byte{0, 0, 0, 0})
	return err
}

// ChunkReader reads a chunked data stream back as plain bytes. Read returns
// io.EOF only after the end marker; a stream that ends before it is
// ErrTransferCut, and a chunk over MaxChunk is an error that names it.
type ChunkReader struct {
	r     io.Reader
	left  uint32
	ended bool
}

// NewChunkReader returns a ChunkReader on r.
func NewChunkReader(r io.Reader) *ChunkReader { return &ChunkReader{r: r} }

func (c *ChunkReader) Read(p []byte) (int, error) {
	if c.ended {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if c.left == 0 {
		var hdr [4]byte
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, ErrTransferCut
			}
			return 0, err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			c.ended = true
			return 0, io.EOF
		}
		if n > MaxChunk {
			return 0, fmt.Errorf("guestwire: data stream chunk of %d bytes, the limit is %d", n, MaxChunk)
		}
		c.left = n
	}
	n, err := c.r.Read(p[:min(len(p), int(c.left))])
	c.left -= uint32(n)
	if errors.Is(err, io.EOF) {
		if c.left > 0 {
			return n, ErrTransferCut
		}
		err = nil // the next Read looks for the next header
	}
	return n, err
}
