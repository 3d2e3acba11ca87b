// Command linecat copies stdin to stdout the way capsem's helper processes
// move their messages: stdio made pollable and read and written with raw
// system calls (core/procs). The benchmark times a line through it as the
// cost of one Go process hop on this machine, beside the same through cat.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/capsem/capsem/core/procs"
)

func main() {
	in, out, restore := procs.PollableStdio()
	defer restore()
	buf := make([]byte, 64<<10)
	r, w := procs.RawReader(in), procs.RawWriter(out)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				fmt.Fprintln(os.Stderr, "linecat:", werr)
				os.Exit(1)
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "linecat:", err)
			os.Exit(1)
		}
	}
}
