// Package mcpframe is the framed MCP record codec spoken between the guest
// relay (capsem-mcp-server) and the host MCP endpoint on logical port 5002.
//
// Layout, all integers big-endian:
//
//	u32 total_len | u16 magic 0x4D43 | u8 version 1 | u8 header_len 16 |
//	u32 stream_id | u16 flags | u16 name_len | u32 payload_len | name | payload
//
// total_len counts every byte after itself and must equal
// 16 + name_len + payload_len. Stream 0 is reserved for notifications and is
// used exactly when the notification flag is set.
package mcpframe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"
)

const (
	// ProtocolVersion is the frame format version carried in every frame.
	ProtocolVersion = 1
	// Magic is "MC".
	Magic uint16 = 0x4D43
	// HeaderLen is the fixed header size counted from the magic.
	HeaderLen = 16
	// PrefixLen is the size of the total_len prefix.
	PrefixLen = 4
	// MaxNameLen bounds the process name carried per frame.
	MaxNameLen = 128
	// MaxBodyLen bounds total_len (1 MiB + 4 KiB, as the reference system).
	MaxBodyLen = 1<<20 + 4<<10
	// MaxPayloadLen is the largest payload that fits with an empty name.
	MaxPayloadLen = MaxBodyLen - HeaderLen

	// FlagNotification marks a JSON-RPC notification (stream 0).
	FlagNotification uint16 = 0x0001
	reservedFlags           = ^FlagNotification
)

// Frame is one framed MCP record.
type Frame struct {
	StreamID uint32
	Flags    uint16
	Name     string // sanitized process name of the guest caller
	Payload  []byte // one JSON-RPC message, no trailing newline required
}

// IsNotification reports whether the frame carries a notification.
func (f *Frame) IsNotification() bool { return f.Flags&FlagNotification != 0 }

// Errors returned by the codec. Body errors (ErrInvalid*) leave the stream in
// sync: the caller consumed exactly total_len bytes and may keep reading.
var (
	ErrLength       = errors.New("mcp frame: total length out of range")
	ErrMagic        = errors.New("mcp frame: bad magic")
	ErrVersion      = errors.New("mcp frame: unsupported version")
	ErrHeaderLen    = errors.New("mcp frame: bad header length")
	ErrReservedFlag = errors.New("mcp frame: reserved flag bit set")
	ErrStreamFlag   = errors.New("mcp frame: stream 0 must be exactly the notification stream")
	ErrNameLen      = errors.New("mcp frame: process name longer than 128 bytes")
	ErrNameUTF8     = errors.New("mcp frame: process name is not valid UTF-8")
	ErrLenMismatch  = errors.New("mcp frame: total length does not match name and payload lengths")
	ErrTooLarge     = errors.New("mcp frame: frame exceeds the maximum size")
)

// IsBodyError reports whether err describes a malformed body whose bytes were
// fully consumed, so the connection can answer and keep serving.
func IsBodyError(err error) bool {
	for _, e := range []error{ErrMagic, ErrVersion, ErrHeaderLen, ErrReservedFlag, ErrStreamFlag, ErrNameLen, ErrNameUTF8, ErrLenMismatch} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func (f *Frame) validate() error {
	if f.Flags&reservedFlags != 0 {
		return fmt.Errorf("%w: flags 0x%04x", ErrReservedFlag, f.Flags)
	}
	if (f.StreamID == 0) != f.IsNotification() {
		return fmt.Errorf("%w: stream %d flags 0x%04x", ErrStreamFlag, f.StreamID, f.Flags)
	}
	if len(f.Name) > MaxNameLen {
		return fmt.Errorf("%w: %d bytes", ErrNameLen, len(f.Name))
	}
	if !utf8.ValidString(f.Name) {
		return ErrNameUTF8
	}
	return nil
}

// EncodedLen is the number of bytes Append writes for f.
func (f *Frame) EncodedLen() int { return PrefixLen + HeaderLen + len(f.Name) + len(f.Payload) }

// Append encodes f onto dst. It rejects anything Decode would reject.
func Append(dst []byte, f *Frame) ([]byte, error) {
	if err := f.validate(); err != nil {
		return dst, err
	}
	total := HeaderLen + len(f.Name) + len(f.Payload)
	if total > MaxBodyLen {
		return dst, fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, total, MaxBodyLen)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(total))
	dst = binary.BigEndian.AppendUint16(dst, Magic)
	dst = append(dst, ProtocolVersion, HeaderLen)
	dst = binary.BigEndian.AppendUint32(dst, f.StreamID)
	dst = binary.BigEndian.AppendUint16(dst, f.Flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(f.Name)))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(f.Payload)))
	dst = append(dst, f.Name...)
	dst = append(dst, f.Payload...)
	return dst, nil
}

// Encode returns the wire bytes of f.
func Encode(f *Frame) ([]byte, error) {
	return Append(make([]byte, 0, f.EncodedLen()), f)
}

