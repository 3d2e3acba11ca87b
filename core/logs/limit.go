package logs

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Rate limits for messages a peer can cause at will (a hostile guest
// opening streams, say): LimitBurst of each message per LimitInterval
// reach the log, the rest are counted and reported in one line when the
// interval ends.
const (
	LimitBurst    = 10
	LimitInterval = 10 * time.Second
	// limitKinds bounds the distinct messages tracked; the rest share one
	// count, so a caller that puts variable text in the message cannot
	// grow the table.
	limitKinds = 256
	otherKind  = "(other messages)"
)

// MsgSuppressed is the message of the line that reports how many records
// of one message a Limited logger dropped.
const MsgSuppressed = "log messages suppressed"

// Limited returns a logger that passes on at most burst records with the
// same message per interval to log's handler; the rest are dropped and
// counted, and when the interval ends one MsgSuppressed record says how
// many (with the message and the level of the dropped ones). Loggers
// derived from it (With, WithGroup) share its counts. The level check is
// log's own: records below it are neither passed on nor counted.
func Limited(log *slog.Logger, burst int, interval time.Duration) *slog.Logger {
	if burst < 1 {
		burst = 1
	}
	return slog.New(&limitHandler{h: log.Handler(), st: &limitState{burst: burst, every: interval, kinds: map[string]*limitKind{}}})
}

type limitState struct {
	burst int
	every time.Duration

	mu    sync.Mutex
	kinds map[string]*limitKind
}

type limitKind struct {
	start   time.Time // the current interval began
	passed  int       // records passed on in it
	dropped int       // records dropped since the last report
	level   slog.Level
	h       slog.Handler // reports the drops, with the attributes of the first dropped record's logger
	timer   *time.Timer
}

type limitHandler struct {
	h  slog.Handler
	st *limitState
}

func (l *limitHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return l.h.Enabled(ctx, level)
}

func (l *limitHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &limitHandler{h: l.h.WithAttrs(attrs), st: l.st}
}

func (l *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{h: l.h.WithGroup(name), st: l.st}
}

func (l *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	if l.st.admit(r.Message, r.Level, l.h) {
		return l.h.Handle(ctx, r)
	}
	return nil
}

// admit says whether a record with message msg passes, counting it if not.
func (st *limitState) admit(msg string, level slog.Level, h slog.Handler) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	k := st.kinds[msg]
	if k == nil {
		if len(st.kinds) >= limitKinds {
			msg = otherKind
			k = st.kinds[msg]
		}
		if k == nil {
			k = &limitKind{}
			st.kinds[msg] = k
		}
	}
	now := time.Now()
	if now.Sub(k.start) >= st.every {
		k.start, k.passed = now, 0
	}
	if k.passed < st.burst {
		k.passed++
		return true
	}
	if k.dropped == 0 {
		k.level, k.h = level, h
	}
	k.dropped++
	if k.timer == nil {
		k.timer = time.AfterFunc(k.start.Add(st.every).Sub(now), func() { st.report(msg) })
	}
	return false
}

// report logs how many records of msg were dropped since the last report.
func (st *limitState) report(msg string) {
	st.mu.Lock()
	k := st.kinds[msg]
	n, level, h := k.dropped, k.level, k.h
	k.dropped, k.timer, k.h = 0, nil, nil
	st.mu.Unlock()
	if n == 0 {
		return
	}
	r := slog.NewRecord(time.Now(), level, MsgSuppressed, 0)
	r.AddAttrs(slog.String("message", msg), slog.Int("suppressed", n), slog.Duration("interval", st.every))
	h.Handle(context.Background(), r)
}
