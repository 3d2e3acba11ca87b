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

// Unmarshal decodes one message body, walking its structure first so forged
// element counts fail fast (see msgframe.Unmarshal).
func Unmarshal(buf []byte, m msgp.Unmarshaler) error { return msgframe.Unmarshal(buf, m) }
