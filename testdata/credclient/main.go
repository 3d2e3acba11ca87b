// Command credclient is a guest program of the tests: an HTTPS client that
// trusts what the guest's environment says (SSL_CERT_FILE, as every Go,
// OpenSSL and Python client does) and sends the credential placeholder the
// guest was given, as a model API's SDK would.
package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	url := flag.String("url", "", "the URL to POST to")
	header := flag.String("header", "x-api-key", "the header that carries the key")
	env := flag.String("env", "ANTHROPIC_API_KEY", "the variable holding the key")
	data := flag.String("data", `{"model":"claude-test-1","stream":true}`, "the request body")
	extra := flag.String("extra", "", "another header, name:value")
	scanRoot := flag.String("scan", "", "instead: search the files under this root for a secret")
	scanPrefix := flag.String("scan-prefix", "", "the secret's public prefix")
	scanLen := flag.Int("scan-len", 0, "the secret's length")
	scanSum := flag.String("scan-sha256", "", "the secret's SHA-256, hex")
	n := flag.Int("n", 1, "instead: send the request this many times and print the latency")
	reuse := flag.Bool("reuse", false, "with -n: keep the connection between requests")
	dial := flag.String("dial", "", "instead: a TLS handshake with this address (host:port), naming -sni")
	sni := flag.String("sni", "", "with -dial: the server name the ClientHello carries")
	connect := flag.String("connect", "", "instead: time -n plain HTTP connections to this host:port, connect to first byte")
	flag.Parse()
	if *connect != "" {
		firstByte(*connect, *n)
		return
	}
	if *dial != "" {
		handshake(*dial, *sni)
		return
	}
	if *scanRoot != "" {
		scan(*scanRoot, *scanPrefix, *scanLen, *scanSum)
		return
	}
	if *n > 1 {
		latency(*url, *header, *env, *data, *n, *reuse)
		return
	}
	req, err := http.NewRequest("POST", *url, strings.NewReader(*data))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	req.Header.Set(*header, os.Getenv(*env))
	req.Header.Set("Content-Type", "application/json")
	if k, v, ok := strings.Cut(*extra, ":"); ok {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "request:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	fmt.Printf("status=%d proto=%s echo=%s\n", resp.StatusCode, resp.Proto, resp.Header.Get("X-Echo"))
	io.Copy(os.Stdout, resp.Body)
}

// firstByte resolves addr's host once, then opens n connections to it, each
// sending one small HTTP request, and prints the median and mean time from
// connect to the answer's first byte: what a connection costs past its
// DNS lookup and process start.
func firstByte(addr string, n int) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ips, err := net.LookupHost(host)
	if err != nil || len(ips) == 0 {
		fmt.Fprintln(os.Stderr, "lookup:", err)
		os.Exit(1)
	}
	target := net.JoinHostPort(ips[0], port)
	request := "GET /small HTTP/1.0\r\nHost: " + addr + "\r\n\r\n"
	var times []time.Duration
	for range n {
		start := time.Now()
		conn, err := net.DialTimeout("tcp", target, 30*time.Second)
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect:", err)
			os.Exit(1)
		}
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		var b [1]byte
		if _, err := io.WriteString(conn, request); err == nil {
			_, err = conn.Read(b[:])
		}
		conn.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "request:", err)
			os.Exit(1)
		}
		times = append(times, time.Since(start))
	}
	printTimes(times)
}

// handshake opens a TLS connection to addr naming sni, whatever the address
// was resolved for, as a client fronting one name on another's address
// would, and prints "handshake ok" or exits 1 with the error. The
// certificate is not checked: the question is whether the host lets the
// ClientHello reach a server at all.
func handshake(addr, sni string) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "handshake:", err)
		os.Exit(1)
	}
	conn.Close()
	fmt.Println("handshake ok")
}

// scan looks for a secret known by its prefix, length and hash in every
// regular file under root (kernel file systems left out), and prints
// "scanned N files, B bytes found=K" and each file it is in.
func scan(root, prefix string, n int, sum string) {
	var files, size, found int
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys" || p == "/dev") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		files, size = files+1, size+len(b)
		for rest := b; ; {
			i := bytes.Index(rest, []byte(prefix))
			if i < 0 {
				break
			}
			if w := rest[i:]; len(w) >= n {
				h := sha256.Sum256(w[:n])
				if hex.EncodeToString(h[:]) == sum {
					found++
					fmt.Println("found in", p)
					break
				}
			}
			rest = rest[i+1:]
		}
		return nil
	})
	fmt.Printf("scanned %d files, %d bytes found=%d\n", files, size, found)
}

// latency sends the request n times, each on a new connection unless
// reuse, and prints "p50_ms=X mean_ms=Y" of request → whole answer.
func latency(url, header, env, data string, n int, reuse bool) {
	tr := &http.Transport{DisableKeepAlives: !reuse, ForceAttemptHTTP2: true}
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var times []time.Duration
	for range n {
		req, _ := http.NewRequest("POST", url, strings.NewReader(data))
		req.Header.Set(header, os.Getenv(env))
		t := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			fmt.Fprintln(os.Stderr, "request:", err)
			os.Exit(1)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fmt.Fprintln(os.Stderr, "status", resp.StatusCode)
			os.Exit(1)
		}
		times = append(times, time.Since(t))
	}
	printTimes(times)
}

// printTimes prints the median and the mean of times, in milliseconds.
func printTimes(times []time.Duration) {
	slices.Sort(times)
	var sum time.Duration
	for _, d := range times {
		sum += d
	}
	fmt.Printf("p50_ms=%.2f mean_ms=%.2f\n", float64(times[len(times)/2].Microseconds())/1000, float64(sum.Microseconds())/1000/float64(len(times)))
}
