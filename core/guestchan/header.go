package guestchan

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Logical ports, one per service on the channel. The guest dials the host on all of them unless
// a caller says otherwise; the numbers are the same on vsock and on the
// multiplexed serial channel so nothing above this package cares which one
// carries them.
const (
	PortControl    uint32 = 5000 // control: hello, boot config, exec, files, shutdown
	PortTerminal   uint32 = 5001 // interactive PTY
	PortMCP        uint32 = 5002 // framed MCP from the guest relay
	PortEgress     uint32 = 5003 // egress proxy
	PortExecOutput uint32 = 5005 // exec output streams, one per exec
)

// Stream header (every multiplexed stream starts with it, sent by the side
// that opened the stream):
//
//	offset 0  2 bytes  magic "CS"
//	offset 2  1 byte   version (ProtocolVersion)
//	offset 3  1 byte   reserved, must be 0
//	offset 4  4 bytes  logical port, big-endian
//
// The accepting side answers with a reply before any payload:
//
//	offset 0  2 bytes  magic "CS"
//	offset 2  1 byte   version the acceptor speaks
//	offset 3  1 byte   status (replyOK, replyNoListener, replyBadHeader)
//
// The reply costs one round trip per stream but lets Dial fail with a clear
// error (no listener, version mismatch) instead of a bare EOF later.
const (
	HeaderSize      = 8
	ReplySize       = 4
	ProtocolVersion = 1

	magic0 = 'C'
	magic1 = 'S'

	replyOK         byte = 0
	replyNoListener byte = 1
	replyBadHeader  byte = 2
)

// Errors callers can test with errors.Is.
var (
	// ErrBadHeader: a stream header (or reply) is malformed or of an
	// unsupported version. Only that stream is closed.
	ErrBadHeader = errors.New("bad stream header")
	// ErrNoListener: the peer has no listener on the dialled port.
	ErrNoListener = errors.New("no listener on port")
	// ErrClosed: the channel is closed, locally or because the connection
	// to the peer died.
	ErrClosed = errors.New("channel closed")
	// ErrPortInUse: Listen on a port that already has a listener.
	ErrPortInUse = errors.New("port already has a listener")
)

// AppendHeader appends the stream header for port to dst.
func AppendHeader(dst []byte, port uint32) []byte {
	dst = append(dst, magic0, magic1, ProtocolVersion, 0)
	return binary.BigEndian.AppendUint32(dst, port)
}

// ParseHeader parses a stream header. b must be exactly HeaderSize bytes.
func ParseHeader(b []byte) (port uint32, err error) {
	if len(b) != HeaderSize {
		return 0, fmt.Errorf("guestchan: %w: %d bytes, want %d", ErrBadHeader, len(b), HeaderSize)
	}
	if b[0] != magic0 || b[1] != magic1 {
		return 0, fmt.Errorf("guestchan: %w: magic %q, want %q", ErrBadHeader, b[:2], "CS")
	}
	if b[2] != ProtocolVersion {
		return 0, fmt.Errorf("guestchan: %w: version %d, this side speaks %d", ErrBadHeader, b[2], ProtocolVersion)
	}
	if b[3] != 0 {
		return 0, fmt.Errorf("guestchan: %w: reserved byte is %#x, must be 0", ErrBadHeader, b[3])
	}
	return binary.BigEndian.Uint32(b[4:]), nil
}

func appendReply(dst []byte, status byte) []byte {
	return append(dst, magic0, magic1, ProtocolVersion, status)
}

// parseReply turns the acceptor's reply into nil or an error naming why the
// stream was refused (without a package prefix: Dial adds its own).
func parseReply(b []byte, port uint32) error {
	if len(b) != ReplySize || b[0] != magic0 || b[1] != magic1 {
		return fmt.Errorf("%w: malformed reply %q for port %d", ErrBadHeader, b, port)
	}
	switch b[3] {
	case replyOK:
		return nil
	case replyNoListener:
		return fmt.Errorf("%w %d", ErrNoListener, port)
	case replyBadHeader:
		return fmt.Errorf("%w: peer (version %d) refused our version %d header for port %d",
			ErrBadHeader, b[2], ProtocolVersion, port)
	default:
		return fmt.Errorf("%w: unknown reply status %d for port %d", ErrBadHeader, b[3], port)
	}
}
