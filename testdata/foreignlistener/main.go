// Command foreignlistener plays another local user who bound a capsem
// socket first: it listens on the Unix socket named by its argument (mode
// 0777, as such a user would leave it), accepts every connection and
// counts the bytes each carries. It prints "listening" once it listens and,
// when its stdin closes, "connections N bytes M" and exits. Tests run it
// as another uid (testkit.ListenAsNobody) to prove that a client sends it
// nothing.
package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// readFor bounds how long one connection is read: a client that waits for
// an answer that never comes must not keep this process from reporting.
const readFor = 2 * time.Second

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: foreignlistener SOCKET")
		os.Exit(2)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: os.Args[1], Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "foreignlistener:", err)
		os.Exit(1)
	}
	// The socket may be moved by the test: closing must not remove
	// whatever has its old name.
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(os.Args[1], 0o777); err != nil {
		fmt.Fprintln(os.Stderr, "foreignlistener:", err)
		os.Exit(1)
	}
	var conns, received atomic.Int64
	var reads sync.WaitGroup
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			reads.Go(func() {
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(readFor))
				n, _ := io.Copy(io.Discard, c)
				received.Add(n)
			})
		}
	}()
	fmt.Println("listening")
	io.Copy(io.Discard, os.Stdin)
	// Accept what is still queued before counting.
	ln.SetDeadline(time.Now().Add(200 * time.Millisecond))
	<-accepting
	reads.Wait()
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintln(os.Stderr, "foreignlistener:", err)
	}
	fmt.Printf("connections %d bytes %d\n", conns.Load(), received.Load())
}
