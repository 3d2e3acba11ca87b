package builtintools

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/capsem/capsem/core/netpolicy"
)

// privateNetworkMessage is the tool error for a blocked IP literal.
func privateNetworkMessage(host string) string {
	return "HTTP request blocked: " + host + " (private or loopback address; set allow_private_networks to permit)"
}

func TestPrivateAddressesBlockedByDefault(t *testing.T) {
	up := newUpstream(t)
	port := up.port()
	// Every connection that got past the guard would reach the upstream
	// server, so a missing check shows up as a success.
	network := &loopbackNet{up: up, resolved: map[string][]netip.Addr{
		"loopback.test":  {netip.MustParseAddr("127.0.0.1")},
		"loopback6.test": {netip.MustParseAddr("::1")},
		"metadata.test":  {netip.MustParseAddr("169.254.169.254")},
		// A public answer next to a private one: refused as a whole.
		"rebind.test": {publicTestAddress, netip.MustParseAddr("10.0.0.1")},
	}}
	tests := []struct {
		name    string
		cfg     Config
		url     string
		message string
		domain  string
	}{
		{name: "IPv4 loopback", url: "http://127.0.0.1:" + port + "/echo", message: privateNetworkMessage("127.0.0.1"), domain: "127.0.0.1"},
		{name: "other IPv4 loopback", url: "http://127.1.2.3:" + port + "/echo", message: privateNetworkMessage("127.1.2.3"), domain: "127.1.2.3"},
		{name: "IPv6 loopback", url: "http://[::1]:" + port + "/echo", message: privateNetworkMessage("::1"), domain: "::1"},
		{name: "RFC 1918", url: "http://10.1.2.3:" + port + "/echo", message: privateNetworkMessage("10.1.2.3"), domain: "10.1.2.3"},
		{name: "RFC 1918 192.168", url: "https://192.168.0.1/", message: privateNetworkMessage("192.168.0.1"), domain: "192.168.0.1"},
		{name: "cloud metadata", url: "http://169.254.169.254/latest/meta-data/", message: privateNetworkMessage("169.254.169.254"), domain: "169.254.169.254"},
		{name: "IPv4-mapped metadata", url: "http://[::ffff:169.254.169.254]/latest/meta-data/",
			message: privateNetworkMessage("::ffff:169.254.169.254"), domain: "169.254.169.254"},
		{name: "carrier-grade NAT", url: "http://100.64.0.1/", message: privateNetworkMessage("100.64.0.1"), domain: "100.64.0.1"},
		{name: "unspecified", url: "http://0.0.0.0:" + port + "/echo", message: privateNetworkMessage("0.0.0.0"), domain: "0.0.0.0"},
		{name: "unique local IPv6", url: "http://[fd00::1]/", message: privateNetworkMessage("fd00::1"), domain: "fd00::1"},
		{name: "multicast", url: "http://224.0.0.251/", message: privateNetworkMessage("224.0.0.251"), domain: "224.0.0.251"},
		{name: "name resolving to loopback", url: "http://loopback.test:" + port + "/echo", domain: "loopback.test",
			message: "HTTP request blocked: loopback.test (resolves to 127.0.0.1, a private or loopback address; set allow_private_networks to permit)"},
		{name: "name resolving to IPv6 loopback", url: "http://loopback6.test:" + port + "/echo", domain: "loopback6.test",
			message: "HTTP request blocked: loopback6.test (resolves to ::1, a private or loopback address; set allow_private_networks to permit)"},
		{name: "name resolving to metadata", url: "http://metadata.test/latest/meta-data/", domain: "metadata.test",
			message: "HTTP request blocked: metadata.test (resolves to 169.254.169.254, a private or loopback address; set allow_private_networks to permit)"},
		{name: "name with a private address among public ones", url: "http://rebind.test/", domain: "rebind.test",
			message: "HTTP request blocked: rebind.test (resolves to 10.0.0.1, a private or loopback address; set allow_private_networks to permit)"},
		{name: "the domain allow list does not lift it", cfg: Config{Allow: []string{"127.0.0.1"}},
			url: "http://127.0.0.1:" + port + "/echo", message: privateNetworkMessage("127.0.0.1"), domain: "127.0.0.1"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			session := connect(t, test.cfg, network.hooks())
			for _, tool := range []string{ToolFetchHTTP, ToolHTTPPost, ToolHTTPHeaders} {
				result := callTool(t, session, tool, map[string]any{"url": test.url})
				if text := errorText(t, result); text != test.message {
					t.Errorf("%s: error = %q, want %q", tool, text, test.message)
				}
				event := singleEvent(t, result)
				wantReason := strings.TrimSuffix(strings.SplitN(test.message, " (", 2)[1], ")")
				if event.Decision != DecisionDenied || event.MatchedRule != MatchedRulePrivateNetwork || event.Domain != test.domain ||
					event.StatusCode != 0 || event.BytesReceived != 0 || event.Error != wantReason || !refusedPrivate(event.IP) {
					t.Errorf("%s: event = %+v", tool, event)
				}
			}
		})
	}
	if dialed := network.dialedAddresses(); len(dialed) != 0 {
		t.Errorf("the guard let connections through to %v", dialed)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.hosts) != 0 {
		t.Errorf("the upstream server was reached for %v", up.hosts)
	}
}

