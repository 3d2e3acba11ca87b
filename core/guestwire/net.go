package guestwire

// The guest network: one virtio NIC whose other end is the per-VM process's
// own TCP/IP stack. The addressing is fixed and the same in every VM (each
// VM's stack is its own, so nothing collides): the host stack and the guest
// agent both read it from here.
const (
	// CmdlineNet=1 tells the agent the VM has a NIC to bring up; absent,
	// it loads no network module.
	CmdlineNet = "capsem.net"
	// NetGatewayIP is the host stack's address: the guest's default route
	// and its DNS resolver.
	NetGatewayIP = "192.168.127.1"
	// NetGuestIP is the guest's address, NetPrefixLen its prefix.
	NetGuestIP   = "192.168.127.2"
	NetPrefixLen = 24
	// NetGatewayMAC and NetGuestMAC are the two ends' hardware addresses
	// (locally administered).
	NetGatewayMAC = "5a:94:ef:e4:0c:dd"
	NetGuestMAC   = "5a:94:ef:e4:0c:ee"
	// GuestResolvConf is the resolver file the agent writes, naming
	// NetGatewayIP.
	GuestResolvConf = "/etc/resolv.conf"
)
