package vmhost

import (
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRefusalBudget(t *testing.T) {
	var mu sync.Mutex
	got := map[refusalKind]int64{}
	var reasons []string
	b := newRefusalBudget(func(k refusalKind, n int64, since time.Time) {
		mu.Lock()
		got[k] += n
		reasons = append(reasons, summaryReason(k, n, since))
		mu.Unlock()
	})
	b.interval = 200 * time.Millisecond
	rows := 0
	for i := range 5000 {
		kind := refusedConnections
		if i%2 == 1 {
			kind = refusedQueries
		}
		if b.take(kind) {
			rows++
		}
	}
	// The burst, and what the rate refilled meanwhile.
	if rows < refusalBurst || rows > refusalBurst+50 {
		t.Fatalf("%d refusals got rows of their own; want the burst of %d", rows, refusalBurst)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		total := got[refusedConnections] + got[refusedQueries]
		mu.Unlock()
		if int(total)+rows == 5000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("summaries counted %d, rows %d: %d refusals lost", total, rows, 5000-rows-int(total))
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	if got[refusedConnections] == 0 || got[refusedQueries] == 0 || !strings.Contains(strings.Join(reasons, "|"), "more refused DNS queries since") {
		t.Fatalf("summaries %v %q", got, reasons)
	}
	mu.Unlock()
	// After a pause the budget refills.
	time.Sleep(200 * time.Millisecond)
	if !b.take(refusedConnections) {
		t.Fatal("no row after the rate refilled the budget")
	}
	// What is counted when the VM stops is written by close.
	for b.take(refusedConnections) {
	}
	b.take(refusedConnections)
	mu.Lock()
	before := got[refusedConnections]
	mu.Unlock()
	b.close()
	mu.Lock()
	defer mu.Unlock()
	if got[refusedConnections] <= before {
		t.Fatal("close did not write the last summary")
	}
}
