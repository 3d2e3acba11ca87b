package vmhost

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/capsem/capsem/core/ledger"
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

// TestRefusalSummariesAreRows: the summary rows are rows the ledger takes
// (a summary it refused would lose the count it carries).
func TestRefusalSummariesAreRows(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "session.db")
	l, err := ledger.Open(ctx, path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &ledgerRecorder{v: &VM{ledger: l}, log: slog.New(slog.DiscardHandler)}
	since := time.Now()
	r.summary(refusedConnections, 1234, since)
	r.summary(refusedQueries, 567, since)
	l.Close()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`SELECT policy_reason FROM net_events WHERE policy_rule = 'rate-limited' AND decision = 'denied'`,
		`SELECT policy_reason FROM dns_events WHERE policy_rule = 'rate-limited' AND decision = 'denied'`,
	} {
		var reason string
		if err := db.QueryRow(q).Scan(&reason); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		var n int
		if _, err := fmt.Sscanf(reason, "%d more refused", &n); err != nil || (n != 1234 && n != 567) {
			t.Fatalf("summary %q", reason)
		}
	}
}
