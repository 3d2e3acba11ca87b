package ledger

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"
)

// Commits no longer checkpoint the WAL themselves (that put two fsyncs in
// the latency of every ~100th MCP answer): a background connection does,
// and the database file takes the rows while the ledger is still open.
func TestBackgroundCheckpointMovesRowsIntoTheDatabaseFile(t *testing.T) {
	path := tempDB(t)
	l := openLedger(t, path, Options{})
	ctx := context.Background()

	var fallback int
	if err := l.db.QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&fallback); err != nil {
		t.Fatal(err)
	}
	if fallback != fallbackCheckpointPages {
		t.Fatalf("writer connection checkpoints itself every %d pages, want only past %d", fallback, fallbackCheckpointPages)
	}

	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// 600 one-row commits write a few thousand WAL pages: past SQLite's
	// default of 1000, short of the fallback.
	for range 600 {
		if err := l.Write(ctx, benchRow()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if l.Stats().Checkpoints > 0 && st.Size() > before.Size()+100<<10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("database file %d → %d bytes after %d background checkpoints: rows not checkpointed",
				before.Size(), st.Size(), l.Stats().Checkpoints)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Every row is there, read through a separate read-only connection.
	ro, err := sql.Open("sqlite3", fileURI(path, "mode=ro"))
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	var n int
	if err := ro.QueryRow("SELECT COUNT(*) FROM mcp_calls").Scan(&n); err != nil || n != 600 {
		t.Fatalf("%d rows (%v), want 600", n, err)
	}
}

// An idle ledger does not checkpoint: the checkpointer runs only after
// commits, so a session with no traffic costs nothing.
func TestIdleLedgerDoesNotCheckpoint(t *testing.T) {
	l := openLedger(t, tempDB(t), Options{})
	time.Sleep(3 * checkpointInterval)
	if n := l.Stats().Checkpoints; n != 0 {
		t.Fatalf("%d checkpoints with no commits", n)
	}
	if err := l.Write(context.Background(), benchRow()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Checkpoints == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no checkpoint after a commit")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
