package vmm

import "net"

// Framing says how Ethernet frames travel on a NIC's host connection.
type Framing int

const (
	// FramingStream4BE: a byte stream, each frame behind its length as 4
	// bytes big-endian (QEMU's stream and socket netdevs).
	FramingStream4BE Framing = iota + 1
	// FramingDatagram: one frame per datagram (a SOCK_DGRAM socket pair).
	FramingDatagram
)

// Network is a VM's NIC (temporary stand-in until the vmm branch lands).
type Network struct {
	MAC string
	MTU int
}

// NetworkHolder gives the host end of the NIC once Start returned.
type NetworkHolder interface {
	NetworkConn() (conn net.Conn, framing Framing, ok bool)
}
