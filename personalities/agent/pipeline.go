package agent

import (
	"io"
	"sync/atomic"
)

// pipeline moves pieces from read to write, reading the next piece into
// one buffer while the last is written from another. A file transfer is a
// disk on one side and the host channel on the other, each a device QEMU
// answers: done one after the other, each waits out the other's round trip
// to the host; pipelined, they overlap.
//
// read fills a buffer (partly at the end) and returns io.EOF once the
// source has nothing more; write takes one piece. pipeline returns write's
// first error, or read's other than io.EOF. release runs once neither
// side uses the buffers: at return, or, when write failed while read was
// still blocked (a stream the caller closes after an error), once read
// returns.
func pipeline(bufs [][]byte, release func(), read func([]byte) (int, error), write func([]byte) error) error {
	type piece struct {
		buf []byte
		n   int
		err error
	}
	// Each buffer is in one place at a time: free, being read into, full,
	// or being written. full has room for all of them, so the reader never
	// blocks on it, even after the writer left.
	free := make(chan []byte, len(bufs))
	full := make(chan piece, len(bufs))
	for _, b := range bufs {
		free <- b
	}
	stop := make(chan struct{})
	var users atomic.Int32
	users.Store(2)
	leave := func() {
		if users.Add(-1) == 0 {
			release()
		}
	}
	go func() {
		defer leave()
		for {
			var buf []byte
			select {
			case <-stop:
				return
			case buf = <-free:
			}
			select {
			case <-stop: // a free buffer and a stop at once: stop wins
				return
			default:
			}
			n, err := read(buf)
			full <- piece{buf, n, err}
			if err != nil {
				return
			}
		}
	}()
	defer leave()
	for {
		p := <-full
		if p.n > 0 {
			if err := write(p.buf[:p.n]); err != nil {
				close(stop)
				return err
			}
		}
		if p.err == io.EOF {
			return nil
		}
		if p.err != nil {
			return p.err // the reader has ended
		}
		free <- p.buf
	}
}
