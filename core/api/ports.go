package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// PortMapping publishes a guest TCP port on the host: a listener on
// Address:Host whose connections reach the guest's port Guest through the
// VM's network stack.
type PortMapping struct {
	// Address is the host address listened on: an IP literal, ""
	// meaning DefaultPortAddress (loopback). Anything else, 0.0.0.0
	// included, must be asked for.
	Address string `json:"address,omitempty" jsonschema:"the host address to listen on, an IP address (default 127.0.0.1: only this host reaches the port)"`
	Host    int    `json:"host" jsonschema:"the host's port, 1 to 65535"`
	Guest   int    `json:"guest" jsonschema:"the guest's port it reaches, 1 to 65535"`
}

// DefaultPortAddress is where a published port listens unless another
// address is given: loopback, so only this host reaches the guest.
const DefaultPortAddress = "127.0.0.1"

// MaxPorts bounds the ports one VM publishes (each is a listener in its
// process).
const MaxPorts = 64

// ParsePortMapping reads [ADDR:]HOST:GUEST, the form of capsem create
// --port and capsem port-forward: 8080:3000, 127.0.0.1:8080:3000,
// [::1]:8080:3000. The mapping is checked (Check), and its address
// filled in.
func ParsePortMapping(s string) (PortMapping, error) {
	bad := func(why string) (PortMapping, error) {
		return PortMapping{}, fmt.Errorf("port %q: %s (want [ADDR:]HOST:GUEST, such as 8080:3000 or 127.0.0.1:8080:3000)", s, why)
	}
	rest, guest, ok := cutLast(s, ":")
	if !ok {
		return bad("no guest port")
	}
	var m PortMapping
	host := rest
	if strings.Contains(rest, ":") {
		addr, p, err := net.SplitHostPort(rest)
		if err != nil {
			// A bare IPv6 address ("::1:8080:3000") lands here.
			return bad("the address is not an IP address (an IPv6 one goes in brackets, [::1])")
		}
		if addr == "" {
			return bad("empty address")
		}
		m.Address, host = addr, p
	}
	var err error
	if m.Host, err = portNumber(host); err != nil {
		return bad("host port " + err.Error())
	}
	if m.Guest, err = portNumber(guest); err != nil {
		return bad("guest port " + err.Error())
	}
	if err := m.Check(); err != nil {
		return PortMapping{}, err
	}
	return m.Normalized(), nil
}

// ParsePortMappings reads a VM's ports (ParsePortMapping each) and
// checks them together (CheckPorts).
func ParsePortMappings(values []string) ([]PortMapping, error) {
	var ports []PortMapping
	for _, s := range values {
		m, err := ParsePortMapping(s)
		if err != nil {
			return nil, err
		}
		ports = append(ports, m)
	}
	if err := CheckPorts(ports); err != nil {
		return nil, err
	}
	return ports, nil
}

func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// portNumber reads a decimal port number; the range is Check's.
func portNumber(s string) (int, error) {
	if s == "" {
		return 0, errors.New("is empty")
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Errorf("%q is not a number", s)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > 65535 {
		return 0, fmt.Errorf("%s: want 1 to 65535", s)
	}
	return n, nil
}

// Check reports what makes m unusable, naming it.
func (m PortMapping) Check() error {
	switch {
	case m.Host < 1 || m.Host > 65535:
		return fmt.Errorf("port %s: host port %d: want 1 to 65535", m, m.Host)
	case m.Guest < 1 || m.Guest > 65535:
		return fmt.Errorf("port %s: guest port %d: want 1 to 65535", m, m.Guest)
	}
	if m.Address != "" {
		a, err := netip.ParseAddr(m.Address)
		if err != nil || a.Zone() != "" {
			return fmt.Errorf("port %s: address %q: want an IP address, such as 127.0.0.1 or ::1", m, m.Address)
		}
	}
	return nil
}

// Normalized is m with its address filled in (DefaultPortAddress) and
// spelled canonically (an IPv4-mapped IPv6 address as IPv4).
func (m PortMapping) Normalized() PortMapping {
	if m.Address == "" {
		m.Address = DefaultPortAddress
	} else if a, err := netip.ParseAddr(m.Address); err == nil {
		m.Address = a.Unmap().String()
	}
	return m
}

// Listen is the host address m listens on, as net.Listen takes it.
func (m PortMapping) Listen() string {
	return net.JoinHostPort(m.Normalized().Address, strconv.Itoa(m.Host))
}

// String is m as ParsePortMapping reads it.
func (m PortMapping) String() string {
	g := strconv.Itoa(m.Guest)
	if m.Address == "" {
		return strconv.Itoa(m.Host) + ":" + g
	}
	return net.JoinHostPort(m.Address, strconv.Itoa(m.Host)) + ":" + g
}

// CheckPorts checks every mapping of a VM and that no host address and
// port is published twice, naming the bad entry.
func CheckPorts(ports []PortMapping) error {
	if len(ports) > MaxPorts {
		return fmt.Errorf("ports: %d mappings, more than %d", len(ports), MaxPorts)
	}
	seen := map[string]bool{}
	for _, p := range ports {
		if err := p.Check(); err != nil {
			return err
		}
		l := p.Listen()
		if seen[l] {
			return fmt.Errorf("port %s: host port %s is published twice", p, l)
		}
		seen[l] = true
	}
	return nil
}

// UnmarshalText reads m from the [ADDR:]HOST:GUEST form
// (ParsePortMapping), as command-line flags give it.
func (m *PortMapping) UnmarshalText(b []byte) error {
	p, err := ParsePortMapping(string(b))
	if err != nil {
		return err
	}
	*m = p
	return nil
}

// UnmarshalJSON reads m from its JSON object, refusing fields it does
// not have; without it, encoding/json would take UnmarshalText for the
// object form too.
func (m *PortMapping) UnmarshalJSON(b []byte) error {
	type object PortMapping
	var o object
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return err
	}
	*m = PortMapping(o)
	return nil
}
