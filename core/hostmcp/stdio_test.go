package hostmcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	sdkjsonrpc "github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// rawAnswer is one line capsem mcp writes.
type rawAnswer struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// stdioSession serves New(svc) over a StdioTransport on pipes, as capsem
// mcp does on its stdin and stdout, and reads what it answers.
type stdioSession struct {
	t       *testing.T
	in      *io.PipeWriter
	answers chan rawAnswer
	served  chan error
}

func serveStdio(t *testing.T, svc Service, maxLine int) *stdioSession {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &stdioSession{t: t, in: inW, answers: make(chan rawAnswer, 100), served: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		s.served <- New(svc, "9.9").Run(ctx, &StdioTransport{In: inR, Out: outW, MaxLine: maxLine})
		outW.Close()
	}()
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var a rawAnswer
			if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
				t.Errorf("an answer that is not JSON-RPC: %q: %v", sc.Text(), err)
				continue
			}
			s.answers <- a
		}
	}()
	t.Cleanup(func() {
		inW.Close()
		cancel()
		select {
		case <-s.served:
		case <-time.After(10 * time.Second):
			t.Error("the server did not end when its input closed")
		}
		outR.Close()
		<-read
	})
	return s
}

func (s *stdioSession) send(lines ...string) {
	s.t.Helper()
	for _, l := range lines {
		if _, err := io.WriteString(s.in, l+"\n"); err != nil {
			s.t.Fatalf("sending: %v", err)
		}
	}
}

func (s *stdioSession) next() rawAnswer {
	s.t.Helper()
	select {
	case a := <-s.answers:
		return a
	case err := <-s.served:
		s.t.Fatalf("the server ended: %v", err)
	case <-time.After(10 * time.Second):
		s.t.Fatal("no answer in 10 s")
	}
	return rawAnswer{}
}

const initializeLine = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// TestStdioAnswersBadLines attacks as a broken or hostile MCP client:
// each bad line gets the JSON-RPC error the spec names, on the id when it
// could be read, and the session goes on: a call in flight before the bad
// lines is answered after them, and a request after them is served.
func TestStdioAnswersBadLines(t *testing.T) {
	const maxLine = 4096
	svc := &fakeService{block: make(chan struct{})}
	s := serveStdio(t, svc, maxLine)
	s.send(initializeLine, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if a := s.next(); string(a.ID) != "1" || a.Error != nil {
		t.Fatalf("initialize: %+v", a)
	}
	// In flight: Exec blocks until the bad lines are answered.
	s.send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"capsem_exec","arguments":{"id":"dev","command":"true"}}}`)
	tests := []struct {
		name, line string
		code       int64
		id         string
		message    string
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":3,"method":`, -32700, "null", "parse error"},
		{"garbage", "\x00\xff hello", -32700, "null", "parse error"},
		{"two values on a line", `{"jsonrpc":"2.0","id":4,"method":"ping"} {}`, -32700, "null", "parse error"},
		{"batch", `[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","id":6,"method":"ping"}]`, -32600, "null", "batches are not supported"},
		{"empty batch", `[]`, -32600, "null", "batches are not supported"},
		{"a number", `42`, -32600, "null", "a message is a JSON object"},
		{"a string", `"ping"`, -32600, "null", "a message is a JSON object"},
		{"not JSON-RPC", `{"hello":"world"}`, -32600, "null", "invalid request"},
		{"wrong version, id kept", `{"jsonrpc":"1.0","id":7,"method":"ping"}`, -32600, "7", "version"},
		{"string id kept", `{"jsonrpc":"1.0","id":"seven","method":"ping"}`, -32600, `"seven"`, "version"},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, -32600, "null", "invalid request"},
		{"too deep", `{"jsonrpc":"2.0","id":8,"method":"ping","params":` + strings.Repeat("[", 1500) + strings.Repeat("]", 1500) + `}`, -32600, "8", "depth"},
		{"over the line bound", `{"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":"` + strings.Repeat("x", maxLine) + `"}}`, -32600, "null", "over 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.send(tt.line)
			a := s.next()
			if a.Error == nil || a.Error.Code != tt.code || string(a.ID) != tt.id || !strings.Contains(a.Error.Message, tt.message) {
				t.Fatalf("answer %s %+v, want code %d on id %s with %q", a.ID, a.Error, tt.code, tt.id, tt.message)
			}
		})
	}
	// Blank lines and CRLF endings are not errors.
	s.send("", "   ", `{"jsonrpc":"2.0","id":10,"method":"tools/list"}`+"\r")
	if a := s.next(); string(a.ID) != "10" || a.Error != nil || !bytes.Contains(a.Result, []byte("capsem_exec")) {
		t.Fatalf("tools/list after the bad lines: %s %+v", a.ID, a.Error)
	}
	close(svc.block)
	if a := s.next(); string(a.ID) != "2" || a.Error != nil || !bytes.Contains(a.Result, []byte(`"exitCode":3`)) {
		t.Fatalf("the call in flight: %s %+v %s", a.ID, a.Error, a.Result)
	}
}

