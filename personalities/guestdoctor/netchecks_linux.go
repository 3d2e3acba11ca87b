package guestdoctor

import (
	"context"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/capsem/capsem/core/doctor"
	"github.com/capsem/capsem/core/guestwire"
)

// netChecks are the net group: with a NIC (capsem.net=1), that it is set
// up as the host's stack expects and that the host decides every
// connection; without one, that the VM has no way out at all.
func netChecks(probeURL string) []doctor.Check {
	if cmdlineValue(guestwire.CmdlineNet) != "1" {
		return []doctor.Check{
			{Name: "interfaces", Run: checkOnlyLoopback},
			{Name: "routes", Run: checkNoRoutes},
			{Name: "no-direct-egress", Run: checkNoEgress},
		}
	}
	return []doctor.Check{
		{Name: "interface", Run: checkNIC},
		{Name: "route", Run: checkDefaultRoute},
		{Name: "resolver", Run: checkResolver},
		{Name: "dns-anywhere", Run: checkDNSAnywhere},
		{Name: "bare-addresses", Run: checkBareAddresses},
		{Name: "udp", Run: checkUDPRefused},
		{Name: "allowed-url", Run: func(ctx context.Context, r *doctor.Reporter) { checkAllowedURL(ctx, r, probeURL) }},
		{Name: "credential-ca", Run: checkCredentialCA},
	}
}

// checkCredentialCA: with credentials configured, the guest trusts the
// install's CA (its own file, the bundle SSL_CERT_FILE names) and holds
// placeholders only; without, it trusts no capsem CA at all.
func checkCredentialCA(_ context.Context, r *doctor.Reporter) {
	var placeholders []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(v, guestwire.PlaceholderPrefix) {
			placeholders = append(placeholders, k)
		}
	}
	slices.Sort(placeholders)
	_, statErr := os.Stat(guestwire.GuestCAFile)
	bundle := os.Getenv("SSL_CERT_FILE")
	// SSL_CERT_FILE is set for the host's extra roots too (guest_roots):
	// credentials are configured when placeholders are given.
	if len(placeholders) == 0 {
		switch {
		case statErr == nil:
			r.Failf("", "%s exists but no credentials are configured: a CA is trusted for nothing", guestwire.GuestCAFile)
		case bundle != "":
			r.Okf("no credentials configured: no capsem CA is trusted (%s holds the host's extra roots)", bundle)
		default:
			r.Okf("no credentials configured: no capsem CA is trusted")
		}
		return
	}
	if bundle == "" {
		r.Failf("", "credential placeholders in %s but no CA to use them with", strings.Join(placeholders, ", "))
		return
	}
	caPEM, err := os.ReadFile(guestwire.GuestCAFile)
	if err != nil {
		r.Failf("", "credentials configured (SSL_CERT_FILE=%s) but the CA: %v", bundle, err)
		return
	}
	block, _ := pem.Decode(caPEM)
	if block == nil {
		r.Failf("", "%s holds no PEM certificate", guestwire.GuestCAFile)
		return
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !ca.IsCA {
		r.Failf("", "%s is not a CA certificate (%v)", guestwire.GuestCAFile, err)
		return
	}
	bundled, err := os.ReadFile(bundle)
	if err != nil || !strings.Contains(string(bundled), strings.TrimSpace(string(caPEM))) {
		r.Failf("", "the bundle SSL_CERT_FILE names (%s) does not hold the capsem CA (%v)", bundle, err)
		return
	}
	r.Okf("%q trusted through %s; placeholders in %s", ca.Subject.CommonName, bundle, strings.Join(placeholders, ", "))
}

// probeName never resolves anywhere (RFC 6761's .invalid): the host's
// resolver must answer it, NXDOMAIN, whatever server the guest asks.
const probeName = "capsem-doctor.invalid"

