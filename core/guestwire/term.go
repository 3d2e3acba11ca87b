package guestwire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// The terminal stream, on logical port 5001 (guestchan.PortTerminal): the
// host dials it and sends a TermOpen frame; then both sides send frames of
//
//	kind u8 | length u32 (big endian) | payload
//
// TermData carries terminal bytes either way; TermResize (host to guest)
// a window size, rows then columns, u16 each; TermExit (guest to host,
// last) the shell's exit status as an i32, or 128+N for signal N.
const (
	TermOpenKind   byte = 'o'
	TermDataKind   byte = 'd'
	TermResizeKind byte = 'r'
	TermExitKind   byte = 'x'

	// TermProtocolVersion is TermOpen.Version.
	TermProtocolVersion = 1
	// MaxTermPayload bounds one frame's payload.
	MaxTermPayload = 1 << 20
)

// TermOpen starts a terminal session: the program (default: a login
// shell), its environment additions, working directory and window size.
type TermOpen struct {
	Version int               `json:"version"`
	Argv    []string          `json:"argv,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	Rows    uint16            `json:"rows"`
	Cols    uint16            `json:"cols"`
}

// WriteTermFrame writes one frame.
func WriteTermFrame(w io.Writer, kind byte, payload []byte) error {
	if len(payload) > MaxTermPayload {
		return fmt.Errorf("terminal frame of %d bytes, more than %d", len(payload), MaxTermPayload)
	}
	b := make([]byte, 5+len(payload))
	b[0] = kind
	binary.BigEndian.PutUint32(b[1:5], uint32(len(payload)))
	copy(b[5:], payload)
	_, err := w.Write(b)
	return err
}

// ReadTermFrame reads one frame. The payload is only valid until the next
// read into buf (which grows as needed, up to MaxTermPayload).
func ReadTermFrame(r io.Reader, buf *[]byte) (kind byte, payload []byte, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxTermPayload {
		return 0, nil, fmt.Errorf("terminal frame of %d bytes, more than %d", n, MaxTermPayload)
	}
	switch h[0] {
	case TermOpenKind, TermDataKind, TermResizeKind, TermExitKind:
	default:
		return 0, nil, fmt.Errorf("terminal frame of unknown kind %#x", h[0])
	}
	if cap(*buf) < int(n) {
		*buf = make([]byte, n)
	}
	p := (*buf)[:n]
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, fmt.Errorf("terminal frame cut short: %w", io.ErrUnexpectedEOF)
	}
	return h[0], p, nil
}

// ResizePayload encodes a window size.
func ResizePayload(rows, cols uint16) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b, rows)
	binary.BigEndian.PutUint16(b[2:], cols)
	return b
}

// ParseResize decodes a window size.
func ParseResize(p []byte) (rows, cols uint16, err error) {
	if len(p) != 4 {
		return 0, 0, fmt.Errorf("resize frame of %d bytes, want 4", len(p))
	}
	return binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:]), nil
}

// ExitPayload encodes an exit status.
func ExitPayload(code int32) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(code))
}

// ParseExit decodes an exit status.
func ParseExit(p []byte) (int32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("exit frame of %d bytes, want 4", len(p))
	}
	return int32(binary.BigEndian.Uint32(p)), nil
}

// maxTermArgs bounds a TermOpen's argv and env.
const maxTermArgs = 256

// ParseTermOpen decodes and checks an open frame's payload.
func ParseTermOpen(p []byte) (*TermOpen, error) {
	var o TermOpen
	if err := json.Unmarshal(p, &o); err != nil {
		return nil, fmt.Errorf("terminal open: %w", err)
	}
	if o.Version != TermProtocolVersion {
		return nil, fmt.Errorf("terminal protocol version %d, want %d", o.Version, TermProtocolVersion)
	}
	if len(o.Argv) > maxTermArgs || len(o.Env) > maxTermArgs {
		return nil, errors.New("terminal open: too many arguments or variables")
	}
	for _, a := range o.Argv {
		if !utf8.ValidString(a) || containsNUL(a) {
			return nil, errors.New("terminal open: an argument is not NUL-free UTF-8")
		}
	}
	if len(o.Argv) > 0 && o.Argv[0] == "" {
		return nil, errors.New("terminal open: empty program")
	}
	if err := ValidateEnv(o.Env); err != nil {
		return nil, fmt.Errorf("terminal open: %w", err)
	}
	if o.Cwd != "" {
		if err := ValidatePath(o.Cwd); err != nil {
			return nil, fmt.Errorf("terminal open: cwd: %w", err)
		}
	}
	return &o, nil
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}
