package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// describe lists every entry of the layers with what limits it, for
// Entries. It runs once, in Compile, on layers that compiled.
func (p *Policy) describe(layers []Layer) []Entry {
	var entries []Entry
	add := func(key, value, source, note string) {
		entries = append(entries, Entry{Key: key, Value: value, Source: source, Note: note})
	}
	defaultSet := false
	for _, l := range layers {
		if l.Default != "" {
			add(KeyDefault, l.Default, l.Source, "")
			defaultSet = true
		}
	}
	if !defaultSet {
		add(KeyDefault, "block", "", "no file sets net.default")
	}
	for _, l := range layers {
		for _, entry := range l.Block {
			pattern, _ := ParsePattern(entry)
			add(KeyBlock, pattern.String(), l.Source, "")
		}
	}
	for i, l := range layers {
		for _, entry := range l.Allow {
			pattern, _ := ParsePattern(entry)
			add(KeyAllow, pattern.String(), l.Source, p.allowNote(i, pattern))
		}
	}
	portsSet := 0
	for _, l := range p.layers {
		if l.portsSet {
			portsSet++
		}
	}
	if portsSet == 0 {
		add(KeyPorts, joinPorts(p.ports), "", "no file sets net.ports")
	}
	for _, l := range p.layers {
		if !l.portsSet {
			continue
		}
		note := ""
		if portsSet > 1 {
			note = "in effect: the ports every file allows, " + joinPorts(p.ports)
		}
		add(KeyPorts, joinPorts(l.ports), l.source, note)
	}
	for i, l := range layers {
		if p.layers[i].privateSet && len(l.AllowPrivate) == 0 {
			add(KeyAllowPrivate, "(none)", l.Source, "no name may reach a non-public address")
		}
		for _, entry := range l.AllowPrivate {
			pattern, _ := ParsePattern(entry)
			add(KeyAllowPrivate, pattern.String(), l.Source, p.privateNote(i, pattern))
		}
	}
	answered := map[string]string{} // host → the file whose answer counts
	for li, l := range layers {
		var hosts []string
		addrs := map[string]netip.Addr{}
		for name, value := range l.Hosts {
			host, addr, _ := parseFixedHost(name, value)
			hosts, addrs[host] = append(hosts, host), addr
		}
		slices.Sort(hosts)
		for _, host := range hosts {
			addr := addrs[host]
			value := host + " = " + addr.String()
			if winner, ok := answered[host]; ok {
				add(KeyHosts, value, l.Source, "shadowed by the answer in "+describe(winner))
				continue
			}
			if by := higherAllows(p.layers[:li], host); by != "" {
				add(KeyHosts, value, l.Source, "not used: "+describe(by)+" allows "+host+" itself, so its answer comes from DNS")
				continue
			}
			answered[host] = l.Source
			note := ""
			if v := p.decide(host); !v.Allowed {
				note = "not answered: " + v.Reason
			} else if class := AddressClass(addr); class != "" && !p.privateAllowed(host) {
				note = fmt.Sprintf("not handed out: %s is a %s address and %s is not in net.allow_private", addr, class, host)
			}
			add(KeyHosts, value, l.Source, note)
		}
	}
	for _, l := range layers {
		for i, c := range l.Credentials {
			source := "source_file " + c.SourceFile
			if c.SourceEnv != "" {
				source = "source_env " + c.SourceEnv
			}
			value := fmt.Sprintf("%s: header %s from %s, guest %s", c.Host, c.Header, source, c.GuestEnv)
			if c.CAFile != "" {
				value += ", ca_file " + c.CAFile
			}
			note := p.credentials.shadowed[credentialRef{l.Source, i}]
			if note == "" {
				pattern, _ := ParsePattern(c.Host)
				if !pattern.wildcard {
					if v := p.decide(pattern.host); !v.Allowed {
						note = "no effect until the name is allowed: " + v.Reason
					}
				}
			}
			add(KeyCredentials, value, l.Source, note)
		}
	}
	return entries
}

// allowNote says how the rest of the policy limits the allow entry of layer
// own; "" when it does not.
func (p *Policy) allowNote(own int, pattern Pattern) string {
	if !pattern.wildcard {
		if v := p.decide(pattern.host); !v.Allowed {
			if v.Rule != KeyDefault {
				return fmt.Sprintf("no effect: %s (in %s)", v.Reason, describe(v.Source))
			}
			return "no effect: " + v.Reason
		}
		return ""
	}
	suffix := pattern.host
	if r, ok := coversAll(&p.block, suffix); ok {
		return fmt.Sprintf("no effect: every name under %s is blocked by net.block %q (in %s)", suffix, r.pattern, describe(r.source))
	}
	for i, l := range p.layers {
		if i == own || l.def != "block" {
			continue
		}
		if _, ok := coversAll(&l.allow, suffix); ok {
			continue
		}
		if touches(&l.allow, suffix) {
			return fmt.Sprintf("limited: only the names under %s that net.allow of %s also lists (its net.default is block)", suffix, describe(l.source))
		}
		return fmt.Sprintf("no effect: net.default of %s is block and its net.allow lists no name under %s", describe(l.source), suffix)
	}
	if touches(&p.block, suffix) {
		return "limited: net.block refuses some names under " + suffix
	}
	return ""
}

// privateNote says how the other layers' allow_private limit an entry of
// layer own; "" when they do not.
func (p *Policy) privateNote(own int, pattern Pattern) string {
	for i, l := range p.layers {
		if i == own || !l.privateSet {
			continue
		}
		if !pattern.wildcard {
			if _, ok := l.private.match(pattern.host); !ok {
				return "no effect: not in net.allow_private of " + describe(l.source)
			}
			continue
		}
		if _, ok := coversAll(&l.private, pattern.host); ok {
			continue
		}
		if touches(&l.private, pattern.host) {
			return fmt.Sprintf("limited: only the names under %s that net.allow_private of %s also lists", pattern.host, describe(l.source))
		}
		return fmt.Sprintf("no effect: net.allow_private of %s lists no name under %s", describe(l.source), pattern.host)
	}
	return ""
}

// coversAll finds a wildcard in set that matches every name under suffix:
// "*.suffix" itself or a wildcard on one of its parent domains.
func coversAll[T any](set *patternSet[T], suffix string) (T, bool) {
	for rest := suffix; ; {
		if v, ok := set.suffix[rest]; ok {
			return v, true
		}
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			var zero T
			return zero, false
		}
		rest = rest[i+1:]
	}
}

// touches reports whether set matches some name under suffix.
func touches[T any](set *patternSet[T], suffix string) bool {
	for host := range set.exact {
		if strings.HasSuffix(host, "."+suffix) {
			return true
		}
	}
	for s := range set.suffix {
		if s == suffix || strings.HasSuffix(s, "."+suffix) {
			return true
		}
	}
	return false
}
