package procs

import (
	"io"
	"runtime"
	"sync"
)

// GroupWriter lets many goroutines write whole messages to one stream and
// puts the messages that are ready at the same moment into one system call.
// A Write returns once its bytes went out (or the stream failed). A writer
// that finds no write in progress leads a round: it yields once, so that the
// goroutines already runnable (answers read from one chunk of input, say)
// can add their messages, then writes everything pending. When nothing else
// is runnable the yield returns at once, so a lone writer pays nothing for
// it. Messages never interleave and keep the order in which their Writes
// were called.
type GroupWriter struct {
	w io.Writer

	mu       sync.Mutex
	written  *sync.Cond // signalled after each write of the stream
	pending  [][]byte   // messages waiting for the next write (the callers' own bytes: they wait)
	spare    [][]byte
	scratch  []byte
	queued   uint64 // messages appended so far
	done     uint64 // messages written or failed so far
	good     uint64 // messages written so far
	flushing bool
	err      error // sticky: the stream failed
}

// NewGroupWriter returns a GroupWriter over w.
func NewGroupWriter(w io.Writer) *GroupWriter {
	g := &GroupWriter{w: w}
	g.written = sync.NewCond(&g.mu)
	return g
}

// Write writes p as one message.
func (g *GroupWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	g.pending = append(g.pending, p)
	g.queued++
	mine := g.queued
	for g.done < mine {
		if g.flushing {
			g.written.Wait()
			continue
		}
		g.flushRound()
	}
	return g.result(mine, len(p))
}

// flushRound writes everything pending, as the leader of one round; called
// with mu held and no round in progress. A leader leads one round only, the
// one that carries its own message: messages that arrive during the write
// are led by one of their own writers, so no caller is kept writing for
// others under sustained load.
func (g *GroupWriter) flushRound() {
	g.flushing = true
	g.mu.Unlock()
	runtime.Gosched()
	g.mu.Lock()
	batch, upTo := g.pending, g.queued
	g.pending = g.spare[:0]
	g.mu.Unlock()
	err := g.writeBatch(batch)
	g.mu.Lock()
	clear(batch)
	g.spare = batch
	if err != nil {
		g.err = err
		upTo = g.queued // everyone still waiting fails with it
		g.pending = nil
	} else {
		g.good = upTo
	}
	g.done = upTo
	g.flushing = false
	g.written.Broadcast()
}

// groupLimit is the most bytes copied together into one write; a bigger
// message is written on its own, from the caller's buffer.
const groupLimit = 64 << 10

// writeBatch writes the messages in order, small ones gathered into one
// write. Only the leader calls it, so scratch is its own.
func (g *GroupWriter) writeBatch(batch [][]byte) error {
	for i := 0; i < len(batch); {
		if len(batch[i]) > groupLimit || i == len(batch)-1 {
			if _, err := g.w.Write(batch[i]); err != nil {
				return err
			}
			i++
			continue
		}
		g.scratch = g.scratch[:0]
		for i < len(batch) && len(batch[i]) <= groupLimit && len(g.scratch)+len(batch[i]) <= groupLimit {
			g.scratch = append(g.scratch, batch[i]...)
			i++
		}
		if _, err := g.w.Write(g.scratch); err != nil {
			return err
		}
	}
	return nil
}

// result reports on message number n of length size, once it is done.
func (g *GroupWriter) result(n uint64, size int) (int, error) {
	if n <= g.good {
		return size, nil
	}
	return 0, g.err
}
