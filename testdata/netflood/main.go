//go:build linux

// Command netflood is the attacker of the guest network's end-to-end test:
// run as root inside a guest, it opens -conns TCP connections to -addr at
// once and sends nothing on them (so the host holds each while it waits for
// a first flight), then sends -dns DNS queries for random names under
// -suffix as fast as it can from several sockets. It prints
// "conns established=N refused=N other=N open=N" and "dns sent=N
// answered=N", where open is the most connections open at one instant,
// each from its handshake until the host (or the run's end) ended it.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	conns := flag.Int("conns", 0, "TCP connections to open at once")
	addr := flag.String("addr", "", "where to connect (ip:port)")
	hold := flag.Duration("hold", 3*time.Second, "how long to keep them open")
	queries := flag.Int("dns", 0, "DNS queries to send")
	suffix := flag.String("suffix", "flood.test", "the names' suffix")
	flag.Parse()
	unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 1 << 16, Max: 1 << 16})
	if *conns > 0 {
		flood(*conns, *addr, *hold)
	}
	if *queries > 0 {
		dnsFlood(*queries, *suffix)
	}
}

func flood(n int, addr string, hold time.Duration) {
	// Each connection is open from its handshake until the host ends it
	// (it holds a silent one for a few seconds) or the end of the run.
	type span struct{ from, to time.Time }
	var spans []*span
	var established, refused, other atomic.Int64
	var wg, readers sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	sem := make(chan struct{}, 512) // connects in flight
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp4", addr, 20*time.Second)
			switch {
			case err == nil:
				established.Add(1)
				sp := &span{from: time.Now()}
				mu.Lock()
				spans = append(spans, sp)
				open = append(open, c)
				mu.Unlock()
				readers.Add(1)
				go func() {
					defer readers.Done()
					c.Read(make([]byte, 1)) // returns when either side ends it
					mu.Lock()
					sp.to = time.Now()
					mu.Unlock()
				}()
			case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET):
				refused.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	time.Sleep(hold)
	for _, c := range open {
		c.Close()
	}
	readers.Wait()
	// The most connections open at one instant: +1 at each start, -1 at
	// each end, ends first on a tie.
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, sp := range spans {
		edges = append(edges, edge{sp.from, 1}, edge{sp.to, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	most, now := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	fmt.Printf("conns established=%d refused=%d other=%d open=%d\n", established.Load(), refused.Load(), other.Load(), most)
}

func dnsFlood(n int, suffix string) {
	var sent, answered atomic.Int64
	var wg sync.WaitGroup
	per := n / 8
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp4", "192.168.127.1:53")
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return
			}
			defer c.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				buf := make([]byte, 1500)
				for {
					c.SetReadDeadline(time.Now().Add(3 * time.Second))
					if _, err := c.Read(buf); err != nil {
						return
					}
					answered.Add(1)
				}
			}()
			for i := range per {
				name := fmt.Sprintf("q%d-%d-%x.%s", w, i, rand.Uint32(), suffix)
				if _, err := c.Write(query(uint16(i), name)); err == nil {
					sent.Add(1)
				}
			}
			<-done
		}()
	}
	wg.Wait()
	fmt.Printf("dns sent=%d answered=%d\n", sent.Load(), answered.Load())
}

func query(id uint16, name string) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0)
	start := 0
	for i := 0; i <= len(name); i++ {
		if i == len(name) || name[i] == '.' {
			q = append(q, byte(i-start))
			q = append(q, name[start:i]...)
			start = i + 1
		}
	}
	return append(q, 0, 0, 1, 0, 1)
}
