package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// RealisticEngine is the benchmark policy of the policy issue: 20 servers,
// 200 per-tool entries and 50 content rules of every kind, several of which
// look into the arguments of the benchmarked tool.
func RealisticEngine() *Engine {
	e := &Engine{
		Default:        Entry{Decision: Allow, Rank: RankCorp, Source: "corp.toml"},
		BlockedServers: map[string]string{},
		AllowedServers: map[string]string{},
		Tools:          map[string]Entry{},
	}
	for s := 0; s < 20; s++ {
		server := fmt.Sprintf("server%02d", s)
		e.AllowedServers[server] = "corp.toml"
		for t := 0; t < 10; t++ {
			d := Allow
			if t%3 == 0 {
				d = Warn
			}
			e.Tools[fmt.Sprintf("%s__tool%02d", server, t)] = Entry{Decision: d, Rank: RankUser, Source: "user.toml"}
		}
	}
	e.BlockedServers["evil"] = "corp.toml"
	for i := 0; i < 50; i++ {
		r := Rule{Name: fmt.Sprintf("rule%02d", i), Action: Block, Rank: RankUser}
		switch i % 5 {
		case 0:
			r.Tool = fmt.Sprintf("server%02d__tool*", i%20)
			r.Argument = fmt.Sprintf("payload.field%d", i)
			r.Matches = regexp.MustCompile(`^sk-[A-Za-z0-9]{20,}$`)
		case 1:
			r.Argument = "auth.token"
			r.Equals = json.RawMessage(fmt.Sprintf(`"secret-%d"`, i))
		case 2:
			r.ResourceURI = fmt.Sprintf("capsem://server%02d/private/*", i%20)
		case 3:
			r.Tool = fmt.Sprintf("*__tool%02d", i%10)
			r.Returns = "structuredContent.secret"
		case 4:
			r.Action = Allow
			r.Tool = fmt.Sprintf("server%02d__tool%02d", i%20, i%10)
		}
		e.Rules = append(e.Rules, r)
	}
	return e
}

// argumentsOfSize returns a JSON object of about n bytes, shaped like real
// tool input (nested, several keys, one long text).
func argumentsOfSize(n int) json.RawMessage {
	head := `{"payload":{"field0":"value","field5":"sk-short","list":[1,2,3]},"auth":{"user":"me"},"text":"`
	tail := `"}`
	return json.RawMessage(head + strings.Repeat("x", max(0, n-len(head)-len(tail))) + tail)
}

func BenchmarkRealisticPolicy(b *testing.B) {
	e := RealisticEngine()
	ctx := context.Background()
	for _, size := range []int{1 << 10, 1 << 20} {
		c := &Call{Method: "tools/call", Server: "server00", Name: "server00__tool01", Arguments: argumentsOfSize(size)}
		if v := e.CheckRequest(ctx, c); v.Decision != Allow {
			b.Fatalf("benchmark call decided %+v", v)
		}
		b.Run(fmt.Sprintf("request/%dKiB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				e.CheckRequest(ctx, c)
			}
		})
	}
	result := json.RawMessage(`{"content":[{"type":"text","text":"ok"}],"structuredContent":{"status":"ok"}}`)
	c := &Call{Method: "tools/call", Server: "server00", Name: "server00__tool03"}
	b.Run("response", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e.CheckResponse(ctx, c, result)
		}
	})
}