func TestPrivateAddressesBlockedWithSystemResolverAndDialer(t *testing.T) {
	up := newUpstream(t)
	session := connect(t, Config{}, nil)
	tests := []struct {
		url        string
		wantPrefix string
	}{
		{up.URL + "/echo", privateNetworkMessage("127.0.0.1")},
		{"http://localhost:" + up.port() + "/echo", "HTTP request blocked: localhost (resolves to "},
	}
	for _, test := range tests {
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": test.url})
		text := errorText(t, result)
		if !strings.HasPrefix(text, test.wantPrefix) || !strings.HasSuffix(text, "private or loopback address; set allow_private_networks to permit)") {
			t.Errorf("%s: error = %q, want prefix %q", test.url, text, test.wantPrefix)
		}
		if event := singleEvent(t, result); event.Decision != DecisionDenied || event.MatchedRule != MatchedRulePrivateNetwork {
			t.Errorf("%s: event = %+v", test.url, event)
		}
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.hosts) != 0 {
		t.Errorf("the loopback server was reached for %v", up.hosts)
	}
}

func TestRedirectToPrivateAddressIsRefusedAtTheHop(t *testing.T) {
	up := newUpstream(t)
	port := up.port()
	tests := []struct {
		name    string
		target  string
		domain  string
		blocked string // the message's host and reason
	}{
		{name: "IPv4 loopback", target: "http://127.0.0.1:" + port + "/echo", domain: "127.0.0.1",
			blocked: "127.0.0.1 (private or loopback address; set allow_private_networks to permit"},
		{name: "IPv6 loopback", target: "http://[::1]:" + port + "/echo", domain: "::1",
			blocked: "::1 (private or loopback address; set allow_private_networks to permit"},
		{name: "cloud metadata", target: "http://169.254.169.254/latest/meta-data/", domain: "169.254.169.254",
			blocked: "169.254.169.254 (private or loopback address; set allow_private_networks to permit"},
		{name: "name resolving to loopback", target: "http://loopback.test:" + port + "/echo", domain: "loopback.test",
			blocked: "loopback.test (resolves to 127.0.0.1, a private or loopback address; set allow_private_networks to permit"},
	}
	for _, test := range tests {
		t.Run(test.name, func(t *testing.T) {
			network := &loopbackNet{up: up, resolved: map[string][]netip.Addr{"loopback.test": {netip.MustParseAddr("127.0.0.1")}}}
			session := connect(t, Config{}, network.hooks())
			firstURL := "http://public.test:" + port + "/redirect?to=" + test.target
			for _, tool := range []string{ToolFetchHTTP, ToolHTTPGet, ToolHTTPHeaders} {
				result := callTool(t, session, tool, map[string]any{"url": firstURL})
				want := "HTTP request blocked: " + test.blocked + "; redirected from " + firstURL + ")"
				if text := errorText(t, result); text != want {
					t.Errorf("%s: error = %q, want %q", tool, text, want)
				}
				events := netEvents(t, result)
				if len(events) != 2 {
					t.Fatalf("%s: want an event per hop (2), got %+v", tool, events)
				}
				if first := events[0]; first.Domain != "public.test" || first.Decision != DecisionAllowed || first.StatusCode != 302 {
					t.Errorf("%s: first hop = %+v", tool, first)
				}
				if hop := events[1]; hop.Domain != test.domain || hop.Decision != DecisionDenied || hop.MatchedRule != MatchedRulePrivateNetwork ||
					hop.StatusCode != 0 || !strings.Contains(hop.Error, "private or loopback address") || !refusedPrivate(hop.IP) {
					t.Errorf("%s: redirect hop = %+v", tool, hop)
				}
			}
			// Only the public name's checked address was ever dialed.
			for _, address := range network.dialedAddresses() {
				if address != "203.0.113.7:"+port {
					t.Errorf("dialed %s", address)
				}
			}
		})
	}
	for _, host := range []string{"127.0.0.1", "[::1]", "169.254.169.254", "loopback.test"} {
		if up.sawHost(host) {
			t.Errorf("the private redirect target %s was contacted", host)
		}
	}
}

