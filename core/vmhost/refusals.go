package vmhost

import (
	"fmt"
	"sync"
	"time"
)

// A guest can be refused as fast as it can send SYNs and queries, and a
// row per refusal would let it fill the disk and crowd out the rows that
// matter. So refusals are rows one by one up to a rate, and past it they
// are counted: one summary row per kind says how many were not recorded
// one by one, written once the burst has passed (or the VM stops). Allowed
// connections and queries are never summarised. Attempts to move a
// credential have a budget of their own, so a flood of other refusals
// cannot push them into a summary, nor they flood the ledger.
const (
	refusalRate     = 100  // rows per second, sustained
	refusalBurst    = 1000 // rows at once
	refusalInterval = 10 * time.Second
)

// refusalKind names what a summary counts.
type refusalKind int

const (
	refusedConnections refusalKind = iota
	refusedQueries
	exfiltrationAttempts
	refusalKinds
)

// refusalBudget is a token bucket with counts of what it turned away.
type refusalBudget struct {
	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed [refusalKinds]int64
	since      time.Time // the first suppressed refusal not summarised
	timer      *time.Timer
	closed     bool
	interval   time.Duration
	// summarise writes a summary row.
	summarise func(kind refusalKind, n int64, since time.Time)
}

func newRefusalBudget(summarise func(refusalKind, int64, time.Time)) *refusalBudget {
	return &refusalBudget{tokens: refusalBurst, last: time.Now(), summarise: summarise, interval: refusalInterval}
}

// take reports whether a refusal of kind gets its own row; if not, it is
// counted for the next summary.
func (b *refusalBudget) take(kind refusalKind) bool {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(refusalBurst, b.tokens+now.Sub(b.last).Seconds()*refusalRate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.suppressed == [refusalKinds]int64{} {
		b.since = now
	}
	b.suppressed[kind]++
	if b.timer == nil && !b.closed {
		b.timer = time.AfterFunc(b.interval, b.flush)
	}
	return false
}

// flush writes the summaries of what was counted.
func (b *refusalBudget) flush() {
	b.mu.Lock()
	counts, since := b.suppressed, b.since
	b.suppressed, b.timer = [refusalKinds]int64{}, nil
	b.mu.Unlock()
	for kind, n := range counts {
		if n > 0 {
			b.summarise(refusalKind(kind), n, since)
		}
	}
}

// close stops the timer and writes what is left; take counts no longer
// schedule a summary.
func (b *refusalBudget) close() {
	b.mu.Lock()
	b.closed = true
	if b.timer != nil {
		b.timer.Stop()
	}
	b.mu.Unlock()
	b.flush()
}

// summaryReason says what a summary row stands for.
func summaryReason(kind refusalKind, n int64, since time.Time) string {
	what := "refused connections"
	switch kind {
	case refusedQueries:
		what = "refused DNS queries"
	case exfiltrationAttempts:
		what = "refused attempts to move a credential"
	}
	return fmt.Sprintf("%d more %s since %s, past the ledger's %d rows/s for them, are counted here instead of one row each",
		n, what, since.UTC().Format(time.RFC3339), refusalRate)
}
