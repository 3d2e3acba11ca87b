package netpolicy

// Temporary stand-ins until the netpolicy branch lands (deleted at merge).

import (
	"net/netip"
	"strings"
)

func NormalizeHost(h string) (string, error) { return strings.ToLower(strings.TrimSuffix(h, ".")), nil }
func IsPublic(a netip.Addr) bool {
	return !(a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsUnspecified())
}
func AddressClass(a netip.Addr) string {
	if IsPublic(a) {
		return ""
	}
	return "private"
}