func TestAllowPrivateNetworksPermitsPrivateAddresses(t *testing.T) {
	up := newUpstream(t)
	port := up.port()
	network := &loopbackNet{up: up, resolved: map[string][]netip.Addr{"loopback.test": {netip.MustParseAddr("127.0.0.1")}}}
	session := connect(t, Config{AllowPrivateNetworks: true}, network.hooks())
	for _, rawURL := range []string{
		"http://10.1.2.3:" + port + "/echo",
		"http://169.254.169.254/echo",
		"http://loopback.test:" + port + "/echo",
		"http://public.test:" + port + "/redirect?to=http://[::1]:" + port + "/echo",
	} {
		result := callTool(t, session, ToolHTTPGet, map[string]any{"url": rawURL})
		successText(t, result)
		for _, event := range netEvents(t, result) {
			if event.Decision != DecisionAllowed || event.MatchedRule != "" {
				t.Errorf("%s: event = %+v", rawURL, event)
			}
		}
	}
	want := []string{"10.1.2.3:" + port, "169.254.169.254:80", "127.0.0.1:" + port, "203.0.113.7:" + port, "[::1]:" + port}
	if got := network.dialedAddresses(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("dialed %v, want %v", got, want)
	}
}

func TestSystemDialerChecksTheConnectedAddress(t *testing.T) {
	up := newUpstream(t)
	address := up.Listener.Addr().String()
	_, err := systemNetHooks(false).dial(context.Background(), "tcp", address)
	var refused *privateAddressError
	if !errors.As(err, &refused) || refused.addr != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("dial %s without private networks: error %v, want a private address refusal", address, err)
	}
	conn, err := systemNetHooks(true).dial(context.Background(), "tcp", address)
	if err != nil {
		t.Fatalf("dial %s with private networks allowed: %v", address, err)
	}
	conn.Close()
}

func TestGuardedDialerTriesEveryCheckedAddress(t *testing.T) {
	up := newUpstream(t)
	second := netip.MustParseAddr("198.51.100.9")
	var attempts []string
	dialer := &guardedDialer{hooks: netHooks{
		lookup: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("::ffff:203.0.113.7"), netip.MustParseAddr("2001:db8::1"), second}, nil
		},
		dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			attempts = append(attempts, address)
			if address != netip.AddrPortFrom(second, 443).String() {
				return nil, errors.New("unreachable")
			}
			var d net.Dialer
			return d.DialContext(ctx, network, up.Listener.Addr().String())
		},
	}}
	conn, err := dialer.DialContext(context.Background(), "tcp", "multi.test:443")
	if err != nil {
		t.Fatalf("DialContext: %v", err)
	}
	conn.Close()
	if want := "203.0.113.7:443 [2001:db8::1]:443 198.51.100.9:443"; strings.Join(attempts, " ") != want {
		t.Errorf("attempts = %v, want %s", attempts, want)
	}

	attempts = nil
	conn, err = dialer.DialContext(context.Background(), "tcp4", "multi.test:443")
	if err != nil {
		t.Fatalf("DialContext tcp4: %v", err)
	}
	conn.Close()
	if want := "203.0.113.7:443 198.51.100.9:443"; strings.Join(attempts, " ") != want {
		t.Errorf("tcp4: attempts = %v, want only the IPv4 addresses %s", attempts, want)
	}
}

// refusedPrivate tells whether a refusal's event names the private address
// it refused.
func refusedPrivate(ip string) bool {
	a, err := netip.ParseAddr(ip)
	return err == nil && !netpolicy.IsPublic(a)
}
