package vmhost

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/capsem/capsem/core/ledger"
	"github.com/capsem/capsem/core/netpolicy"
	"github.com/capsem/capsem/core/netstack"
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

// newLedgerRecorder is a ledgerRecorder writing to a new ledger of its
// own (closed by the caller), and the ledger's path.
func newLedgerRecorder(t *testing.T) (*ledgerRecorder, *ledger.Ledger, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "session.db")
	l, err := ledger.Open(context.Background(), path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return &ledgerRecorder{v: &VM{ledger: l}, log: slog.New(slog.DiscardHandler)}, l, path
}

// TestRefusalSummariesAreRows: the summary rows are rows the ledger takes
// (a summary it refused would lose the count it carries).
func TestRefusalSummariesAreRows(t *testing.T) {
	r, l, path := newLedgerRecorder(t)
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

// TestRefusalFloodsAddUp: a guest flooding past each bound (SYNs reset at
// the flow bound, queries dropped at the lookup bound, placeholders sent
// where they may not go) gets rows up to the ledger's budget and summary
// rows for the rest, so for each kind the rows and the counts in the
// summaries add up to the attempts. Attempts to move a credential have a
// budget of their own: the flood of other refusals before them does not
// push them into a summary.
func TestRefusalFloodsAddUp(t *testing.T) {
	r, l, path := newLedgerRecorder(t)
	r.refusals, r.exfiltrations = newRefusalBudget(r.summary), newRefusalBudget(r.summary)
	const attempts = refusalBurst + 500
	dst := netip.MustParseAddrPort("203.0.113.10:443")
	for range attempts {
		r.Conn(netstack.ConnEvent{Start: time.Now(), Addr: dst, Kind: netstack.KindTCP,
			Verdict: netpolicy.Verdict{Rule: netstack.RuleFlowLimit, Reason: "1024 connections were open"}})
	}
	for range attempts {
		r.DNS(netstack.DNSEvent{Time: time.Now(), RCode: netstack.RCodeDropped,
			Verdict: netpolicy.Verdict{Rule: netstack.RuleLookupLimit, Reason: "64 queries were being answered"}})
	}
	for range attempts {
		r.Conn(netstack.ConnEvent{Start: time.Now(), Name: "allowed.example", Addr: dst, Kind: netstack.KindHTTP,
			Verdict: netpolicy.Verdict{Rule: netstack.RuleExfiltration, Reason: "the placeholder of KEY was sent over plain HTTP"}})
	}
	r.refusals.close()
	r.exfiltrations.close()
	l.Close()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	count := func(q string) int {
		t.Helper()
		var n int
		if err := db.QueryRow(q).Scan(&n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		return n
	}
	counted := func(q string) int {
		t.Helper()
		rows, err := db.Query(q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		total := 0
		for rows.Next() {
			var reason string
			var n int
			if err := rows.Scan(&reason); err != nil {
				t.Fatal(err)
			}
			if _, err := fmt.Sscanf(reason, "%d more", &n); err != nil {
				t.Fatalf("summary %q: %v", reason, err)
			}
			total += n
		}
		return total
	}
	kinds := []struct {
		name         string
		rows, counts string
	}{
		{"SYNs reset at the flow bound",
			`SELECT COUNT(*) FROM net_events WHERE policy_rule = 'flow-limit' AND decision = 'denied'`,
			`SELECT policy_reason FROM net_events WHERE policy_rule = 'rate-limited' AND domain = '(refused connections)'`},
		{"queries dropped at the lookup bound",
			`SELECT COUNT(*) FROM dns_events WHERE policy_rule = 'lookup-limit' AND decision = 'denied' AND rcode = '(dropped)'`,
			`SELECT policy_reason FROM dns_events WHERE policy_rule = 'rate-limited'`},
		{"attempts to move a credential",
			`SELECT COUNT(*) FROM net_events WHERE policy_rule = 'credential-exfiltration' AND decision = 'denied'`,
			`SELECT policy_reason FROM net_events WHERE policy_rule = 'rate-limited' AND domain = '(credential exfiltration attempts)'`},
	}
	rowsOf := map[string]int{}
	for _, k := range kinds {
		rows, summarised := count(k.rows), counted(k.counts)
		rowsOf[k.name] = rows
		if rows+summarised != attempts || summarised == 0 {
			t.Errorf("%s: %d rows + %d counted in summaries, want %d attempts with some summarised", k.name, rows, summarised, attempts)
		}
	}
	if got := rowsOf["attempts to move a credential"]; got < refusalBurst {
		t.Errorf("%d rows of their own for attempts to move a credential after a flood of other refusals; their budget is %d", got, refusalBurst)
	}
	if got := rowsOf["SYNs reset at the flow bound"] + rowsOf["queries dropped at the lookup bound"]; got > refusalBurst+refusalRate*10 {
		t.Errorf("%d rows of their own for other refusals: past the shared budget", got)
	}
}
