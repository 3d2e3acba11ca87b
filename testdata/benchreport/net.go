// busybox wget's TLS 1.2 ClientHello has no signature_algorithms, which Go's
// server takes as SHA-1 only, refused by default since Go 1.25.
//go:debug tlssha1=1

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/vmhost"
)

// netBench measures the guest's network (the per-VM process's own stack
// behind the NIC) against servers of its own on the host's loopback,
// reached through [net] hosts + allow_private: a 100 MB download over
// HTTP and HTTPS beside the same download on the host, at the default MTU
// and at 1500; what each connection adds (guest connect → first byte)
// beside a connection the guest makes to its own loopback; the per-VM
// process's memory with 100 connections open; and exec-ready with and
// without the NIC.
func netBench(capsem, home, guest string, runs int) error {
	const size = 100 << 20
	blob := bytes.Repeat([]byte("capsem-bench"), size/12+1)[:size]
	var holdMu sync.Mutex
	var held []net.Conn
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Length", strconv.Itoa(size))
			w.Write(blob)
		case "/hold":
			// Keep the connection open, answering nothing.
			hj, ok := w.(http.Hijacker)
			if !ok {
				return
			}
			c, _, err := hj.Hijack()
			if err == nil {
				holdMu.Lock()
				held = append(held, c)
				holdMu.Unlock()
			}
		default:
			io.WriteString(w, "ok\n")
		}
	})
	plain, secure := httptest.NewServer(h), httptest.NewTLSServer(h)
	defer plain.Close()
	defer secure.Close()
	defer func() {
		holdMu.Lock()
		for _, c := range held {
			c.Close()
		}
		holdMu.Unlock()
	}()
	pPort, sPort := portOf(plain.Listener.Addr()), portOf(secure.Listener.Addr())
	dir, err := os.MkdirTemp("", "capsem-bench-net-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cw, err := newCredentialWorld(dir)
	if err != nil {
		return err
	}
	defer cw.close()
	cfg := filepath.Join(dir, "net.toml")
	policy := fmt.Sprintf(`[net]
allow = ["bench.test", "api.anthropic.com", "splice.test"]
ports = [%s, %s, %s, %s]
allow_private = ["bench.test", "api.anthropic.com", "splice.test"]
hosts = { "bench.test" = "127.0.0.1", "api.anthropic.com" = "127.0.0.1", "splice.test" = "127.0.0.1" }
%s`, pPort, sPort, portOf(cw.api.Listener.Addr()), portOf(cw.splice.Listener.Addr()), cw.policy())
	if err := os.WriteFile(cfg, []byte(policy), 0o600); err != nil {
		return err
	}

	// The host's own figure: the same download, the same servers.
	hostMBs := func(url string) (float64, error) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
		defer tr.CloseIdleConnections()
		t := time.Now()
		resp, err := (&http.Client{Transport: tr}).Get(url)
		if err != nil {
			return 0, err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != size {
			return 0, fmt.Errorf("host download: %d bytes, %v", n, err)
		}
		return float64(size) / 1e6 / time.Since(t).Seconds(), nil
	}
	hostPlain, err := hostMBs(plain.URL + "/big")
	if err != nil {
		return err
	}
	hostTLS, err := hostMBs(secure.URL + "/big")
	if err != nil {
		return err
	}
	states, err := os.MkdirTemp("", "capsem-bench-net-states-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(states)
	fmt.Printf("\nThe guest's network (the per-VM process's stack behind the NIC; servers on the host's loopback via [net] hosts)\n")
	fmt.Printf("  a 100 MB download on the host itself (Go client, same servers): HTTP %.0f MB/s, HTTPS %.0f MB/s\n", hostPlain, hostTLS)
	for _, mtu := range []int{0, 1500} {
		vm, _, _, err := startProcess(capsem, home, guest, func(c *vmhost.ProcessConfig) {
			c.Config, c.NoAutodetect, c.NetMTU, c.BootStateDir = cfg, true, mtu, states
		}, "")
		if err != nil {
			return fmt.Errorf("VM at MTU %d: %w", mtu, err)
		}
		err = netVMFigures(vm, mtu, pPort, sPort, size, hostPlain, hostTLS, func() int {
			holdMu.Lock()
			defer holdMu.Unlock()
			return len(held)
		})
		if err == nil && mtu == 0 {
			err = cw.figures(vm)
		}
		vm.stop()
		if err != nil {
			return err
		}
	}
	return nicReadyBench(capsem, home, guest, runs)
}

func portOf(a net.Addr) string {
	_, p, _ := net.SplitHostPort(a.String())
	return p
}

// guestTimed runs script in the VM and returns how long the guest took.
func guestTimed(vm *vmHandle, script string) (time.Duration, string, error) {
	var out, errOut bytes.Buffer
	ev, err := vm.client.Exec(context.Background(), &api.ExecRequest{Command: script}, &out, &errOut)
	if err != nil {
		return 0, "", err
	}
	if ev.ExitCode != 0 {
		return 0, "", fmt.Errorf("%q: exit %d: %s%s", script, ev.ExitCode, out.String(), errOut.String())
	}
	return time.Duration(ev.DurationMS) * time.Millisecond, out.String(), nil
}

func netVMFigures(vm *vmHandle, mtu int, pPort, sPort string, size int, hostPlain, hostTLS float64, held func() int) error {
	mtuName := "65520 (default)"
	if mtu != 0 {
		mtuName = strconv.Itoa(mtu)
	}
	download := func(url string) (float64, error) {
		// Each download is timed in the guest, best of two (the first
		// also resolves the name).
		best := time.Duration(0)
		for range 2 {
			d, _, err := guestTimed(vm, "wget -q --no-check-certificate -O /dev/null "+url)
			if err != nil {
				return 0, err
			}
			if best == 0 || d < best {
				best = d
			}
		}
		return float64(size) / 1e6 / best.Seconds(), nil
	}
	gPlain, err := download("http://bench.test:" + pPort + "/big")
	if err != nil {
		return err
	}
	gTLS, err := download("https://bench.test:" + sPort + "/big")
	if err != nil {
		return err
	}
	fmt.Printf("  MTU %s: a 100 MB download in the guest (busybox wget): HTTP %.0f MB/s (%.0f%% of the host's), HTTPS %.0f MB/s (%.0f%%; busybox's own TLS under TCG)\n",
		mtuName, gPlain, 100*gPlain/hostPlain, gTLS, 100*gTLS/hostTLS)
	if mtu != 0 {
		return nil
	}
	// Per connection: the guest client opens connections to the host's
	// server through the stack, connect to the answer's first byte (the
	// name resolved once, before), beside the same to an httpd on the
	// guest's own loopback.
	dir, err := os.MkdirTemp("", "capsem-bench-client-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := installGuestClient(vm, dir); err != nil {
		return err
	}
	const n = 50
	_, through, err := guestTimed(vm, fmt.Sprintf("/tmp/credclient -connect bench.test:%s -n %d", pPort, n))
	if err != nil {
		return err
	}
	_, local, err := guestTimed(vm, fmt.Sprintf("mkdir -p /tmp/www && echo ok > /tmp/www/small && (httpd -f -p 127.0.0.1:8088 -h /tmp/www & echo $! > /tmp/httpd.pid); sleep 0.3; "+
		"/tmp/credclient -connect 127.0.0.1:8088 -n %d; s=$?; kill $(cat /tmp/httpd.pid); exit $s", n))
	if err != nil {
		return err
	}
	fmt.Printf("  a connection through the stack, connect to first byte (Go client in the guest, %d connections, the name resolved before): %s; to the guest's own loopback httpd: %s\n",
		n, strings.TrimSpace(through), strings.TrimSpace(local))

	// 100 connections held open by the server, the guest's nc's waiting.
	before := rssKB(vm.proc.PID())
	if _, _, err := guestTimed(vm, "i=0; while [ $i -lt 100 ]; do (printf 'GET /hold HTTP/1.1\\r\\nHost: bench.test\\r\\n\\r\\n'; sleep 60) | nc bench.test "+pPort+" >/dev/null 2>&1 & i=$((i+1)); done; sleep 1"); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for held() < 100 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	open := rssKB(vm.proc.PID())
	// RSS, not the Go heap: a change smaller than the heap's spare room
	// does not show, so the difference is printed in all, not divided.
	fmt.Printf("  per-VM process RSS: %d MiB idle, %d MiB with %d connections open through it (%+d KiB in all)\n",
		before>>10, open>>10, held(), open-before)
	guestTimed(vm, "killall nc sleep 2>/dev/null; true")
	return nil
}

func ms1(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func rssKB(pid int) int64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// nicReadyBench: create → exec-ready, booted, with and without the NIC,
// interleaved.
func nicReadyBench(capsem, home, guest string, runs int) error {
	var with, without []time.Duration
	for i := 0; i < runs; i++ {
		for _, m := range []struct {
			into  *[]time.Duration
			noNIC bool
		}{{&with, false}, {&without, true}} {
			r, _, _, err := capsemCycle(capsem, home, guest, func(c *vmhost.ProcessConfig) { c.NoBootState, c.NoNetwork = true, m.noNIC }, "booted")
			if err != nil {
				return err
			}
			*m.into = append(*m.into, r)
		}
	}
	fmt.Printf("  capsem create → exec-ready, booted: with the NIC %s, without (--no-network) %s (%d runs each, medians)\n", ms(median(with)), ms(median(without)), runs)
	return nil
}
