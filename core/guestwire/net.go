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
	// GuestCAFile is the capsem CA the guest trusts when the host adds
	// credentials to its requests (BootConfig.TrustCA); GuestCABundle is
	// the system roots with it; GuestSystemBundle is the distribution's
	// bundle, which gets the CA appended for programs that read only it.
	GuestCAFile       = "/etc/capsem/ca.pem"
	GuestCABundle     = "/etc/capsem/ca-bundle.pem"
	GuestSystemBundle = "/etc/ssl/certs/ca-certificates.crt"
	// GuestExtraCAs holds only what capsem adds to the distribution's
	// roots (the capsem CA, the extra roots), for clients that add a file
	// to their own roots rather than replace them (Node's
	// NODE_EXTRA_CA_CERTS; Claude Code's runtime refuses the whole bundle
	// there).
	GuestExtraCAs = "/etc/capsem/extra-cas.pem"
)

// PlaceholderPrefix starts every credential placeholder the guest is given
// in place of a secret, so one is recognisable wherever it turns up.
const PlaceholderPrefix = "capsem-placeholder-"

// TrustEnv points TLS clients at the bundle with the capsem CA and the
// extra roots: OpenSSL and Go (SSL_CERT_FILE), Python requests, Node
// (which adds what it names to its own roots).
func TrustEnv() map[string]string {
	return map[string]string{
		"SSL_CERT_FILE":       GuestCABundle,
		"REQUESTS_CA_BUNDLE":  GuestCABundle,
		"NODE_EXTRA_CA_CERTS": GuestExtraCAs,
	}
}
