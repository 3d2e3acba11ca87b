package netpolicy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Layer is one file's [net] table. Compile takes layers highest precedence
// first (corp.toml, then user.toml).
type Layer struct {
	// Source names the file in errors and verdicts; "" leaves it out.
	Source string
	// Default is the layer's opinion on a name its Allow list does not
	// match: "allow", "block", or "" for none.
	Default string
	// Allow and Block hold patterns (see ParsePattern). Allow may also
	// hold IP addresses, which Address allows directly.
	Allow, Block []string
	// Ports are the destination ports the layer allows; it sets them when
	// PortsSet is true or the list is not empty (so a file can say
	// "ports = []": no port at all).
	Ports    []int
	PortsSet bool
	// AllowPrivate are the patterns of names (and IP addresses) that may
	// reach non-public addresses; set as Ports is.
	AllowPrivate    []string
	AllowPrivateSet bool
	// Hosts are fixed DNS answers: name → IPv4 address.
	Hosts map[string]string
	// Credentials are the [[net.credentials]] entries.
	Credentials []Credential
	// GuestRoots are PEM files, "~/…" or absolute, globs allowed, of CA
	// certificates the guest's TLS clients trust beside the
	// distribution's (a proxy's CA the host trusts too).
	GuestRoots []string
}

// Keys of the [net] table, as verdicts and entries name them.
const (
	KeyDefault      = "net.default"
	KeyAllow        = "net.allow"
	KeyBlock        = "net.block"
	KeyPorts        = "net.ports"
	KeyAllowPrivate = "net.allow_private"
	KeyHosts        = "net.hosts"
	KeyGuestRoots   = "net.guest_roots"
	// RulePrivateAddress is Verdict.Rule for an address refused because
	// it is not public and not in allow_private.
	RulePrivateAddress = "private-address"
)

// maxReportedErrors bounds the problems one Compile reports, so a file of
// thousands of bad entries gives a readable error.
const maxReportedErrors = 20

// defaultPorts are allowed when no layer sets ports.
var defaultPorts = []uint16{80, 443}

// Policy is the compiled [net] policy of a configuration hierarchy. A name
// is allowed when no layer blocks it, no layer's opinion on it is block,
// and at least one layer's opinion is allow: a lower file can only tighten
// what a higher one allows. It is immutable after Compile and safe for
// concurrent use.
type Policy struct {
	layers []compiledLayer
	// block is every layer's block list; for a pattern in several layers,
	// the highest one's.
	block patternSet[ref]
	// ports are the allowed ports, sorted; portsSource is the highest file
	// that sets ports ("" for the default).
	ports       []uint16
	portsSource string
	hosts       map[string]fixedHost
	credentials credentialSet
	entries     []Entry
	guestRoots  []string
}

// ref is a configured pattern and the file it came from.
type ref struct {
	pattern string
	source  string
}

type compiledLayer struct {
	source     string
	def        string
	allow      patternSet[string]
	ports      []uint16 // sorted; nil unless portsSet
	portsSet   bool
	private    patternSet[string]
	privateSet bool
}

type fixedHost struct {
	addr   netip.Addr
	source string
}

// Entry is one configured [net] entry, as `capsem policy check` shows it.
type Entry struct {
	Key    string // one of the Key constants
	Value  string // a pattern, "block", "80, 443", "llm.internal = 127.0.0.1"
	Source string // the file; "" for a built-in default
	// Note says how the rest of the policy limits the entry, if it does.
	Note string
}

// higherAllows names the first of layers whose opinion on host is allow
// (its allow list or its default), or "".
func higherAllows(layers []compiledLayer, host string) string {
	for i := range layers {
		l := &layers[i]
		if _, ok := l.allow.match(host); ok || l.def == "allow" {
			return l.source
		}
	}
	return ""
}