// TestStdioSkipsALongLineUnheld: a line far over the bound is refused
// without being held: what reading it allocates stays near the bound, not
// the line's length.
func TestStdioSkipsALongLineUnheld(t *testing.T) {
	const limit = 1 << 20
	huge := append(bytes.Repeat([]byte("x"), 64<<20), '\n')
	in := io.MultiReader(bytes.NewReader(huge), strings.NewReader(`{"jsonrpc":"2.0","method":"ping"}`+"\n"))
	br := bufio.NewReaderSize(in, 64<<10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	line, over, err := readLine(br, limit)
	runtime.ReadMemStats(&after)
	if !over || line != nil || err != nil {
		t.Fatalf("the long line: %d bytes, over %v, %v", len(line), over, err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*limit {
		t.Errorf("reading a 64 MiB line allocated %d bytes, want near the %d-byte bound", alloc, limit)
	}
	line, over, err = readLine(br, limit)
	if over || string(line) != `{"jsonrpc":"2.0","method":"ping"}` || err != nil {
		t.Fatalf("the line after: %q, over %v, %v", line, over, err)
	}
	if _, _, err := readLine(br, limit); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: %v", err)
	}
}

// FuzzStdioTransport feeds arbitrary input to the transport: whatever it
// is, reading ends only at the input's end, every message passed on is a
// request or a response as the SDK decodes them, and every line written is a JSON-RPC error answer with
// the spec's code.
func FuzzStdioTransport(f *testing.F) {
	for _, seed := range []string{
		initializeLine + "\n",
		`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n\n",
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]` + "\n",
		"{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{}}\r\n42\nnot json\n",
		`{"jsonrpc":"2.0","id":1.5e3,"method":"x"}` + "\n" + `{"id":null}`,
		strings.Repeat("{", 300) + "\n",
		`{"jsonrpc":"2.0","id":1,"method":"ping","params":"` + strings.Repeat("y", 300) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		conn, err := (&StdioTransport{In: bytes.NewReader(data), Out: &out, MaxLine: 256}).Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for {
			msg, err := conn.Read(context.Background())
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("reading ended with %v, not at the input's end", err)
				}
				break
			}
			switch msg.(type) {
			case *sdkjsonrpc.Request, *sdkjsonrpc.Response:
			default:
				t.Fatalf("passed on a %T", msg)
			}
		}
		for _, line := range bytes.Split(bytes.TrimSuffix(out.Bytes(), []byte("\n")), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var a rawAnswer
			if err := json.Unmarshal(line, &a); err != nil || a.Error == nil || (a.Error.Code != -32700 && a.Error.Code != -32600) {
				t.Fatalf("answer %q (%v)", line, err)
			}
		}
	})
}
