// Package ledger writes and reads session.db, the per-session SQLite audit
// ledger: one row per MCP message in mcp_calls, plus
// net_events, dns_events, exec_events, fs_events and model_calls.
//
// A Ledger owns the file's only writer: one goroutine that drains every
// queued row into one transaction (group commit). Write blocks until the
// transaction holding its rows has committed, which is what lets the gateway
// send a response only after its row is durable without paying one commit
// per message. Readers use Query and Schema, which open the file read-only.
package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	// Registers the "sqlite3" database/sql driver.
	_ "github.com/mattn/go-sqlite3"
)

// ErrClosed is returned by Write and Enqueue after Close has begun.
var ErrClosed = errors.New("ledger: closed; row not written")

// Defaults for Options.
const (
	DefaultQueueRows   = 8192
	DefaultBusyTimeout = 5 * time.Second
)

// Options tunes a Ledger. The zero value is ready to use.
type Options struct {
	// QueueRows bounds the rows waiting for the writer; a Write or Enqueue
	// that would exceed it waits for the writer to take the queue
	// (backpressure instead of unbounded memory). 0 means DefaultQueueRows.
	QueueRows int
	// BusyTimeout is how long SQLite retries a locked database before
	// failing. 0 means DefaultBusyTimeout.
	BusyTimeout time.Duration
	// Logger receives failures nobody waits for (Enqueue rows). nil means
	// slog.Default().
	Logger *slog.Logger
}

// Stats counts the writer's work since Open.
type Stats struct {
	Rows        uint64 // rows committed
	Commits     uint64 // transactions committed
	FailedRows  uint64 // rows whose transaction failed
	Checkpoints uint64 // background WAL checkpoints run
}

// Checkpoints copy the WAL back into the database file and sync both. SQLite
// runs one inside whichever commit takes the WAL past 1000 pages, so every
// ~100th answer waited for two fsyncs. The ledger instead checkpoints from a
// second connection in the background, at most every checkpointInterval
// after a commit; a commit checkpoints itself only if the WAL reaches
// fallbackCheckpointPages (the background one stalled), so the WAL stays
// bounded either way.
const (
	checkpointInterval      = 200 * time.Millisecond
	fallbackCheckpointPages = 8192 // 32 MiB of 4 KiB pages
)

// Ledger is an open session.db with its writer goroutine. It is safe for
// concurrent use.
type Ledger struct {
	path  string
	db    *sql.DB
	stmts [numTables]*sql.Stmt
	log   *slog.Logger

	mu         sync.Mutex
	pending    []*request    // waiting for the writer, in arrival order
	queuedRows int           // rows in pending
	maxQueued  int           // Options.QueueRows
	space      chan struct{} // closed (and replaced) whenever pending is drained
	closed     bool

	wake       chan struct{} // capacity 1: "pending may be non-empty, or closed"
	writerDone chan struct{} // closed when the writer goroutine has returned

	checkpointDB   *sql.DB       // the background checkpointer's connection
	checkpointKick chan struct{} // capacity 1: "something was committed"
	checkpointStop chan struct{} // closed by Close
	checkpointDone chan struct{} // closed when the checkpointer has returned

	closeOnce sync.Once
	closeErr  error

	rows, commits, failedRows, checkpoints atomic.Uint64

	// testHookBeforeCommit, when set before the first write, runs inside
	// every transaction just before COMMIT; an error fails the transaction.
	testHookBeforeCommit func(rows int) error
}

// request is one Write or Enqueue call: its rows commit together.
type request struct {
	t    []tableID
	args [][]any
	done chan error // nil for Enqueue; else capacity 1
}

