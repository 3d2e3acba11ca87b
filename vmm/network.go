package vmm

// Framing says how Ethernet frames travel on a NIC's host connection.
type Framing int

const (
	// FramingStream4BE: a byte stream, each frame behind its length as 4
	// bytes big-endian (QEMU's stream and socket netdevs).
	FramingStream4BE Framing = iota + 1
	// FramingDatagram: one frame per datagram (a SOCK_DGRAM socket pair).
	FramingDatagram
)
