package guestwire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/tinylib/msgp/msgp"
	"io"
	"slices"
	"sync"
)

// ErrFrameTooLarge is returned for a message above MaxFrame. When reading, the
// oversized payload has been consumed, so the stream stays in sync.
var ErrFrameTooLarge = errors.New("guestwire: message exceeds the frame limit")

// Writer writes length-prefixed messages; it is safe for concurrent use, so
// answers from concurrent handlers never interleave.
type Writer struct {
	mu  sync.Mutex
	w   *bufio.Writer
	buf []byte
}

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriterSize(w, 64<<10)} }

// Write encodes and flushes one message.
func (w *Writer) Write(m *Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	w.buf, err = AppendFrame(w.buf[:0], m)
	// A 64 MiB file answer must not pin 64 MiB for the life of the stream.
	defer func() {
		if cap(w.buf) > 1<<20 {
			w.buf = nil
		}
	}()
	if err != nil {
		return err
	}
	return w.writeLocked(w.buf, m.Type)
}

// WriteFrame writes one frame made by AppendFrame.
func (w *Writer) WriteFrame(frame []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writeLocked(frame, "frame")
}

func (w *Writer) writeLocked(frame []byte, what string) error {
	if _, err := w.w.Write(frame); err != nil {
		return fmt.Errorf("guestwire: write %s: %w", what, err)
	}
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("guestwire: write %s: %w", what, err)
	}
	return nil
}

// AppendFrame appends m as one frame ([u32 BE length][msgpack]) to dst. It
// copies everything m holds, so the caller may reuse m's buffers at once.
func AppendFrame(dst []byte, m *Message) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst, err := m.MarshalMsg(dst)
	if err != nil {
		return dst[:start], fmt.Errorf("guestwire: encode %s: %w", m.Type, err)
	}
	n := len(dst) - start - 4
	if n > MaxFrame {
		return dst[:start], fmt.Errorf("%w: %s is %d bytes, the limit is %d", ErrFrameTooLarge, m.Type, n, MaxFrame)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// Reader reads length-prefixed messages; not safe for concurrent use.
type Reader struct {
	r   *bufio.Reader
	buf []byte
	max int
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64<<10), max: MaxFrame}
}

// Read decodes the next message into m. io.EOF means a clean end. A
// *DecodeError or ErrFrameTooLarge leaves the stream in sync for the next
// Read (see IsRecoverable).
func (r *Reader) Read(m *Message) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("guestwire: short length prefix: %w", err)
		}
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(r.max) {
		if _, err := io.CopyN(io.Discard, r.r, int64(n)); err != nil {
			return fmt.Errorf("guestwire: skipping oversized message: %w", io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrFrameTooLarge, n, r.max)
	}
	buf, err := r.readPayload(int(n))
	if err != nil {
		return err
	}
	*m = Message{}
	err = Unmarshal(buf, m)
	if err != nil {
		de := &DecodeError{Err: err}
		var h Header
		if _, err := h.UnmarshalMsg(buf); err == nil {
			de.ID = h.ID
		}
		return de
	}
	return nil
}

// readPayload reads n bytes. A large frame's buffer grows as its bytes
// arrive, so a length prefix alone cannot make the reader allocate 65 MiB.
func (r *Reader) readPayload(n int) ([]byte, error) {
	const chunk = 1 << 20
	if n <= chunk {
		if cap(r.buf) < n {
			r.buf = make([]byte, n, max(n, 4<<10))
		}
		buf := r.buf[:n]
		if _, err := io.ReadFull(r.r, buf); err != nil {
			return nil, fmt.Errorf("guestwire: short message: %w", io.ErrUnexpectedEOF)
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
			return nil, fmt.Errorf("guestwire: short message: %w", io.ErrUnexpectedEOF)
		}
	}
	return buf, nil
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

// WriteStreamHeader writes the frame that opens an exec output stream.
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

// ReadStreamHeader reads the frame that opens an exec output stream, and not
// one byte more: what follows is the raw output.
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
	if h.Which != StreamStdout && h.Which != StreamStderr {
		return h, fmt.Errorf("guestwire: stream header names output %q, want %q or %q", h.Which, StreamStdout, StreamStderr)
	}
	return h, nil
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