// Open opens or creates the ledger at path, creates the schema if needed and
// starts the writer.
func Open(ctx context.Context, path string, opts Options) (*Ledger, error) {
	if path == "" {
		return nil, errors.New("ledger: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("ledger: resolve %s: %w", path, err)
	}
	if opts.QueueRows <= 0 {
		opts.QueueRows = DefaultQueueRows
	}
	if opts.BusyTimeout <= 0 {
		opts.BusyTimeout = DefaultBusyTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}

	// Create the file ourselves so it is 0600 from its first byte: SQLite
	// would create it 0644, and the ledger holds tool arguments and results.
	// SQLite gives the -wal and -shm files the main file's mode. An existing
	// file is tightened too, since we are its only writer.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: create %s: %w", abs, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("ledger: create %s: %w", abs, err)
	}
	if err := os.Chmod(abs, 0o600); err != nil {
		return nil, fmt.Errorf("ledger: restrict mode of %s: %w", abs, err)
	}

	// Connection settings go in the DSN so they apply to any connection
	// database/sql (re)opens, not just the first:
	//   - WAL lets readers (Query, capsem_inspect) run while we write.
	//   - synchronous=NORMAL: in WAL mode a commit then appends to the WAL
	//     without fsync; the WAL is synced at checkpoints. A committed row
	//     survives a crash of any process; only an OS crash or power loss
	//     can lose the last commits, and never corrupts the file. FULL would
	//     put an fsync on every commit, i.e. in the latency of every MCP
	//     response, for a sandbox whose own disk state is no more durable.
	//   - busy_timeout rides out a reader briefly holding a lock (checkpoint).
	//   - foreign_keys for integrity should later tables reference others.
	//   - BEGIN IMMEDIATE takes the write lock up front, so a transaction
	//     cannot fail half way with SQLITE_BUSY on lock upgrade.
	params := fmt.Sprintf("_journal_mode=WAL&_synchronous=NORMAL&_busy_timeout=%d&_foreign_keys=1&_txlock=immediate",
		opts.BusyTimeout.Milliseconds())
	db, err := sql.Open("sqlite3", fileURI(abs, params))
	if err != nil {
		return nil, fmt.Errorf("ledger: open %s: %w", abs, err)
	}
	// One connection: there is one writer, and SQLite serialises writers
	// anyway. Keeping it open keeps the prepared inserts warm.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)

	l := &Ledger{
		path:       abs,
		db:         db,
		log:        opts.Logger,
		maxQueued:  opts.QueueRows,
		space:      make(chan struct{}),
		wake:       make(chan struct{}, 1),
		writerDone: make(chan struct{}),
	}
	if err := l.setup(ctx); err != nil {
		l.closeStmts()
		_ = db.Close()
		return nil, err
	}
	// The checkpointer's own connection: a checkpoint on it never holds up
	// the writer's commits (PASSIVE takes no lock a writer needs).
	ckpt, err := sql.Open("sqlite3", fileURI(abs, fmt.Sprintf("_busy_timeout=%d", opts.BusyTimeout.Milliseconds())))
	if err != nil {
		l.closeStmts()
		_ = db.Close()
		return nil, fmt.Errorf("ledger: open %s for checkpoints: %w", abs, err)
	}
	ckpt.SetMaxOpenConns(1)
	l.checkpointDB = ckpt
	l.checkpointKick = make(chan struct{}, 1)
	l.checkpointStop = make(chan struct{})
	l.checkpointDone = make(chan struct{})
	go l.run()
	go l.checkpointLoop()
	return l, nil
}

// checkpointLoop runs a PASSIVE checkpoint after commits, at most once per
// checkpointInterval, until Close.
func (l *Ledger) checkpointLoop() {
	defer close(l.checkpointDone)
	for {
		select {
		case <-l.checkpointStop:
			return
		case <-l.checkpointKick:
		}
		var busy, logFrames, checkpointed int
		err := l.checkpointDB.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &logFrames, &checkpointed)
		if err != nil {
			l.log.Warn("ledger: background checkpoint failed; commits will checkpoint themselves past the fallback size",
				"path", l.path, "err", err)
		} else {
			l.checkpoints.Add(1)
		}
		select {
		case <-l.checkpointStop:
			return
		case <-time.After(checkpointInterval):
		}
	}
}

func (l *Ledger) setup(ctx context.Context) error {
	var mode string
	if err := l.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("ledger: open %s: %w", l.path, err)
	}
	// Fail loudly rather than silently run without WAL (e.g. on a file
	// system without shared memory), which would block readers.
	if !strings.EqualFold(mode, "wal") {
		return fmt.Errorf("ledger: %s: cannot use WAL journal mode (got %q)", l.path, mode)
	}
	// A connection setting: it holds because the writer keeps its one
	// connection for the ledger's life. Were database/sql ever to reopen it,
	// SQLite's default (1000 pages) would apply again: slower, still correct.
	if _, err := l.db.ExecContext(ctx, fmt.Sprintf("PRAGMA wal_autocheckpoint=%d", fallbackCheckpointPages)); err != nil {
		return fmt.Errorf("ledger: %s: set the checkpoint fallback: %w", l.path, err)
	}
	if err := migrate(ctx, l.db, l.path); err != nil {
		return err
	}
	for t := range numTables {
		st, err := l.db.PrepareContext(ctx, insertSQL[t])
		if err != nil {
			return fmt.Errorf("ledger: prepare insert into %s: %w", tables[t].name, err)
		}
		l.stmts[t] = st
	}
	return nil
}

