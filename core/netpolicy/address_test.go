package netpolicy

import (
	"net/netip"
	"testing"
)

func TestAddressClass(t *testing.T) {
	tests := []struct {
		addr  string
		class string
	}{
		{"8.8.8.8", ""},
		{"93.184.215.14", ""},
		{"100.63.255.255", ""},
		{"100.128.0.1", ""},
		{"172.15.255.255", ""},
		{"172.32.0.1", ""},
		{"203.0.113.7", ""},
		{"2606:4700:4700::1111", ""},
		{"::ffff:8.8.8.8", ""},
		{"64:ff9b::808:808", ""}, // NAT64 of 8.8.8.8
		{"2002:808:808::1", ""},  // 6to4 of 8.8.8.8
		{"127.0.0.1", ClassLoopback},
		{"127.255.255.254", ClassLoopback},
		{"::1", ClassLoopback},
		{"0.0.0.0", ClassUnspecified},
		{"0.1.2.3", ClassThisNetwork},
		{"::", ClassUnspecified},
		{"10.0.0.1", ClassPrivate},
		{"172.16.0.1", ClassPrivate},
		{"172.31.255.255", ClassPrivate},
		{"192.168.1.1", ClassPrivate},
		{"100.64.0.1", ClassCGNAT},
		{"100.127.255.255", ClassCGNAT},
		{"169.254.169.254", ClassMetadata},
		{"fd00:ec2::254", ClassMetadata},
		{"::ffff:169.254.169.254", ClassMetadata},
		{"100.100.100.200", ClassMetadata},
		{"192.0.0.192", ClassMetadata},
		{"169.254.0.1", ClassLinkLocal},
		{"192.0.0.8", ClassReserved},
		{"198.18.0.1", ClassBenchmark},
		{"224.0.0.1", ClassMulticast},
		{"239.255.255.250", ClassMulticast},
		{"240.0.0.1", ClassReserved},
		{"255.255.255.255", ClassBroadcast},
		{"fc00::1", ClassPrivate},
		{"fd12:3456::1", ClassPrivate},
		{"fd00:ec2::253", ClassPrivate},
		{"fe80::1", ClassLinkLocal},
		{"fe80::1%eth0", ClassLinkLocal},
		{"fec0::1", ClassPrivate},
		{"ff02::1", ClassMulticast},
		{"ff05::2", ClassMulticast},
		{"::ffff:127.0.0.1", ClassLoopback},
		{"::ffff:10.0.0.1", ClassPrivate},
		{"::127.0.0.1", ClassReserved},        // deprecated IPv4-compatible
		{"64:ff9b::a9fe:a9fe", ClassMetadata}, // NAT64 of 169.254.169.254
		{"64:ff9b::7f00:1", ClassLoopback},    // NAT64 of 127.0.0.1
		{"64:ff9b:1::808:808", ClassPrivate},  // local-use NAT64
		{"2002:a00:1::1", ClassPrivate},       // 6to4 of 10.0.0.1
		{"2002:7f00:1::1", ClassLoopback},     // 6to4 of 127.0.0.1
		{"2002:a9fe:a9fe::1", ClassMetadata},  // 6to4 of 169.254.169.254
		{"100::1", ClassReserved},             // discard-only
	}
	for _, test := range tests {
		addr := netip.MustParseAddr(test.addr)
		if got := AddressClass(addr); got != test.class {
			t.Errorf("AddressClass(%s) = %q, want %q", test.addr, got, test.class)
		}
		if got := IsPublic(addr); got != (test.class == "") {
			t.Errorf("IsPublic(%s) = %v, want %v", test.addr, got, test.class == "")
		}
	}
	if IsPublic(netip.Addr{}) || AddressClass(netip.Addr{}) != ClassInvalid {
		t.Errorf("the zero Addr: public %v, class %q", IsPublic(netip.Addr{}), AddressClass(netip.Addr{}))
	}
}

// FuzzAddressClass: an address is public exactly when it has no class, and
// its IPv4-mapped, zoned and NAT64 spellings are classified as it is.
func FuzzAddressClass(f *testing.F) {
	for _, seed := range [][]byte{{127, 0, 0, 1}, {8, 8, 8, 8}, {169, 254, 169, 254}, {10, 1, 2, 3}, {0xfd, 0, 0x0e, 0xc2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0x54}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		addr, ok := netip.AddrFromSlice(raw)
		if !ok {
			return
		}
		class := AddressClass(addr)
		if IsPublic(addr) != (class == "") {
			t.Fatalf("%s: IsPublic %v, class %q", addr, IsPublic(addr), class)
		}
		if !addr.Is4() {
			if zoned := addr.WithZone("eth0"); AddressClass(zoned) != class {
				t.Fatalf("%s: the zone changed the class", addr)
			}
			return
		}
		mapped := netip.AddrFrom16(addr.As16())
		bytes := netip.MustParseAddr("64:ff9b::").As16()
		copy(bytes[12:], raw)
		nat64 := netip.AddrFrom16(bytes)
		for _, other := range []netip.Addr{mapped, nat64} {
			if got := AddressClass(other); got != class {
				t.Fatalf("%s is %q but its form %s is %q", addr, class, other, got)
			}
		}
		if class == "" && (addr.IsLoopback() || addr.IsPrivate() || addr.IsMulticast() || addr.IsUnspecified() || addr.IsLinkLocalUnicast()) {
			t.Fatalf("%s is public but the standard library says otherwise", addr)
		}
	})
}
