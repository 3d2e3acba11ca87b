package aggwire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/tinylib/msgp/msgp"
)

// MaxFrame bounds one message (16 MiB).
const MaxFrame = 16 << 20

// ErrFrameTooLarge is returned for a message above MaxFrame. When reading, the
// oversized payload has been consumed, so the stream stays in sync.
var ErrFrameTooLarge = errors.New("aggwire: message exceeds 16 MiB")

// Writer writes length-prefixed messages; it is safe for concurrent use.
type Writer struct {
	mu  sync.Mutex
	w   *bufio.Writer
	buf []byte
}

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriterSize(w, 64<<10)} }

// Write encodes and flushes one message.
func (w *Writer) Write(m msgp.Marshaler) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	w.buf, err = m.MarshalMsg(w.buf[:0])
	if err != nil {
		return fmt.Errorf("aggwire: encode: %w", err)
	}
	if len(w.buf) > MaxFrame {
		return fmt.Errorf("%w (%d bytes)", ErrFrameTooLarge, len(w.buf))
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(w.buf)))
	if _, err := w.w.Write(hdr[:]); err != nil {
		return fmt.Errorf("aggwire: write: %w", err)
	}
	if _, err := w.w.Write(w.buf); err != nil {
		return fmt.Errorf("aggwire: write: %w", err)
	}
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("aggwire: write: %w", err)
	}
	return nil
}

// Reader reads length-prefixed messages; not safe for concurrent use.
type Reader struct {
	r   *bufio.Reader
	buf []byte
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Read decodes the next message into m. io.EOF means a clean end. A decode
// error or ErrFrameTooLarge leaves the stream in sync for the next Read.
func (r *Reader) Read(m msgp.Unmarshaler) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r.r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("aggwire: short length prefix: %w", err)
		}
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		if _, err := io.CopyN(io.Discard, r.r, int64(n)); err != nil {
			return fmt.Errorf("aggwire: skipping oversized message: %w", io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("%w (%d bytes)", ErrFrameTooLarge, n)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n)
	}
	buf := r.buf[:n]
	if _, err := io.ReadFull(r.r, buf); err != nil {
		return fmt.Errorf("aggwire: short message: %w", io.ErrUnexpectedEOF)
	}
	if err := Unmarshal(buf, m); err != nil {
		return &DecodeError{Err: err}
	}
	return nil
}

// DecodeError is a well-framed message whose msgpack did not decode.
type DecodeError struct{ Err error }

func (e *DecodeError) Error() string { return "aggwire: decode: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// IsRecoverable reports whether a Read error left the stream usable.
func IsRecoverable(err error) bool {
	var de *DecodeError
	return errors.As(err, &de) || errors.Is(err, ErrFrameTooLarge)
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
