// Command mcpecho is a small stdio MCP server used by tests and benchmarks:
// an `echo` tool, a `sleep` tool (cancellable), a `big` tool returning N
// bytes, and a `probe` tool that reports the sandbox it runs in (its
// /proc/self/status capability lines, its environment, and whether it can
// open a given path). With MCPECHO_LOG set it logs every message to that file.
package main

import (
	"context"
	"encoding/json"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/procs"
)

type echoArgs struct {
	Text    string `json:"text" jsonschema:"text to echo back"`
	Reverse bool   `json:"reverse,omitempty" jsonschema:"return the text reversed (so a result can hold what its request did not)"`
}

type sleepArgs struct {
	MS int `json:"ms" jsonschema:"milliseconds to sleep"`
}

type bigArgs struct {
	Bytes int `json:"bytes" jsonschema:"size of the text result"`
}

type probeArgs struct {
	Path string `json:"path" jsonschema:"a path to try to open for reading"`
}

type probeResult struct {
	Status  map[string]string `json:"status"`
	Env     []string          `json:"env"`
	OpenErr string            `json:"open_err"`
	Opened  bool              `json:"opened"`
	PGID    int               `json:"pgid"`
	PID     int               `json:"pid"`
}

// text is the text to answer with: reversed when asked.
func (a echoArgs) text() string {
	if !a.Reverse {
		return a.Text
	}
	r := []rune(a.Text)
	slices.Reverse(r)
	return string(r)
}

func main() {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcpecho", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo the text back."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.text()}}}, nil, nil
		})
	// fail answers with a JSON-RPC error whose message is the text (a server
	// can put anything in an error).
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "Answer with a JSON-RPC error carrying the text."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
			return nil, nil, &jsonrpc.Error{Code: -32001, Message: a.text()}
		})
	s.AddTool(&mcp.Tool{Name: "raw", Description: "Return the call's arguments exactly as they arrived.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}}}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "sleep", Description: "Sleep, honouring cancellation."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a sleepArgs) (*mcp.CallToolResult, any, error) {
			select {
			case <-time.After(time.Duration(a.MS) * time.Millisecond):
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slept"}}}, nil, nil
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		})
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "Return a text result of the given size."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a bigArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", a.Bytes)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "probe", Description: "Report this process's sandbox."},
		func(ctx context.Context, _ *mcp.CallToolRequest, a probeArgs) (*mcp.CallToolResult, probeResult, error) {
			res := probeResult{Status: map[string]string{}, Env: os.Environ(), PID: os.Getpid()}
			if b, err := os.ReadFile("/proc/self/status"); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					k, v, ok := strings.Cut(line, ":")
					if ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs" || k == "Seccomp") {
						res.Status[k] = strings.TrimSpace(v)
					}
				}
			}
			if b, err := os.ReadFile("/proc/self/stat"); err == nil {
				f := strings.Fields(string(b))
				if len(f) > 4 {
					var n int
					for _, c := range f[4] {
						n = n*10 + int(c-'0')
					}
					res.PGID = n
				}
			}
			if a.Path != "" {
				f, err := os.Open(a.Path)
				if err != nil {
					res.OpenErr = err.Error()
				} else {
					res.Opened = true
					f.Close()
				}
			}
			return nil, res, nil
		})
	// Stdio in non-blocking mode, read through Go's poller. On the SDK's
	// StdioTransport (a blocking stdin) this server now and then left an
	// answer unsent: its answering goroutine stayed runnable while the
	// reading thread sat in read(2) and no other thread ran it, so the
	// caller waited forever (3 stalls in about 30 runs of 20000 calls of
	// the aggregator benchmark, none in 50 runs after this change).
	in, out, restore := procs.PollableStdio()
	defer restore()
	var transport mcp.Transport = &mcp.IOTransport{Reader: in, Writer: out}
	if path := os.Getenv("MCPECHO_LOG"); path != "" {
		// The server's own record of every message it received and sent:
		// tests read it to prove a blocked request never arrived.
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		transport = &mcp.LoggingTransport{Transport: transport, Writer: f}
	}
	if err := s.Run(context.Background(), transport); err != nil {
		log.Fatal(err)
	}
}
