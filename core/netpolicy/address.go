package netpolicy

import "net/netip"

// Address classes AddressClass gives; "" is a public address.
const (
	ClassInvalid     = "invalid"     // the zero netip.Addr
	ClassUnspecified = "unspecified" // 0.0.0.0, ::
	ClassThisNetwork = "this-network"
	ClassLoopback    = "loopback"
	ClassPrivate     = "private"
	ClassCGNAT       = "cgnat"
	ClassLinkLocal   = "link-local"
	ClassMetadata    = "metadata"
	ClassMulticast   = "multicast"
	ClassBroadcast   = "broadcast"
	ClassBenchmark   = "benchmark"
	ClassReserved    = "reserved"
)

// classedPrefix is a range of non-public addresses and its class.
type classedPrefix struct {
	prefix netip.Prefix
	class  string
}

// nonPublicPrefixes are the addresses that are not public, most specific
// first (the first match names the class). Any of them could reach the host
// itself, its LAN or its cloud metadata service. IPv4-mapped addresses are
// unmapped before the lookup, and addresses that embed an IPv4 address
// (NAT64, 6to4) are classified by that address.
var nonPublicPrefixes = func() []classedPrefix {
	var prefixes []classedPrefix
	for _, entry := range []struct{ prefix, class string }{
		{"169.254.169.254/32", ClassMetadata},  // AWS, GCP, Azure, OpenStack …
		{"fd00:ec2::254/128", ClassMetadata},   // AWS over IPv6
		{"100.100.100.200/32", ClassMetadata},  // Alibaba Cloud
		{"192.0.0.192/32", ClassMetadata},      // Oracle Cloud (classic)
		{"0.0.0.0/32", ClassUnspecified},       // reaches the local host on Linux
		{"0.0.0.0/8", ClassThisNetwork},        // "this network"
		{"10.0.0.0/8", ClassPrivate},           // RFC 1918
		{"100.64.0.0/10", ClassCGNAT},          // carrier-grade NAT (RFC 6598)
		{"127.0.0.0/8", ClassLoopback},         //
		{"169.254.0.0/16", ClassLinkLocal},     //
		{"172.16.0.0/12", ClassPrivate},        // RFC 1918
		{"192.0.0.0/24", ClassReserved},        // IETF protocol assignments
		{"192.168.0.0/16", ClassPrivate},       // RFC 1918
		{"198.18.0.0/15", ClassBenchmark},      // benchmarking, used as internal space in practice
		{"224.0.0.0/4", ClassMulticast},        //
		{"255.255.255.255/32", ClassBroadcast}, //
		{"240.0.0.0/4", ClassReserved},         //
		{"::/128", ClassUnspecified},           //
		{"::1/128", ClassLoopback},             //
		{"::/96", ClassReserved},               // deprecated IPv4-compatible
		{"64:ff9b:1::/48", ClassPrivate},       // local-use NAT64 (RFC 8215)
		{"100::/64", ClassReserved},            // discard-only
		{"fc00::/7", ClassPrivate},             // unique local
		{"fe80::/10", ClassLinkLocal},          //
		{"fec0::/10", ClassPrivate},            // deprecated site-local
		{"ff00::/8", ClassMulticast},           //
	} {
		prefixes = append(prefixes, classedPrefix{netip.MustParsePrefix(entry.prefix), entry.class})
	}
	return prefixes
}()

// Prefixes whose addresses carry an IPv4 address that decides for them.
var (
	nat64Prefix     = netip.MustParsePrefix("64:ff9b::/96") // IPv4 in the last 32 bits
	sixToFourPrefix = netip.MustParsePrefix("2002::/16")    // IPv4 in bits 16–47
)

// IsPublic reports whether addr is a public address: not loopback, private,
// link-local, metadata, carrier-grade NAT, unspecified, multicast, reserved
// or benchmarking space, nor an IPv4-mapped or embedded (NAT64, 6to4) form
// of one. The zero Addr is not public.
func IsPublic(addr netip.Addr) bool { return AddressClass(addr) == "" }

// AddressClass is "" for a public address, else a short word saying what the
// address is: one of the Class constants.
func AddressClass(addr netip.Addr) string {
	if !addr.IsValid() {
		return ClassInvalid
	}
	// netip.Prefix.Contains never matches a zoned or mapped address.
	addr = addr.WithZone("").Unmap()
	if addr.Is6() {
		bytes := addr.As16()
		switch {
		case nat64Prefix.Contains(addr):
			return AddressClass(netip.AddrFrom4([4]byte(bytes[12:16])))
		case sixToFourPrefix.Contains(addr):
			return AddressClass(netip.AddrFrom4([4]byte(bytes[2:6])))
		}
	}
	for _, entry := range nonPublicPrefixes {
		if entry.prefix.Contains(addr) {
			return entry.class
		}
	}
	// The table covers these; the standard predicates stay so a range the
	// library learns about later is refused too.
	switch {
	case addr.IsLoopback():
		return ClassLoopback
	case addr.IsPrivate():
		return ClassPrivate
	case addr.IsUnspecified():
		return ClassUnspecified
	case addr.IsMulticast(), addr.IsLinkLocalMulticast(), addr.IsInterfaceLocalMulticast():
		return ClassMulticast
	case addr.IsLinkLocalUnicast():
		return ClassLinkLocal
	}
	return ""
}
