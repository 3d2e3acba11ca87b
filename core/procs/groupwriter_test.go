package procs

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowSink records each write; every write takes a while, so writers that
// arrive meanwhile queue up behind the one in progress.
type slowSink struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	first  []*byte // address of each write's first byte
	failAt int     // fail the nth write (1-based); 0 never
	delay  time.Duration
}

func (s *slowSink) Write(p []byte) (int, error) {
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.failAt != 0 && s.writes >= s.failAt {
		return 0, errors.New("sink broke")
	}
	if len(p) > 0 {
		s.first = append(s.first, &p[0])
	}
	return s.buf.Write(p)
}

// Concurrent messages all arrive whole, each writer's in its own order, and
// writers that wait behind a write in progress share the next one.
func TestGroupWriterConcurrentMessagesWholeAndGrouped(t *testing.T) {
	sink := &slowSink{delay: 2 * time.Millisecond}
	g := NewGroupWriter(sink)
	const writers, each = 16, 20
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				msg := fmt.Sprintf("<w%02d m%02d %s>\n", w, i, strings.Repeat("x", w))
				if n, err := g.Write([]byte(msg)); err != nil || n != len(msg) {
					t.Errorf("write: %d %v", n, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(sink.buf.String(), "\n"), "\n")
	if len(lines) != writers*each {
		t.Fatalf("%d messages arrived, want %d", len(lines), writers*each)
	}
	next := map[int]int{}
	for _, l := range lines {
		var w, i int
		var pad string
		if _, err := fmt.Sscanf(l, "<w%02d m%02d %s", &w, &i, &pad); err != nil || len(pad) != w+1 || i != next[w] {
			t.Fatalf("message %q: torn, or out of its writer's order (want m%02d)", l, next[w])
		}
		next[w]++
	}
	if sink.writes >= writers*each {
		t.Fatalf("%d writes for %d messages: nothing was grouped", sink.writes, writers*each)
	}
	t.Logf("%d messages in %d writes", writers*each, sink.writes)
}

// A message over the grouping limit goes out from the caller's own buffer.
func TestGroupWriterLargeMessageNotCopied(t *testing.T) {
	sink := &slowSink{}
	g := NewGroupWriter(sink)
	big := bytes.Repeat([]byte("y"), groupLimit+1)
	if _, err := g.Write(big); err != nil {
		t.Fatal(err)
	}
	if len(sink.first) != 1 || sink.first[0] != &big[0] {
		t.Fatal("the large message was copied")
	}
}

// A failed write fails the messages it carried and every later one, with the
// stream's error; messages written before it succeeded.
func TestGroupWriterFailureIsSticky(t *testing.T) {
	sink := &slowSink{failAt: 2}
	g := NewGroupWriter(sink)
	if _, err := g.Write([]byte("one\n")); err != nil {
		t.Fatalf("first: %v", err)
	}
	if _, err := g.Write([]byte("two\n")); err == nil || err.Error() != "sink broke" {
		t.Fatalf("second: %v", err)
	}
	if _, err := g.Write([]byte("three\n")); err == nil || err.Error() != "sink broke" {
		t.Fatalf("after the failure: %v", err)
	}
	if sink.buf.String() != "one\n" {
		t.Fatalf("sink holds %q", sink.buf.String())
	}
}

// arrivingSink: during each of its first arrivals writes, a new writer
// arrives and queues a message (so there is always more to write). Every
// write after the first waits for gate, so a test can see who is writing
// before any second round has done anything.
type arrivingSink struct {
	g            *GroupWriter
	mu           sync.Mutex
	writes       int
	arrivals     int
	wg           sync.WaitGroup
	gate         chan struct{}
	secondWrites chan struct{} // closed when the second write begins
}

func (s *arrivingSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.writes++
	n := s.writes
	spawn := s.writes <= s.arrivals
	s.mu.Unlock()
	if n == 2 {
		close(s.secondWrites)
	}
	if n >= 2 {
		<-s.gate
	}
	if spawn {
		s.g.mu.Lock()
		before := s.g.queued
		s.g.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.g.Write([]byte("other\n"))
		}()
		for { // until the newcomer's message is queued
			s.g.mu.Lock()
			queued := s.g.queued
			s.g.mu.Unlock()
			if queued > before {
				break
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
	return len(p), nil
}

// A writer that leads a round returns after it, even while new writers keep
// arriving during every write: it is not kept writing their messages.
func TestGroupWriterLeaderLeadsOneRound(t *testing.T) {
	sink := &arrivingSink{arrivals: 50, gate: make(chan struct{}), secondWrites: make(chan struct{})}
	g := NewGroupWriter(sink)
	sink.g = g
	leaderDone := make(chan error, 1)
	go func() {
		_, err := g.Write([]byte("leader\n"))
		leaderDone <- err
	}()
	// The second round has begun and is held at the gate: a leader that
	// led it too would be held there with it and never return.
	<-sink.secondWrites
	select {
	case err := <-leaderDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(sink.gate)
		t.Fatal("the leader did not return while the second round was held: it leads the newcomers' round too")
	}
	close(sink.gate)
	sink.wg.Wait() // the newcomers lead their own rounds
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.writes != sink.arrivals+1 {
		t.Fatalf("%d writes, want %d", sink.writes, sink.arrivals+1)
	}
}
