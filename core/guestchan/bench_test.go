package guestchan

import (
	"context"
	"io"
	"sort"
	"sync"
	"testing"
	"time"
)

// benchPair is a host/guest session pair over a socketpair with an echo
// listener on PortControl of the guest.
func benchPair(b *testing.B) (host *Session, stop func()) {
	host, guest := pair(b, socketPair)
	l, err := guest.Listen(PortControl)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	serveEcho(l, &wg)
	sink, err := guest.Listen(PortExecOutput)
	if err != nil {
		b.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return host, func() { l.Close(); sink.Close(); host.Close(); guest.Close(); wg.Wait() }
}

// BenchmarkRoundTrip64 is one 64-byte echo on an open stream.
func BenchmarkRoundTrip64(b *testing.B) {
	host, stop := benchPair(b)
	defer stop()
	c, err := host.Dial(context.Background(), PortControl)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 64)
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

// BenchmarkDial is open + header + reply + close of a stream.
func BenchmarkDial(b *testing.B) {
	host, stop := benchPair(b)
	defer stop()
	for b.Loop() {
		c, err := host.Dial(context.Background(), PortControl)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkThroughput streams 1 MiB writes host → guest on one stream.
func BenchmarkThroughput(b *testing.B) {
	host, stop := benchPair(b)
	defer stop()
	c, err := host.Dial(context.Background(), PortExecOutput)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