func (l *Ledger) closeStmts() {
	for _, st := range l.stmts {
		if st != nil {
			_ = st.Close()
		}
	}
}

// fileURI builds a SQLite URI filename. '%', '?' and '#' in the path are
// escaped because SQLite's URI parser (and go-sqlite3's, for '?') would
// otherwise read them as escapes, the query or a fragment.
func fileURI(absPath, params string) string {
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(absPath)
	return "file:" + esc + "?" + params
}

// Path returns the absolute path of the ledger file.
func (l *Ledger) Path() string { return l.path }

// Stats returns the writer's counters.
func (l *Ledger) Stats() Stats {
	return Stats{Rows: l.rows.Load(), Commits: l.commits.Load(), FailedRows: l.failedRows.Load(), Checkpoints: l.checkpoints.Load()}
}

// Write queues rows and blocks until the transaction holding them has
// committed, returning nil, or failed, returning its error. The rows of one
// call commit together, usually alongside other callers' rows.
//
// Write records the rows even when ctx is or becomes done: it then returns
// ctx.Err() (wrapped) without waiting, and the rows still commit. Only
// validation errors and ErrClosed mean the rows were not queued.
func (l *Ledger) Write(ctx context.Context, rows ...Row) error {
	req, err := newRequest(rows, true)
	if err != nil || req == nil {
		return err
	}
	if err := l.admit(ctx, req); err != nil {
		return err
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		// Check once more: if the commit already finished, report it rather
		// than a cancellation the caller might treat as "maybe not written".
		select {
		case err := <-req.done:
			return err
		default:
		}
		return fmt.Errorf("ledger: stopped waiting for commit (rows stay queued): %w", ctx.Err())
	}
}

// Enqueue queues rows without waiting for their commit (for rows nothing
// waits on). It waits only while the queue is full. A later failure to commit
// is logged and counted in Stats.FailedRows.
func (l *Ledger) Enqueue(rows ...Row) error {
	req, err := newRequest(rows, false)
	if err != nil || req == nil {
		return err
	}
	return l.admit(context.Background(), req)
}

func newRequest(rows []Row, wait bool) (*request, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	now := time.Now()
	req := &request{t: make([]tableID, len(rows)), args: make([][]any, len(rows))}
	for i, r := range rows {
		if r == nil || isNilRow(r) {
			return nil, fmt.Errorf("ledger: row %d is nil", i)
		}
		// Validate and convert on the caller's goroutine: a bad row fails
		// only its own call, and the writer never touches caller memory.
		if err := r.fill(now); err != nil {
			return nil, err
		}
		fs := r.fields()
		args := make([]any, len(fs))
		for j, f := range fs {
			args[j] = f.value
		}
		req.t[i] = r.table()
		req.args[i] = args
	}
	if wait {
		req.done = make(chan error, 1)
	}
	return req, nil
}

func isNilRow(r Row) bool {
	switch v := r.(type) {
	case *MCPCall:
		return v == nil
	case *NetEvent:
		return v == nil
	case *ExecEvent:
		return v == nil
	case *FSEvent:
		return v == nil
	case *ModelCall:
		return v == nil
	}
	return false
}

// admit appends req to the queue, waiting while the queue is full. If ctx
// ends during that wait the request is queued anyway, over the bound: a row
// is never dropped because its caller stopped waiting, and the overshoot is
// at most one request per such caller.
func (l *Ledger) admit(ctx context.Context, req *request) error {
	n := len(req.t)
	l.mu.Lock()
	for !l.closed && l.queuedRows > 0 && l.queuedRows+n > l.maxQueued {
		space := l.space
		l.mu.Unlock()
		gaveUp := false
		select {
		case <-space:
		case <-ctx.Done():
			gaveUp = true
		}
		l.mu.Lock()
		if gaveUp {
			break
		}
	}
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	l.pending = append(l.pending, req)
	l.queuedRows += n
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default: // a wake-up is already pending
	}
	return nil
}

// releaseSpaceLocked wakes every caller waiting for queue room.
func (l *Ledger) releaseSpaceLocked() {
	close(l.space)
	l.space = make(chan struct{})
}

