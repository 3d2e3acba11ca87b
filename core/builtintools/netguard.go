package builtintools

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// MatchedRulePrivateNetwork is NetEvent.MatchedRule for a connection
// refused because its address is not public (see Config.AllowPrivateNetworks).
const MatchedRulePrivateNetwork = "private-network"

// privateNetworkHint ends every private-address refusal: the agent reads it,
// and the operator knows which setting to change.
const privateNetworkHint = "set allow_private_networks to permit"

// nonPublicPrefixes are refused unless private networks are allowed. The
// builtin runs on the host for an agent in a sandbox VM, so any of these
// could reach the host itself, its LAN or its cloud metadata service.
// IPv4-mapped addresses are unmapped before the check, and addresses that
// embed an IPv4 address (NAT64, 6to4) are checked by that address.
var nonPublicPrefixes = func() []netip.Prefix {
	var prefixes []netip.Prefix
	for _, text := range []string{
		"0.0.0.0/8",      // "this network"; 0.0.0.0 reaches the local host on Linux
		"10.0.0.0/8",     // private (RFC 1918)
		"100.64.0.0/10",  // carrier-grade NAT (RFC 6598)
		"127.0.0.0/8",    // loopback
		"169.254.0.0/16", // link-local, including 169.254.169.254 cloud metadata
		"172.16.0.0/12",  // private (RFC 1918)
		"192.0.0.0/24",   // IETF protocol assignments (e.g. 192.0.0.192 metadata on some clouds)
		"192.168.0.0/16", // private (RFC 1918)
		"198.18.0.0/15",  // benchmarking, used as internal space in practice
		"224.0.0.0/4",    // multicast
		"240.0.0.0/4",    // reserved, and 255.255.255.255 broadcast
		"::/96",          // unspecified (::), loopback (::1), deprecated IPv4-compatible
		"64:ff9b:1::/48", // local-use NAT64 (RFC 8215)
		"100::/64",       // discard-only
		"fc00::/7",       // unique local (private)
		"fe80::/10",      // link-local
		"fec0::/10",      // deprecated site-local
		"ff00::/8",       // multicast
	} {
		prefixes = append(prefixes, netip.MustParsePrefix(text))
	}
	return prefixes
}()

// Prefixes whose addresses carry an IPv4 address that decides for them.
var (
	nat64Prefix     = netip.MustParsePrefix("64:ff9b::/96") // IPv4 in the last 32 bits
	sixToFourPrefix = netip.MustParsePrefix("2002::/16")    // IPv4 in bits 16–47
)

// isPublicAddress reports whether addr may be dialed when private networks
// are not allowed. The zero Addr is not public.
func isPublicAddress(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	// netip.Prefix.Contains never matches a zoned or mapped address.
	addr = addr.WithZone("").Unmap()
	if addr.Is6() {
		bytes := addr.As16()
		switch {
		case nat64Prefix.Contains(addr):
			return isPublicAddress(netip.AddrFrom4([4]byte(bytes[12:16])))
		case sixToFourPrefix.Contains(addr):
			return isPublicAddress(netip.AddrFrom4([4]byte(bytes[2:6])))
		}
	}
	// The standard predicates overlap the table; they are kept so a range
	// the library learns about later is refused too.
	if addr.IsLoopback() || addr.IsPrivate() || addr.IsUnspecified() || addr.IsMulticast() ||
		addr.IsLinkLocalUnicast() || addr.IsLinkLocalMulticast() || addr.IsInterfaceLocalMulticast() {
		return false
	}
	for _, prefix := range nonPublicPrefixes {
		if prefix.Contains(addr) {
			return false
		}
	}
	return true
}

// privateAddressError is a connection the dialer refused because the
// destination address is not public.
type privateAddressError struct {
	host string     // as the URL named it: an IP literal or a host name
	addr netip.Addr // the refused address (host itself for a literal)
}

func (e *privateAddressError) Error() string {
	return fmt.Sprintf("connection to %s refused: %s", e.host, e.reason())
}

