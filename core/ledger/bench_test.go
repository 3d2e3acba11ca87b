package ledger

import (
	"context"
	"testing"
)

func benchRow() *MCPCall {
	return &MCPCall{
		ServerName: "github", Method: "tools/call", ToolName: "github__search_code", RequestID: "17",
		RequestPreview:  `{"name":"github__search_code","arguments":{"q":"func main"}}`,
		ResponsePreview: `{"content":[{"type":"text","text":"3 results"}]}`,
		Decision:        DecisionAllowed, DurationMS: 42, ProcessName: "claude", BytesSent: 61, BytesReceived: 49,
		PolicyMode: "security_event", PolicyAction: "allow", StreamID: new(int64(3)), Transport: "frame",
		TraceID: "trace-0123456789",
	}
}

func reportRows(b *testing.B, l *Ledger) {
	b.Helper()
	st := l.Stats()
	b.ReportMetric(float64(st.Rows)/b.Elapsed().Seconds(), "rows/s")
	if st.Commits > 0 {
		b.ReportMetric(float64(st.Rows)/float64(st.Commits), "rows/commit")
	}
}

// BenchmarkWriteMCPCallParallel is the gateway's case: many callers each
// blocking until their own row commits, sharing commits.
func BenchmarkWriteMCPCallParallel(b *testing.B) {
	l := openLedger(b, tempDB(b), Options{})
	ctx := context.Background()
	b.SetParallelism(32) // 32 callers per CPU: concurrent MCP streams
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Write(ctx, benchRow()); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	reportRows(b, l)
}

// BenchmarkWriteMCPCallSingle is one caller: every Write is its own commit,
// the worst case for per-row latency.
func BenchmarkWriteMCPCallSingle(b *testing.B) {
	l := openLedger(b, tempDB(b), Options{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Write(ctx, benchRow()); err != nil {
			b.Fatal(err)
		}
	}
	reportRows(b, l)
}

// BenchmarkEnqueueMCPCall is fire-and-forget throughput, flushed by Close.
func BenchmarkEnqueueMCPCall(b *testing.B) {
	l, err := Open(context.Background(), tempDB(b), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Enqueue(benchRow()); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	reportRows(b, l)
}

// BenchmarkMCPCallRecordedTwice is a tool call's cost in the ledger: one
// row written once (the baseline: the answer's row only) beside a pending
// row before the call and the answer completing it, for one caller and
// for many.
func BenchmarkMCPCallRecordedTwice(b *testing.B) {
	ctx := context.Background()
	once := func(l *Ledger) error { return l.Write(ctx, benchRow()) }
	twice := func(l *Ledger) error {
		r := benchRow()
		r.Pending = true
		if err := l.Write(ctx, r); err != nil {
			return err
		}
		done := *r
		done.Pending = false
		return l.Write(ctx, &done)
	}
	for _, c := range []struct {
		name  string
		write func(*Ledger) error
	}{{"answer-row-only", once}, {"pending-then-answer", twice}} {
		b.Run(c.name+"/c=1", func(b *testing.B) {
			l := openLedger(b, tempDB(b), Options{})
			b.ReportAllocs()
			for b.Loop() {
				if err := c.write(l); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/c=64", func(b *testing.B) {
			l := openLedger(b, tempDB(b), Options{})
			b.SetParallelism(32)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.write(l); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
