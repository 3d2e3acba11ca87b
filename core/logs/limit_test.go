package logs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the limiter's timer goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) records(t *testing.T) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuffer
		log := Limited(New(&buf, "info"), 3, time.Second).With("vm", "v1")
		for i := range 1000 {
			log.Warn("stream sent no header", "stream", i)
			log.Info("other", "i", i)
			log.Debug("below the level", "i", i) // neither passed nor counted
		}
		got := buf.records(t)
		if len(got) != 6 {
			t.Fatalf("%d records in the first interval, want 3 of each message: %v", len(got), got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got = buf.records(t)
		summaries := got[6:]
		if len(summaries) != 2 {
			t.Fatalf("%d summaries, want 2: %v", len(summaries), summaries)
		}
		for _, s := range summaries {
			if s["msg"] != MsgSuppressed || s["suppressed"] != float64(997) || s["vm"] != "v1" {
				t.Errorf("summary %v", s)
			}
		}
		if summaries[0]["level"] != "WARN" && summaries[1]["level"] != "WARN" {
			t.Errorf("no summary at the dropped records' level WARN: %v", summaries)
		}
		// A new interval passes the burst again, and a quiet one reports nothing.
		log.Warn("stream sent no header")
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := len(buf.records(t)); n != 9 {
			t.Fatalf("%d records after a quiet interval, want 9", n)
		}
	})
}

// TestLimitedBoundsDistinctMessages: messages with variable text cannot grow
// the table or get past the limit.
func TestLimitedBoundsDistinctMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuffer
		log := Limited(New(&buf, "info"), 1, time.Second)
		for i := range 10000 {
			log.Info(fmt.Sprintf("message %d", i))
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		got := buf.records(t)
		// One record of each tracked message and of the overflow, and the
		// overflow's summary.
		if len(got) > limitKinds+2 {
			t.Fatalf("%d records for 10000 distinct messages, want at most %d", len(got), limitKinds+2)
		}
		last := got[len(got)-1]
		if last["msg"] != MsgSuppressed || last["message"] != otherKind {
			t.Fatalf("last record %v, want the summary of the overflow", last)
		}
	})
}
