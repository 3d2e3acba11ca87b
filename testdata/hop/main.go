// Command hop runs its arguments as a child process and forwards bytes both
// ways, stdin to the child's stdin and the child's stdout to stdout, doing
// no other work. It moves them the way capsem's helper processes do (stdio
// made pollable, raw system calls, one P). The benchmark chains three hops
// (`hop hop hop echoserver`) in front of the echo server: the same number of
// extra processes the gateway path puts between a client and a server
// (relay, endpoint, aggregator), so the chain's figures are what this
// machine charges for the processes alone, before any gateway work.
package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/capsem/capsem/core/procs"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: hop COMMAND [ARG...]")
		os.Exit(2)
	}
	procs.Limit(1)
	in, out, restore := procs.PollableStdio()
	defer restore()
	child := exec.Command(os.Args[1], os.Args[2:]...)
	child.Stderr = os.Stderr
	toChild, err := child.StdinPipe()
	if err != nil {
		fail(err)
	}
	fromChild, err := child.StdoutPipe()
	if err != nil {
		fail(err)
	}
	if err := child.Start(); err != nil {
		fail(err)
	}
	go func() {
		// The child's stdin closes when ours does, so it exits in turn.
		forward(toChild, procs.RawReader(in))
		toChild.Close()
	}()
	forward(procs.RawWriter(out), fromChild)
	if err := child.Wait(); err != nil {
		fail(err)
	}
}

// forward copies r to w until r ends or w fails.
func forward(w io.Writer, r io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hop:", err)
	os.Exit(1)
}
