package aggregator

import (
	"testing"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/testkit"
)

// BenchmarkCallTool: one tools/call through the aggregator (aggwire frames
// in, the SDK client out to a stdio echo server and back), one at a time;
// the aggregator's share of the gateway path.
func BenchmarkCallTool(b *testing.B) {
	c := startAggregator(b, []aggwire.ServerDef{{Name: "echo", Command: testkit.EchoServer(b), Enabled: true}})
	req := aggwire.Request{Method: aggwire.MethodCallTool, Name: "echo__echo", Arguments: []byte(`{"text":"hi"}`)}
	b.ReportAllocs()
	for b.Loop() {
		r := req
		if resp := c.do(&r); resp.Error != "" {
			b.Fatal(resp.Error)
		}
	}
}