// DecodeBody decodes the bytes that follow the total_len prefix. The returned
// frame aliases body.
func DecodeBody(body []byte) (Frame, error) {
	if len(body) < HeaderLen || len(body) > MaxBodyLen {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrLength, len(body))
	}
	if m := binary.BigEndian.Uint16(body[0:2]); m != Magic {
		return Frame{}, fmt.Errorf("%w: 0x%04x", ErrMagic, m)
	}
	if body[2] != ProtocolVersion {
		return Frame{}, fmt.Errorf("%w: %d", ErrVersion, body[2])
	}
	if body[3] != HeaderLen {
		return Frame{}, fmt.Errorf("%w: %d", ErrHeaderLen, body[3])
	}
	f := Frame{
		StreamID: binary.BigEndian.Uint32(body[4:8]),
		Flags:    binary.BigEndian.Uint16(body[8:10]),
	}
	nameLen := int(binary.BigEndian.Uint16(body[10:12]))
	payloadLen := int(binary.BigEndian.Uint32(body[12:16]))
	if nameLen > MaxNameLen {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrNameLen, nameLen)
	}
	if HeaderLen+nameLen+payloadLen != len(body) {
		return Frame{}, fmt.Errorf("%w: total %d, name %d, payload %d", ErrLenMismatch, len(body), nameLen, payloadLen)
	}
	f.Name = string(body[HeaderLen : HeaderLen+nameLen])
	f.Payload = body[HeaderLen+nameLen:]
	if err := f.validate(); err != nil {
		return Frame{}, err
	}
	return f, nil
}

// StreamIDHint returns the stream id field of a body that failed to decode, so
// the endpoint can answer on that stream; ok is false if the body is too short.
func StreamIDHint(body []byte) (id uint32, ok bool) {
	if len(body) < 8 {
		return 0, false
	}
	return binary.BigEndian.Uint32(body[4:8]), true
}

// Reader reads frames from a byte stream, reusing one buffer.
type Reader struct {
	r   io.Reader
	buf []byte
	hdr [PrefixLen]byte
}

// NewReader returns a Reader over r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r} }

// ReadBody reads the next length-prefixed body. It returns io.EOF on a clean
// end before a frame, ErrLength when total_len is out of range (the stream is
// then out of sync and must be closed) and io.ErrUnexpectedEOF on a short
// body. The slice is valid until the next call.
func (r *Reader) ReadBody() ([]byte, error) { return r.ReadBodyBudget(nil) }

// keepBufMax is the largest body buffer a Reader keeps between frames: a
// connection idle after one big frame should not hold its megabyte.
const keepBufMax = 64 << 10

// ReadBodyBudget is ReadBody that, once the length prefix is read and
// before any of the body is, calls reserve with the body's length; an error
// from reserve ends the read (the stream is then out of sync).
func (r *Reader) ReadBodyBudget(reserve func(n int) error) ([]byte, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("mcp frame: short length prefix: %w", err)
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(r.hdr[:])
	if n < HeaderLen || n > MaxBodyLen {
		return nil, fmt.Errorf("%w: %d not in [%d, %d]", ErrLength, n, HeaderLen, MaxBodyLen)
	}
	if reserve != nil {
		if err := reserve(int(n)); err != nil {
			return nil, err
		}
	}
	var body []byte
	switch {
	case int(n) > keepBufMax:
		body = make([]byte, n) // not kept: see keepBufMax
	case cap(r.buf) < int(n):
		r.buf = make([]byte, keepBufMax)
		body = r.buf[:n]
	default:
		body = r.buf[:n]
	}
	if _, err := io.ReadFull(r.r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("mcp frame: short body (%d bytes expected): %w", n, err)
	}
	return body, nil
}

// Read reads and decodes the next frame. Body errors (see IsBodyError) leave
// the reader in sync; the returned frame aliases the reader's buffer.
func (r *Reader) Read() (Frame, error) {
	body, err := r.ReadBody()
	if err != nil {
		return Frame{}, err
	}
	return DecodeBody(body)
}

// SanitizeName makes a process name safe for a frame and for the people who
// read it: control and format characters and spaces become '_', invalid UTF-8 becomes U+FFFD, and the result is cut to at
// most MaxNameLen bytes on a rune boundary (the reference panicked here).
func SanitizeName(name string) string {
	out := make([]byte, 0, len(name))
	for _, r := range name {
		// Format characters (U+202E reverses the text around it, U+200B
		// hides) and line separators too: the name is shown to people.
		if r < 0x20 || r == 0x7f || r == ' ' || (r >= 0x80 && r < 0xa0) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp, unicode.Zs) {
			r = '_'
		}
		var enc [utf8.UTFMax]byte
		n := utf8.EncodeRune(enc[:], r)
		if len(out)+n > MaxNameLen {
			break
		}
		out = append(out, enc[:n]...)
	}
	if len(out) == 0 {
		return "unknown"
	}
	return string(out)
}
