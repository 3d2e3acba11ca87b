package aggwire

import (
	"errors"
	"io"

	"github.com/tinylib/msgp/msgp"

	"github.com/capsem/capsem/core/msgframe"
)

// MaxFrame bounds one message (16 MiB).
const MaxFrame = 16 << 20

// ErrFrameTooLarge is returned for a message above MaxFrame. When reading, the
// oversized payload has been consumed, so the stream stays in sync.
var ErrFrameTooLarge = msgframe.ErrFrameTooLarge

// Writer writes length-prefixed messages; it is safe for concurrent use.
type Writer struct{ w *msgframe.Writer }

// NewWriter returns a Writer over w.
func NewWriter(w io.Writer) *Writer { return &Writer{msgframe.NewWriter(w, MaxFrame, "aggwire")} }

// Write encodes and flushes one message.
func (w *Writer) Write(m msgp.Marshaler) error { return w.w.Write(m, "message") }

// Reader reads length-prefixed messages; not safe for concurrent use.
type Reader struct{ r *msgframe.Reader }

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader { return &Reader{msgframe.NewReader(r, MaxFrame, "aggwire")} }

// Read decodes the next message into m. io.EOF means a clean end. A decode
// error or ErrFrameTooLarge leaves the stream in sync for the next Read.
func (r *Reader) Read(m msgp.Unmarshaler) error {
	buf, err := r.r.Next()
	if err != nil {
		return err
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

// Unmarshal decodes one message body, walking its structure first so forged
// element counts fail fast (see msgframe.Unmarshal).
func Unmarshal(buf []byte, m msgp.Unmarshaler) error { return msgframe.Unmarshal(buf, m) }
