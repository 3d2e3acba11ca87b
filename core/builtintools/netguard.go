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

	"github.com/capsem/capsem/core/netpolicy"
)

// MatchedRulePrivateNetwork is NetEvent.MatchedRule for a connection
// refused because its address is not public (see Config.AllowPrivateNetworks).
const MatchedRulePrivateNetwork = "private-network"

// privateNetworkHint ends every private-address refusal: the agent reads it,
// and the operator knows which setting to change.
const privateNetworkHint = "set allow_private_networks to permit"

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
			if !netpolicy.IsPublic(addrPort.Addr()) {
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
			if !netpolicy.IsPublic(addr) {
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