func checkNIC(_ context.Context, r *doctor.Reporter) {
	ifs, err := net.Interfaces()
	if err != nil {
		r.Failf("", "listing interfaces: %v", err)
		return
	}
	var nic *net.Interface
	var others []string
	for i := range ifs {
		switch {
		case ifs[i].HardwareAddr.String() == guestwire.NetGuestMAC:
			nic = &ifs[i]
		case ifs[i].Flags&net.FlagLoopback == 0:
			others = append(others, ifs[i].Name)
		}
	}
	if nic == nil {
		r.Failf("the agent brings the NIC up at boot (see the console log)", "no interface has the MAC %s", guestwire.NetGuestMAC)
		return
	}
	if len(others) > 0 {
		r.Failf("", "interfaces beside %s and lo: %v", nic.Name, others)
		return
	}
	if nic.Flags&net.FlagUp == 0 {
		r.Failf("", "%s is down", nic.Name)
		return
	}
	addrs, _ := nic.Addrs()
	var have []string
	for _, a := range addrs {
		have = append(have, a.String())
	}
	want := fmt.Sprintf("%s/%d", guestwire.NetGuestIP, guestwire.NetPrefixLen)
	if !slices.Equal(have, []string{want}) {
		r.Failf("the host's stack answers only its IPv4 address; IPv6 must be off", "%s has %v, want only %s", nic.Name, have, want)
		return
	}
	r.Okf("%s (%s) up with %s only, MTU %d", nic.Name, guestwire.NetGuestMAC, want, nic.MTU)
}

func checkDefaultRoute(_ context.Context, r *doctor.Reporter) {
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		r.Failf("", "reading /proc/net/route: %v", err)
		return
	}
	gw := net.ParseIP(guestwire.NetGatewayIP).To4()
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 3 || f[1] != "00000000" {
			continue
		}
		// /proc/net/route prints the gateway as the host-order hex of
		// its network-order bytes.
		var v uint32
		var g [4]byte
		if _, err := fmt.Sscanf(f[2], "%08X", &v); err == nil {
			binary.LittleEndian.PutUint32(g[:], v)
		}
		if net.IP(g[:]).Equal(gw) {
			r.Okf("default route via %s on %s", guestwire.NetGatewayIP, f[0])
			return
		}
		r.Failf("", "the default route goes via %s, want %s", net.IP(g[:]), guestwire.NetGatewayIP)
		return
	}
	r.Failf("", "no default route")
}

func checkResolver(_ context.Context, r *doctor.Reporter) {
	b, err := os.ReadFile(guestwire.GuestResolvConf)
	if err != nil {
		r.Failf("", "reading %s: %v", guestwire.GuestResolvConf, err)
		return
	}
	var servers []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
			servers = append(servers, f[1])
		}
	}
	if !slices.Equal(servers, []string{guestwire.NetGatewayIP}) {
		r.Failf("the agent writes it at boot; something in the VM changed it", "%s names %v, want only %s", guestwire.GuestResolvConf, servers, guestwire.NetGatewayIP)
		return
	}
	r.Okf("%s names the host (%s)", guestwire.GuestResolvConf, guestwire.NetGatewayIP)
}

// dnsQuery sends one A query for name to server:53 over UDP and returns
// the reply's rcode.
func dnsQuery(ctx context.Context, server, name string) (int, error) {
	var q []byte
	q = binary.BigEndian.AppendUint16(q, 0x4344) // id
	q = binary.BigEndian.AppendUint16(q, 0x0100) // recursion desired
	q = binary.BigEndian.AppendUint16(q, 1)      // one question
	q = append(q, 0, 0, 0, 0, 0, 0)
	for _, label := range strings.Split(name, ".") {
		q = append(q, byte(len(label)))
		q = append(q, label...)
	}
	q = append(q, 0, 0, 1, 0, 1) // root, type A, class IN
	d := net.Dialer{}
	c, err := d.DialContext(ctx, "udp4", net.JoinHostPort(server, "53"))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(q); err != nil {
		return 0, err
	}
	buf := make([]byte, 1500)
	n, err := c.Read(buf)
	if err != nil {
		return 0, err
	}
	if n < 12 || binary.BigEndian.Uint16(buf) != 0x4344 || buf[2]&0x80 == 0 {
		return 0, fmt.Errorf("a %d-byte reply that does not answer the query", n)
	}
	return int(buf[3] & 0x0f), nil
}

// checkDNSAnywhere: the host answers DNS sent to any address, so a
// resolver hard-coded in a program is answered (and recorded) too.
func checkDNSAnywhere(ctx context.Context, r *doctor.Reporter) {
	for _, server := range []string{guestwire.NetGatewayIP, "8.8.8.8", "203.0.113.53"} {
		rcode, err := dnsQuery(ctx, server, probeName)
		if err != nil {
			r.Failf("the host's resolver answers port 53 on every address", "asking %s for %s: %v", server, probeName, err)
			return
		}
		if rcode != 3 {
			r.Failf("", "%s answered %s with rcode %d, want NXDOMAIN (3)", server, probeName, rcode)
			return
		}
	}
	r.Okf("%s is NXDOMAIN from %s, 8.8.8.8 and 203.0.113.53 alike: the host answers them all", probeName, guestwire.NetGatewayIP)
}