// run is the writer goroutine: it takes everything queued, commits it as one
// transaction, and repeats until Close and the queue is empty.
func (l *Ledger) run() {
	defer close(l.writerDone)
	var batch []*request
	for {
		l.mu.Lock()
		for len(l.pending) == 0 && !l.closed {
			l.mu.Unlock()
			<-l.wake
			l.mu.Lock()
		}
		if len(l.pending) == 0 { // closed and drained
			l.mu.Unlock()
			return
		}
		if len(l.pending) == 1 && !l.closed {
			// Let the goroutines that are ready to run go first. The caller
			// that woke us readied this goroutine to run next, ahead of the
			// other callers already runnable (say, answers that came back
			// in one read), so without this each would commit alone. When
			// nothing else is runnable this returns at once.
			l.mu.Unlock()
			runtime.Gosched()
			l.mu.Lock()
		}
		// Swap buffers so producers append to a fresh slice while we commit.
		batch, l.pending = l.pending, batch[:0]
		l.queuedRows = 0
		l.releaseSpaceLocked()
		l.mu.Unlock()

		l.commit(batch)
		clear(batch) // drop references to finished requests
	}
}

// commit writes a batch. If the shared transaction fails and the batch holds
// more than one request, each request is retried in its own transaction, so
// a fault tied to one request cannot cost other callers their rows; a fault
// of the file itself fails every retry and so reaches every waiter.
func (l *Ledger) commit(batch []*request) {
	err := l.execTx(batch)
	if err == nil || len(batch) == 1 {
		for _, r := range batch {
			l.finish(r, err)
		}
		return
	}
	l.log.Warn("ledger: group commit failed; retrying each write alone",
		"path", l.path, "requests", len(batch), "err", err)
	for _, r := range batch {
		l.finish(r, l.execTx([]*request{r}))
	}
}

func (l *Ledger) execTx(reqs []*request) (err error) {
	// The writer never uses a caller's context: a caller giving up must not
	// abort a transaction that carries other callers' rows.
	ctx := context.Background()
	if len(reqs) == 1 && len(reqs[0].t) == 1 {
		return l.execOne(ctx, reqs[0])
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: begin transaction on %s: %w", l.path, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var txStmts [numTables]*sql.Stmt
	rows := 0
	for _, r := range reqs {
		for i, t := range r.t {
			st := txStmts[t]
			if st == nil {
				st = tx.StmtContext(ctx, l.stmts[t])
				txStmts[t] = st
			}
			if _, err := st.ExecContext(ctx, r.args[i]...); err != nil {
				return fmt.Errorf("ledger: insert into %s in %s: %w", tables[t].name, l.path, err)
			}
			rows++
		}
	}
	if hook := l.testHookBeforeCommit; hook != nil {
		if err := hook(rows); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: commit to %s: %w", l.path, err)
	}
	l.committed(rows)
	return nil
}

// execOne writes a lone row as one statement in SQLite's own implicit
// transaction: as atomic and durable as BEGIN/INSERT/COMMIT, in one call
// into SQLite instead of three (a quiet gateway's every call).
func (l *Ledger) execOne(ctx context.Context, r *request) error {
	t := r.t[0]
	if hook := l.testHookBeforeCommit; hook != nil {
		if err := hook(1); err != nil {
			return err
		}
	}
	if _, err := l.stmts[t].ExecContext(ctx, r.args[0]...); err != nil {
		return fmt.Errorf("ledger: insert into %s in %s: %w", tables[t].name, l.path, err)
	}
	l.committed(1)
	return nil
}

// committed counts a committed transaction of rows and nudges the
// checkpointer.
func (l *Ledger) committed(rows int) {
	l.rows.Add(uint64(rows))
	l.commits.Add(1)
	select {
	case l.checkpointKick <- struct{}{}:
	default:
	}
}

func (l *Ledger) finish(r *request, err error) {
	if err != nil {
		l.failedRows.Add(uint64(len(r.t)))
	}
	if r.done != nil {
		r.done <- err // capacity 1, never blocks
		return
	}
	if err != nil {
		l.log.Error("ledger: queued rows lost", "path", l.path, "rows", len(r.t), "err", err)
	}
}

// Close stops accepting rows, waits until everything already queued has been
// committed (or has failed and been reported), stops the writer and closes
// the file. It is idempotent and safe to call concurrently; every call
// returns the first call's result.
func (l *Ledger) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		// Callers waiting for room see closed and get ErrClosed.
		l.releaseSpaceLocked()
		l.mu.Unlock()
		select {
		case l.wake <- struct{}{}:
		default:
		}
		<-l.writerDone
		close(l.checkpointStop)
		<-l.checkpointDone
		if err := l.checkpointDB.Close(); err != nil {
			l.closeErr = fmt.Errorf("ledger: close %s: %w", l.path, err)
		}
		l.closeStmts()
		// The writer's connection closes last, so SQLite checkpoints the
		// rest and removes the WAL.
		if err := l.db.Close(); err != nil {
			l.closeErr = fmt.Errorf("ledger: close %s: %w", l.path, err)
		}
	})
	return l.closeErr
}
