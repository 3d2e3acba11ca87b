//go:build linux

// Command randread times reads of one file inside a guest, for make bench's
// root image figures. It first flushes and drops the guest's page cache
// (as root), so every read comes from the disk behind the file, then:
//
//	-mode seq:    reads the whole file in 1 MiB reads, start to end;
//	-mode random: reads -n blocks of 4 KiB at 4 KiB-aligned offsets
//	              spread at random over the file, readahead off
//	              (POSIX_FADV_RANDOM), so each read fetches what it needs.
//
// It prints one line: "bytes=<n> seconds=<s> reads=<k> p50_us=<µs> p99_us=<µs>".
package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	mode := flag.String("mode", "seq", "seq or random")
	n := flag.Int("n", 2000, "random reads (-mode random)")
	seed := flag.Uint64("seed", 1, "seed of the random offsets")
	keepCache := flag.Bool("keep-cache", false, "do not drop the page cache first")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: randread [-mode seq|random] [-n reads] FILE")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *mode, *n, *seed, !*keepCache); err != nil {
		fmt.Fprintln(os.Stderr, "randread:", err)
		os.Exit(1)
	}
}

func run(path, mode string, n int, seed uint64, dropCache bool) error {
	if dropCache {
		unix.Sync()
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
			return fmt.Errorf("dropping the page cache: %w", err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var lat []time.Duration
	var total int64
	start := time.Now()
	switch mode {
	case "seq":
		buf := make([]byte, 1<<20)
		for {
			t := time.Now()
			k, err := f.Read(buf)
			total += int64(k)
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
			lat = append(lat, time.Since(t))
		}
	case "random":
		const block = 4096
		blocks := st.Size() / block
		if blocks < 1 || n < 1 {
			return fmt.Errorf("%s: %d bytes, %d reads: nothing to read", path, st.Size(), n)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM); err != nil {
			return fmt.Errorf("fadvise: %w", err)
		}
		rng := rand.New(rand.NewPCG(seed, 0))
		buf := make([]byte, block)
		start = time.Now()
		for range n {
			off := rng.Int64N(blocks) * block
			t := time.Now()
			k, err := f.ReadAt(buf, off)
			if err != nil && err != io.EOF {
				return err
			}
			lat = append(lat, time.Since(t))
			total += int64(k)
		}
	default:
		return fmt.Errorf("-mode %q: want seq or random", mode)
	}
	took := time.Since(start)
	if total != st.Size() && mode == "seq" {
		return fmt.Errorf("%s: read %d of %d bytes", path, total, st.Size())
	}
	slices.Sort(lat)
	if len(lat) == 0 {
		lat = []time.Duration{0}
	}
	fmt.Printf("bytes=%d seconds=%.6f reads=%d p50_us=%d p99_us=%d\n", total, took.Seconds(), len(lat),
		lat[len(lat)/2].Microseconds(), lat[len(lat)*99/100].Microseconds())
	return nil
}