// checkBareAddresses: an address no allowed name resolved to, a private
// one, the gateway itself and the cloud metadata address are all refused
// at once (reset), never connected.
func checkBareAddresses(ctx context.Context, r *doctor.Reporter) {
	for _, addr := range []string{"1.1.1.1:443", "10.0.0.1:443", guestwire.NetGatewayIP + ":443", "169.254.169.254:80"} {
		d := net.Dialer{Timeout: 5 * time.Second}
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp4", addr)
		if err == nil {
			c.Close()
			r.Failf("the host connects only to addresses its DNS gave this VM for an allowed name", "a TCP connection to %s succeeded", addr)
			return
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			r.Failf("the host resets such a connection at once", "connecting to %s: %v after %v, want a reset", addr, err, time.Since(start).Round(time.Millisecond))
			return
		}
	}
	r.Okf("1.1.1.1, 10.0.0.1, the gateway and 169.254.169.254 are refused at SYN")
}

// checkUDPRefused: UDP other than DNS goes nowhere, and the guest learns
// it at once (ICMP port unreachable) instead of waiting.
func checkUDPRefused(ctx context.Context, r *doctor.Reporter) {
	d := net.Dialer{}
	c, err := d.DialContext(ctx, "udp4", "1.1.1.1:123")
	if err != nil {
		r.Failf("", "opening a UDP socket: %v", err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	c.Write([]byte("capsem-doctor"))
	_, err = c.Read(make([]byte, 64))
	switch {
	case err == nil:
		r.Failf("only DNS leaves the VM over UDP", "1.1.1.1:123 answered")
	case errors.Is(err, syscall.ECONNREFUSED):
		r.Okf("UDP to 1.1.1.1:123 refused at once (port unreachable)")
	default:
		r.Okf("UDP to 1.1.1.1:123 got no answer (%v)", err)
	}
}

func checkAllowedURL(ctx context.Context, r *doctor.Reporter, url string) {
	if url == "" {
		r.Okf("no --url given: pass one the VM's [net] policy allows to check a fetch through it")
		return
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		r.Failf("", "--url %q: want an http:// or https:// URL", url)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The guest's own client: curl in the full root, which checks the
	// certificate against the guest's trust store (where the capsem CA is
	// when the host holds credentials) and takes any HTTP answer as the
	// path working; busybox wget in the minimal root, which cannot check
	// a certificate at all, so the result says so.
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.CommandContext(ctx, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url).Output()
		if err != nil {
			r.Failf("the VM's [net] policy must allow the URL's host and port (capsem policy explain --url), and an https:// server's certificate must be trusted here", "curl %s: %v", url, err)
			return
		}
		r.Okf("GET %s: HTTP %s (certificate checked)", url, out)
		return
	}
	out, err := exec.CommandContext(ctx, "wget", "-q", "--no-check-certificate", "-O", "-", url).Output()
	if err != nil {
		r.Failf("the VM's [net] policy must allow the URL's host and port (capsem policy explain --url)", "wget %s: %v", url, err)
		return
	}
	if strings.HasPrefix(url, "https://") {
		r.Okf("GET %s: %d bytes (busybox wget: certificate not checked)", url, len(out))
		return
	}
	r.Okf("GET %s: %d bytes", url, len(out))
}

// --- without a NIC

func checkOnlyLoopback(_ context.Context, r *doctor.Reporter) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		r.Failf("", "reading /sys/class/net: %v", err)
		return
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"lo"}) {
		r.Failf("a VM made with --no-network has no network device", "network interfaces %v, want only lo", names)
		return
	}
	r.Okf("only lo (this VM has no network)")
}

func checkNoRoutes(_ context.Context, r *doctor.Reporter) {
	var routes []string
	if b, err := os.ReadFile("/proc/net/route"); err == nil {
		for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if i > 0 && strings.TrimSpace(line) != "" {
				routes = append(routes, strings.Join(strings.Fields(line)[:3], " "))
			}
		}
	}
	if len(routes) > 0 {
		r.Failf("a VM made with --no-network has no route out", "routes: %s", strings.Join(routes, "; "))
		return
	}
	r.Okf("no IPv4 route")
}

func checkNoEgress(ctx context.Context, r *doctor.Reporter) {
	for _, addr := range []string{"1.1.1.1:443", "8.8.8.8:53"} {
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			r.Failf("the VM reached the outside", "a TCP connection to %s succeeded", addr)
			return
		}
	}
	r.Okf("TCP connects to 1.1.1.1:443 and 8.8.8.8:53 fail")
}
