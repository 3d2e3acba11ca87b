package netstack

import (
	"net/netip"
	"sync"
)

// pins records which names this VM's DNS answered with which address: a
// connection to an address is allowed only under a name pinned to it. Pins
// outlive the TTL the guest was given (clients keep pooled connections and
// cached answers far longer) and last until the VM stops; past maxPins the
// oldest pin goes first, so a guest resolving endless names costs a bounded
// table.
type pins struct {
	mu     sync.Mutex
	max    int
	byAddr map[netip.Addr]map[string]pin // address → name → its pin
	order  []pinKey                      // insertion order, for eviction
	tick   uint64
	n      int // pins held
}

// pin is one name's answer with one address.
type pin struct {
	tick uint64 // when it was given, for eviction
	// fromHosts: the answer was the policy's hosts entry, not a lookup,
	// so it holds only while the policy still maps the name there.
	fromHosts bool
}

type pinKey struct {
	addr netip.Addr
	name string
	tick uint64
}

func newPins(max int) *pins {
	return &pins{max: max, byAddr: map[netip.Addr]map[string]pin{}}
}

// add pins name to each address (a repeat refreshes it, the latest answer
// saying where it came from).
func (p *pins) add(name string, addrs []netip.Addr, fromHosts bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addrs {
		p.tick++
		names := p.byAddr[a]
		if names == nil {
			names = map[string]pin{}
			p.byAddr[a] = names
		}
		if _, ok := names[name]; !ok {
			p.n++
		}
		names[name] = pin{tick: p.tick, fromHosts: fromHosts}
		p.order = append(p.order, pinKey{a, name, p.tick})
	}
	p.evict()
}

// evict drops the oldest pins past max; stale order entries (a pin
// refreshed since) are skipped. p.mu held.
func (p *pins) evict() {
	for p.n > p.max && len(p.order) > 0 {
		k := p.order[0]
		p.order = p.order[1:]
		if names := p.byAddr[k.addr]; names != nil && names[k.name].tick == k.tick {
			delete(names, k.name)
			p.n--
			if len(names) == 0 {
				delete(p.byAddr, k.addr)
			}
		}
	}
	// The order slice holds at most one stale entry per refresh: compact
	// it when it has grown well past the live pins.
	if len(p.order) > 2*p.max+64 {
		live := p.order[:0]
		for _, k := range p.order {
			if names := p.byAddr[k.addr]; names != nil && names[k.name].tick == k.tick {
				live = append(live, k)
			}
		}
		p.order = append([]pinKey(nil), live...)
	}
}

// names returns the names pinned to addr.
func (p *pins) names(addr netip.Addr) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for n := range p.byAddr[addr] {
		out = append(out, n)
	}
	return out
}

// has reports whether name is pinned to addr.
func (p *pins) has(addr netip.Addr, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.byAddr[addr][name]
	return ok
}

// fromHosts reports whether name's pin to addr came from a hosts entry.
func (p *pins) fromHosts(addr netip.Addr, name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byAddr[addr][name].fromHosts
}

// Pin is one name the VM's DNS answered with one address. Real is the
// address a stand-in Addr stands for (see standIns): the table of
// stand-ins is the stack's, so a pin carries its own entry across a
// suspend.
type Pin struct {
	Name string     `json:"name"`
	Addr netip.Addr `json:"addr"`
	Real netip.Addr `json:"real,omitzero"`
	// Hosts: the answer was the policy's hosts entry for the name.
	Hosts bool `json:"hosts,omitempty"`
}

// Pins lists the stack's pins, oldest first: what a suspended VM's stack
// keeps for the stack that resumes it (RestorePins), so that a connection
// to an address the guest resolved before the suspend is still allowed.
func (s *Stack) Pins() []Pin {
	p := s.pins
	p.mu.Lock()
	var out []Pin
	for _, k := range p.order {
		if names := p.byAddr[k.addr]; names != nil && names[k.name].tick == k.tick {
			out = append(out, Pin{Name: k.name, Addr: k.addr, Hosts: names[k.name].fromHosts})
		}
	}
	p.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range out {
		out[i].Real = s.standIn[out[i].Addr]
	}
	return out
}

// RestorePins adds pins (as Pins lists them), oldest first, with the
// stand-ins they name; the stack's bounds on pins and stand-ins hold as
// for its own. A pin on a stand-in whose real address it does not carry
// (or that the table has no room for) is dropped: the guest could only be
// refused there.
func (s *Stack) RestorePins(pins []Pin) {
	for _, pin := range pins {
		if !pin.Addr.IsValid() || pin.Name == "" {
			continue
		}
		if standInPrefix.Contains(pin.Addr) && !s.restoreStandIn(pin.Addr, pin.Real) {
			continue
		}
		s.pins.add(pin.Name, []netip.Addr{pin.Addr}, pin.Hosts)
	}
}

// restoreStandIn enters the stand-in st for real, as standIns made it
// before the suspend, unless either side already means something else.
func (s *Stack) restoreStandIn(st, real netip.Addr) bool {
	if !real.IsValid() || standInPrefix.Contains(real) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.standIn[st]; ok {
		return r == real
	}
	if _, taken := s.realTo[real]; taken || len(s.standIn) >= maxStandIns {
		return false
	}
	if s.standIn == nil {
		s.standIn, s.realTo = map[netip.Addr]netip.Addr{}, map[netip.Addr]netip.Addr{}
	}
	s.standIn[st], s.realTo[real] = real, st
	return true
}