// reason is the text after the host in the tool's error and in the net event.
func (e *privateAddressError) reason() string {
	if literal, err := netip.ParseAddr(e.host); err == nil && literal == e.addr {
		return "private or loopback address; " + privateNetworkHint
	}
	return fmt.Sprintf("resolves to %s, a private or loopback address; %s", e.addr, privateNetworkHint)
}

// netHooks are the two network primitives under the guard: resolving a
// name, and connecting to one IP address ("ip:port"). Tests replace them to
// give made-up names addresses and to route every connection to a loopback
// server; the guard between them is the same either way.
type netHooks struct {
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	dial   func(ctx context.Context, network, address string) (net.Conn, error)
}

// Dial timeouts. One attempt never gets less than minAttemptTimeout of the
// time left unless less is left (the rule net.Dialer uses).
const (
	attemptTimeout    = 15 * time.Second
	minAttemptTimeout = 2 * time.Second
)

// systemNetHooks resolve with the system resolver and connect with a
// net.Dialer. When private networks are not allowed, the dialer's Control
// checks the address of the very socket being connected as well, so no
// path to connect() skips the check.
func systemNetHooks(allowPrivate bool) netHooks {
	dialer := &net.Dialer{Timeout: attemptTimeout, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		dialer.Control = func(_, address string, _ syscall.RawConn) error {
			addrPort, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("cannot check the address %q: %w", address, err)
			}
			if !isPublicAddress(addrPort.Addr()) {
				return &privateAddressError{host: addrPort.Addr().String(), addr: addrPort.Addr()}
			}
			return nil
		}
	}
	return netHooks{
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		},
		dial: dialer.DialContext,
	}
}

// guardedDialer is the transport's DialContext. It resolves the host once,
// refuses the connection if any resolved address is not public (unless
// allowed), and then connects only to the addresses it checked, so a DNS
// answer that changes between check and connect (rebinding) cannot slip a
// private address through. Every connection, for the first request and for
// each redirect hop, goes through here.
type guardedDialer struct {
	allowPrivate bool
	hooks        netHooks
}

func (d *guardedDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return nil, &net.AddrError{Err: "invalid port", Addr: address}
	}
	addrs, err := d.resolve(ctx, network, host)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	if !d.allowPrivate {
		// One non-public answer refuses the name: a record set mixing
		// public and private addresses is a rebinding attempt or a
		// misconfiguration, and neither should reach the private one.
		for _, addr := range addrs {
			if !isPublicAddress(addr) {
				return nil, &privateAddressError{host: host, addr: addr}
			}
		}
	}
	var firstErr error
	for i, addr := range addrs {
		attemptCtx, cancel := attemptContext(ctx, len(addrs)-i)
		conn, err := d.hooks.dial(attemptCtx, network, netip.AddrPortFrom(addr, uint16(port)).String())
		cancel() // a connected socket does not depend on the context
		if err == nil {
			return conn, nil
		}
		if firstErr == nil {
			firstErr = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, firstErr
}

// resolve gives the addresses to connect to: the literal itself, or the
// name's addresses of the family the network asks for.
func (d *guardedDialer) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if literal, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{literal}, nil
	}
	resolved, err := d.hooks.lookup(ctx, host)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	for _, addr := range resolved {
		if addr.Is4In6() {
			addr = addr.Unmap()
		}
		switch {
		case network == "tcp4" && !addr.Is4(), network == "tcp6" && !addr.Is6():
			continue
		}
		addrs = append(addrs, addr)
	}
	if len(addrs) == 0 {
		if len(resolved) == 0 {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return nil, &net.AddrError{Err: "no suitable address found", Addr: host}
	}
	return addrs, nil
}

// attemptContext shares the time left among the addresses still to try.
func attemptContext(ctx context.Context, addressesLeft int) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok || addressesLeft <= 1 {
		return context.WithCancel(ctx)
	}
	left := time.Until(deadline)
	timeout := left / time.Duration(addressesLeft)
	if timeout < minAttemptTimeout {
		timeout = min(minAttemptTimeout, left)
	}
	return context.WithTimeout(ctx, timeout)
}

// asPrivateAddressError finds a guard refusal inside a transport error.
func asPrivateAddressError(err error) (*privateAddressError, bool) {
	var refused *privateAddressError
	ok := errors.As(err, &refused)
	return refused, ok
}