// Default is the policy with no layers: every name is refused, ports 80
// and 443.
func Default() *Policy {
	p, err := Compile(nil)
	if err != nil {
		panic("netpolicy: the empty policy does not compile: " + err.Error())
	}
	return p
}

// Compile builds the policy from layers given highest precedence first.
// Every problem is reported, each naming the file, the key and the reason.
func Compile(layers []Layer) (*Policy, error) {
	p := &Policy{hosts: map[string]fixedHost{}}
	var errs []error
	for _, l := range layers {
		c, layerErrs := compileLayer(l)
		errs = append(errs, layerErrs...)
		p.layers = append(p.layers, c)
		for _, entry := range l.Block {
			if pattern, err := ParsePattern(entry); err == nil {
				p.block.add(pattern, ref{pattern: pattern.String(), source: l.Source})
			}
		}
		for _, name := range slices.Sorted(maps.Keys(l.Hosts)) {
			host, addr, err := parseFixedHost(name, l.Hosts[name])
			if err != nil {
				continue // compileLayer reported it
			}
			if _, ok := p.hosts[host]; ok {
				continue
			}
			if higherAllows(p.layers[:len(p.layers)-1], host) != "" {
				// A higher file allows the name itself: it means the
				// name's real addresses, which a lower file may not
				// redirect (to any address it likes).
				continue
			}
			p.hosts[host] = fixedHost{addr: addr, source: l.Source}
		}
		for i, c := range l.Credentials {
			fail := func(format string, args ...any) {
				where := fmt.Sprintf("%s[%d]", KeyCredentials, i)
				if l.Source != "" {
					where = l.Source + ": " + where
				}
				errs = append(errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
			}
			if r, ok := compileCredential(c, l.Source, fail); ok {
				p.credentials.add(r, i)
			}
		}
	}
	if len(errs) > maxReportedErrors {
		errs = append(errs[:maxReportedErrors], fmt.Errorf("and %d more problems", len(errs)-maxReportedErrors))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	p.ports = slices.Clone(defaultPorts)
	first := true
	for _, l := range p.layers {
		if !l.portsSet {
			continue
		}
		if first {
			p.ports, p.portsSource, first = slices.Clone(l.ports), l.source, false
			continue
		}
		p.ports = slices.DeleteFunc(p.ports, func(port uint16) bool { _, found := slices.BinarySearch(l.ports, port); return !found })
	}
	for _, l := range layers {
		for _, r := range l.GuestRoots {
			if !slices.Contains(p.guestRoots, r) {
				p.guestRoots = append(p.guestRoots, r)
			}
		}
	}
	p.entries = p.describe(layers)
	return p, nil
}

// compileLayer checks and indexes one layer.
func compileLayer(l Layer) (compiledLayer, []error) {
	c := compiledLayer{source: l.Source, def: l.Default}
	var errs []error
	fail := func(key, format string, args ...any) {
		where := key
		if l.Source != "" {
			where = l.Source + ": " + key
		}
		errs = append(errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
	}
	switch l.Default {
	case "", "allow", "block":
	default:
		fail(KeyDefault, "%q is not allow or block", l.Default)
	}
	for _, entry := range l.Block {
		if _, err := ParsePattern(entry); err != nil {
			fail(KeyBlock, "%v", err)
		}
	}
	for _, entry := range l.Allow {
		pattern, err := ParsePattern(entry)
		if err != nil {
			fail(KeyAllow, "%v", err)
			continue
		}
		c.allow.add(pattern, pattern.String())
	}
	c.portsSet = l.PortsSet || len(l.Ports) > 0
	if c.portsSet {
		c.ports = []uint16{}
	}
	for _, port := range l.Ports {
		if port < 1 || port > 65535 {
			fail(KeyPorts, "%d is not a port (1-65535)", port)
			continue
		}
		if i, found := slices.BinarySearch(c.ports, uint16(port)); !found {
			c.ports = slices.Insert(c.ports, i, uint16(port))
		}
	}
	c.privateSet = l.AllowPrivateSet || len(l.AllowPrivate) > 0
	for _, entry := range l.AllowPrivate {
		pattern, err := ParsePattern(entry)
		if err != nil {
			fail(KeyAllowPrivate, "%v", err)
			continue
		}
		c.private.add(pattern, pattern.String())
	}
	for _, p := range l.GuestRoots {
		switch _, err := filepath.Match(p, ""); {
		case !filepath.IsAbs(p) && !strings.HasPrefix(p, "~/"):
			fail(KeyGuestRoots, "%q: want an absolute path or ~/…", p)
		case err != nil:
			fail(KeyGuestRoots, "%q: %v", p, err)
		}
	}
	spelled := map[string]string{} // normalized → as written, to catch two spellings of one name
	for _, name := range slices.Sorted(maps.Keys(l.Hosts)) {
		host, _, err := parseFixedHost(name, l.Hosts[name])
		if err != nil {
			fail(KeyHosts, "%v", err)
			continue
		}
		if other, ok := spelled[host]; ok {
			fail(KeyHosts, "%q and %q name the same host", other, name)
		}
		spelled[host] = name
	}
	return c, errs
}

// parseFixedHost checks one hosts entry: an exact name and an IPv4 address.
func parseFixedHost(name, value string) (string, netip.Addr, error) {
	if strings.Contains(name, "*") {
		return "", netip.Addr{}, fmt.Errorf("%q: a fixed answer needs an exact name, not a pattern", name)
	}
	host, err := NormalizeHost(name)
	if err != nil {
		return "", netip.Addr{}, fmt.Errorf("%q: %w", name, err)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return "", netip.Addr{}, fmt.Errorf("%q is an IP address; a fixed answer needs a name", name)
	}
	addr, err := netip.ParseAddr(strings.TrimSpace(value))
	switch {
	case err != nil:
		return "", netip.Addr{}, fmt.Errorf("%q = %q: not an IPv4 address", name, value)
	case !addr.Is4():
		return "", netip.Addr{}, fmt.Errorf("%q = %q: an IPv6 address; fixed answers are IPv4 only (the guest network is IPv4)", name, value)
	}
	return host, addr, nil
}

// describe names a source in messages.
func describe(source string) string {
	if source == "" {
		return "(built-in)"
	}
	return source
}

// Name decides whether the guest may reach a name (normalized here). An IP
// address given as a name is decided by the IP entries of allow and block;
// whether a non-public address may be reached is for Address or
// PrivateAllowed to say.
func (p *Policy) Name(name string) Verdict {
	host, err := NormalizeHost(name)
	if err != nil {
		return Verdict{Reason: "invalid name: " + err.Error()}
	}
	return p.decide(host)
}

// decide applies the name rules to a normalized host: block lists first,
// then every layer's opinion.
func (p *Policy) decide(host string) Verdict {
	if r, ok := p.block.match(host); ok {
		return Verdict{Rule: r.pattern, Source: r.source, Reason: fmt.Sprintf("%s blocked by net.block %q", host, r.pattern)}
	}
	var byPattern, byDefault *compiledLayer
	var pattern string
	for i := range p.layers {
		l := &p.layers[i]
		if matched, ok := l.allow.match(host); ok {
			if byPattern == nil {
				byPattern, pattern = l, matched
			}
			continue
		}
		switch l.def {
		case "block":
			return Verdict{Rule: KeyDefault, Source: l.source,
				Reason: fmt.Sprintf("%s is not in net.allow of %s, whose net.default is block", host, describe(l.source))}
		case "allow":
			if byDefault == nil {
				byDefault = l
			}
		}
	}
	switch {
	case byPattern != nil:
		return Verdict{Allowed: true, Rule: pattern, Source: byPattern.source}
	case byDefault != nil:
		return Verdict{Allowed: true, Rule: KeyDefault, Source: byDefault.source}
	}
	return Verdict{Rule: KeyDefault, Reason: host + " is in no net.allow list (net.default is block unless a file sets it)"}
}

// Port decides a destination port.
func (p *Policy) Port(port uint16) Verdict {
	if _, found := slices.BinarySearch(p.ports, port); found {
		return Verdict{Allowed: true, Rule: KeyPorts, Source: p.portsSource}
	}
	v := Verdict{Rule: KeyPorts, Source: p.portsSource, Reason: fmt.Sprintf("port %d is not in net.ports (%s)", port, joinPorts(p.ports))}
	for _, l := range p.layers {
		if _, found := slices.BinarySearch(l.ports, port); l.portsSet && !found {
			v.Source = l.source
			break
		}
	}
	return v
}

// Address decides a connection made to an address without a name (a
// protocol that sends none): the address must be allowed as a name would
// be (an IP literal in net.allow, or a default of allow), its port too,
// and a non-public address must also be in net.allow_private.
func (p *Policy) Address(dest netip.AddrPort) Verdict {
	addr := dest.Addr().WithZone("").Unmap()
	if !addr.IsValid() {
		return Verdict{Reason: "invalid address"}
	}
	if v := p.Port(dest.Port()); !v.Allowed {
		return v
	}
	host := addr.String()
	v := p.decide(host)
	if !v.Allowed {
		return v
	}
	if v.Rule == KeyDefault {
		// default = "allow" speaks for names: a connection that names
		// nothing (no DNS answer, no SNI or Host) goes only to an address
		// listed itself, or every address would be open.
		return Verdict{Rule: KeyDefault, Source: v.Source,
			Reason: fmt.Sprintf("%s is not listed in net.allow; a connection that names no host goes only to a listed address", host)}
	}
	if class := AddressClass(addr); class != "" && !p.privateAllowed(host) {
		return Verdict{Rule: RulePrivateAddress,
			Reason: fmt.Sprintf("%s is a %s address; list it in net.allow_private to permit", host, class)}
	}
	return v
}

// PrivateAllowed reports whether name may resolve to (or, for an IP
// address, be) a non-public address: some layer's allow_private lists it and
// every layer that sets allow_private does. It does not decide the name
// itself (see Name).
func (p *Policy) PrivateAllowed(name string) bool {
	host, err := NormalizeHost(name)
	if err != nil {
		return false
	}
	return p.privateAllowed(host)
}

func (p *Policy) privateAllowed(host string) bool {
	listed := false
	for i := range p.layers {
		l := &p.layers[i]
		if !l.privateSet {
			continue
		}
		if _, ok := l.private.match(host); !ok {
			return false
		}
		listed = true
	}
	return listed
}

// FixedHost is the fixed DNS answer for name, from the highest file that
// gives one. It is returned whether or not the address is public: a
// non-public answer may be handed out only for a name PrivateAllowed
// accepts, which the caller checks.
func (p *Policy) FixedHost(name string) (netip.Addr, bool) {
	host, err := NormalizeHost(name)
	if err != nil {
		return netip.Addr{}, false
	}
	h, ok := p.hosts[host]
	return h.addr, ok
}

// Ports are the allowed destination ports, sorted.
func (p *Policy) Ports() []uint16 { return slices.Clone(p.ports) }

// GuestRoots are every layer's guest_roots, in order, each once: PEM files
// (globs, "~/…") of CAs the guest trusts too.
func (p *Policy) GuestRoots() []string { return slices.Clone(p.guestRoots) }

// Entries describe every configured entry with its file, grouped by key
// (default, block, allow, ports, allow_private, hosts), highest file first.
func (p *Policy) Entries() []Entry { return slices.Clone(p.entries) }

func joinPorts(ports []uint16) string {
	if len(ports) == 0 {
		return "none"
	}
	parts := make([]string, len(ports))
	for i, port := range ports {
		parts[i] = strconv.Itoa(int(port))
	}
	return strings.Join(parts, ", ")
}
