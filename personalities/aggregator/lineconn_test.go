package aggregator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/aggwire"
	"github.com/capsem/capsem/core/privsep"
)

// The test binary doubles as a scripted stdio MCP server (scriptedServer)
// when this variable is set; AGGREGATOR_TEST_LOG names a file where it
// records every line it receives.
const scriptEnv = "AGGREGATOR_TEST_SCRIPT"

func TestMain(m *testing.M) {
	// Servers run in their own sandbox, entered through this binary, as
	// capsem's main does.
	if err := privsep.Enter(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(126)
	}
	if os.Getenv(scriptEnv) != "" {
		scriptedServer()
		return
	}
	os.Exit(m.Run())
}

// exactResult is what the scripted server answers a tools/call with mode
// "exact": an integer no float64 holds and keys out of order, which any
// decode and re-encode would change.
const exactResult = `{"content":[{"type":"text","text":"x"}],"structuredContent":{"n":12345678901234567890,"z":1,"a":2}}`

// scriptedServer answers initialize, tools/list and tools/call; the call's
// "mode" argument picks the answer.
func scriptedServer() {
	var logf *os.File
	if p := os.Getenv("AGGREGATOR_TEST_LOG"); p != "" {
		logf, _ = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	}
	var wmu sync.Mutex
	send := func(s string) {
		wmu.Lock()
		defer wmu.Unlock()
		os.Stdout.WriteString(s + "\n")
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		line := in.Text()
		if logf != nil {
			logf.WriteString(line + "\n")
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				ProtocolVersion string `json:"protocolVersion"`
				Arguments       struct {
					Mode string `json:"mode"`
				} `json:"arguments"`
			} `json:"params"`
		}
		if json.Unmarshal([]byte(line), &msg) != nil || len(msg.ID) == 0 || msg.Method == "" {
			continue // notifications and answers to our requests
		}
		id := string(msg.ID)
		result := func(r string) string { return `{"jsonrpc":"2.0","id":` + id + `,"result":` + r + `}` }
		switch msg.Method {
		case "initialize":
			send(result(`{"protocolVersion":"` + msg.Params.ProtocolVersion + `","capabilities":{"tools":{}},"serverInfo":{"name":"scripted","version":"1"}}`))
		case "tools/list":
			send(result(`{"tools":[{"name":"t","inputSchema":{"type":"object"}}]}`))
		case "tools/call":
			mode := msg.Params.Arguments.Mode
			switch {
			case mode == "exact":
				send(result(exactResult))
			case mode == "error":
				send(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32050,"message":"boom","data":{"k":1}}}`)
			case mode == "array":
				send(result(`[1,2]`))
			case mode == "interleave":
				// A request of the server's own that wears our id prefix, and a
				// notification, before the answer: both are the SDK's.
				send(`{"jsonrpc":"2.0","id":"capsem-999","method":"ping"}`)
				send(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"hi"}}`)
				send(result(`{"content":[{"type":"text","text":"after"}]}`))
			case mode == "exit":
				os.Exit(3)
			case mode == "hang":
			case strings.HasPrefix(mode, "slow:"):
				ms, _ := strconv.Atoi(strings.TrimPrefix(mode, "slow:"))
				go func() {
					time.Sleep(time.Duration(ms) * time.Millisecond)
					send(result(`{"content":[{"type":"text","text":"` + mode + `"}]}`))
				}()
			default:
				send(result(`{"content":[{"type":"text","text":"ok"}]}`))
			}
		default:
			send(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32601,"message":"no such method"}}`)
		}
	}
}

func scriptedCommand(t *testing.T, log string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), scriptEnv+"=1", "AGGREGATOR_TEST_LOG="+log)
	return cmd
}

// connectScripted starts the scripted server with an SDK client session on
// a lineConn, as the aggregator does, and returns the session, the
// connection and the server's log of received lines.
func connectScripted(t *testing.T) (*mcp.ClientSession, *lineConn, string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), "received.log")
	tr := &commandTransport{cmd: scriptedCommand(t, log), terminate: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	session, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { session.Close() })
	return session, tr.conn, log
}

func callMode(ctx context.Context, c *lineConn, mode string) (json.RawMessage, error) {
	return c.callDirect(ctx, "tools/call", toolCallParams("t", json.RawMessage(`{"mode":"`+mode+`"}`)))
}

func TestDirectCallReturnsTheServersBytes(t *testing.T) {
	_, c, log := connectScripted(t)
	res, err := callMode(context.Background(), c, "exact")
	if err != nil {
		t.Fatal(err)
	}
	if string(res) != exactResult {
		t.Fatalf("result changed on the way:\n got %s\nwant %s", res, exactResult)
	}
	// The request went out as one line with our own id and the arguments as given.
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), `{"jsonrpc":"2.0","id":"capsem-1","method":"tools/call","params":{"name":"t","arguments":{"mode":"exact"}}}`) {
		t.Fatalf("server received:\n%s", b)
	}
}

func TestDirectCallKeepsTheServersError(t *testing.T) {
	_, c, _ := connectScripted(t)
	_, err := callMode(context.Background(), c, "error")
	var wire *jsonrpc.Error
	if !errors.As(err, &wire) || wire.Code != -32050 || wire.Message != "boom" {
		t.Fatalf("error: %#v", err)
	}
}

// Answers come back out of order, each to its own caller, while the SDK
// session uses the same connection.
func TestDirectCallsConcurrentOutOfOrder(t *testing.T) {
	session, c, _ := connectScripted(t)
	modes := []string{"slow:400", "slow:10", "slow:200", "slow:0", "slow:300", "slow:50"}
	var wg sync.WaitGroup
	errs := make(chan error, len(modes)+1)
	for _, m := range modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := callMode(context.Background(), c, m)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", m, err)
			} else if !bytes.Contains(res, []byte(`"text":"`+m+`"`)) {
				errs <- fmt.Errorf("%s got %s", m, res)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if tools, err := session.ListTools(context.Background(), nil); err != nil || len(tools.Tools) != 1 {
			errs <- fmt.Errorf("tools/list on the same connection: %v %v", tools, err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A server request that wears our id prefix, and a notification, arriving
// before the answer go to the SDK session (which answers the ping).
func TestDirectCallLeavesServerMessagesToTheSession(t *testing.T) {
	_, c, log := connectScripted(t)
	res, err := callMode(context.Background(), c, "interleave")
	if err != nil || !bytes.Contains(res, []byte("after")) {
		t.Fatalf("%s %v", res, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(log)
		if strings.Contains(string(b), `"id":"capsem-999","result":{}`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session did not answer the server's ping; server received:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A caller that gives up gets its context's error at once, the server is
// told, and the late answer is dropped without harm.
func TestDirectCallCancelTellsTheServer(t *testing.T) {
	_, c, log := connectScripted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := callMode(ctx, c, "slow:400")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("cancelled call returned after %v", took)
	}
	time.Sleep(600 * time.Millisecond) // the late answer arrives
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), `"method":"notifications/cancelled","params":{"reason":"context deadline exceeded","requestId":"capsem-1"}`) {
		t.Fatalf("no cancellation sent; server received:\n%s", b)
	}
	if res, err := callMode(context.Background(), c, "exact"); err != nil || string(res) != exactResult {
		t.Fatalf("after a late answer: %s %v", res, err)
	}
	c.mu.Lock()
	left := len(c.pending)
	c.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d waiters left behind", left)
	}
}

// A server that exits mid-call fails the call as a closed connection (it may
// have run: not retried), and later calls as never sent.
func TestDirectCallServerExit(t *testing.T) {
	_, c, _ := connectScripted(t)
	_, err := callMode(context.Background(), c, "exit")
	if !errors.Is(err, mcp.ErrConnectionClosed) || strings.Contains(err.Error(), "client is closing") {
		t.Fatalf("in-flight call: %v", err)
	}
	_, err = callMode(context.Background(), c, "exact")
	if !errors.Is(err, mcp.ErrConnectionClosed) || !strings.Contains(err.Error(), "client is closing") {
		t.Fatalf("call after the exit: %v", err)
	}
}

// Through the aggregator: results pass byte for byte; a result that is not
// an object is refused by name; the server's error code and message are
// kept.
func TestAggregatorDirectCalls(t *testing.T) {
	log := filepath.Join(t.TempDir(), "received.log")
	c := startAggregator(t, []aggwire.ServerDef{{Name: "s", Command: os.Args[0], Enabled: true,
		Env: map[string]string{scriptEnv: "1", "AGGREGATOR_TEST_LOG": log}}})
	r := c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "s__t", Arguments: []byte(`{"mode":"exact"}`)})
	if r.Error != "" || string(r.Result) != exactResult {
		t.Fatalf("exact: %+v", r)
	}
	r = c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "s__t", Arguments: []byte(`{"mode":"array"}`)})
	if r.Code != aggwire.CodeUpstream || !strings.Contains(r.Error, "not a JSON object") {
		t.Fatalf("array: %+v", r)
	}
	r = c.do(&aggwire.Request{Method: aggwire.MethodCallTool, Name: "s__t", Arguments: []byte(`{"mode":"error"}`)})
	if r.Code != aggwire.CodeUpstream || !strings.Contains(r.Error, "server error -32050: boom") {
		t.Fatalf("error: %+v", r)
	}
}

// Every line a server may send is classified without panicking; one taken
// as a direct answer carries our prefix and is a response.
func FuzzServerLine(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":"capsem-1","result":{}}`,
		`{"jsonrpc":"2.0","id":"capsem-2","error":{"code":-1,"message":"x"}}`,
		`{"jsonrpc":"2.0","id":"capsem-3","method":"ping"}`,
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","method":"x"}]`,
		`[]`, `{"id":"capsem-\u0031"}`, `{`, `"capsem-1"`, ` `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if len(bytes.TrimSpace(line)) == 0 {
			return // the reader skips blank lines
		}
		if id, ok := directAnswerID(line); ok {
			if !strings.HasPrefix(id, directIDPrefix) {
				t.Fatalf("direct answer id %q", id)
			}
			if m, err := jsonrpc.DecodeMessage(line); err == nil {
				if _, isReq := m.(*jsonrpc.Request); isReq {
					t.Fatalf("a request taken as an answer: %s", line)
				}
			}
		}
		_, _ = decodeServerLine(line)
	})
}
