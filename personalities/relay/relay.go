// Package relay is capsem-mcp-server: the stdio MCP server an agent inside the
// sandbox talks to. It forwards every JSON-RPC line as a frame to the host MCP
// endpoint and writes every answer back as one line.
package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/capsem/capsem/core/envvars"
	"github.com/capsem/capsem/core/jsonrpc"
	"github.com/capsem/capsem/core/mcpframe"
	"github.com/capsem/capsem/core/procs"
)

// CodeTransport is the local error for a call the transport could not finish.
const CodeTransport = -32001

// Cmd is the relay personality.
type Cmd struct{}

// Run relays stdin/stdout until stdin closes.
func (c *Cmd) Run(ctx context.Context) error {
	procs.TuneGC()
	procs.Limit(1) // a forwarder: one P is plenty, and it shares the CPUs
	dial, err := DialerFromEnv(envvars.MCPEndpoint.Get())
	if err != nil {
		return err
	}
	in, out, restore := procs.PollableStdio()
	defer restore()
	r := &Relay{Dial: dial, Name: ParentProcessName(os.Getppid()), TraceID: envvars.TraceID.Get(), Out: procs.RawWriter(out)}
	return r.Run(ctx, procs.RawReader(in))
}

// Dialer opens a connection to the endpoint.
type Dialer func(ctx context.Context) (net.Conn, error)

// GuestSocket is where the guest agent (PID 1, the only owner of the guest
// channel) bridges connections to logical port 5002 on the host.
const GuestSocket = "/run/capsem/mcp.sock"

// DialerFromEnv returns the dialer for an endpoint spec; "" means the guest
// channel, through the agent's bridge socket.
func DialerFromEnv(spec string) (Dialer, error) {
	if spec == "" {
		return guestDialer(GuestSocket)
	}
	path, err := envvars.MCPEndpoint.Parse(spec)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}, nil
}

func guestDialer(path string) (Dialer, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("no guest channel (%s: %v) and %s is not set (use unix:PATH)", path, err, envvars.MCPEndpoint.Name())
	}
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}, nil
}

// ParentProcessName is the name of the program that started the relay:
// the basename of the parent's argv[0], else its comm, else "unknown",
// sanitized for a frame. When argv[0] is an interpreter running a script
// (Gemini CLI is `node /usr/local/bin/gemini`), the script names the
// program.
func ParentProcessName(ppid int) string {
	if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ppid), "cmdline")); err == nil {
		if name := programName(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")); name != "" {
			return mcpframe.SanitizeName(name)
		}
	}
	if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(ppid), "comm")); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return mcpframe.SanitizeName(s)
		}
	}
	return "unknown"
}

// interpreters run a program given as a script: the script names it. Each
// has the options that give it code on the command line instead.
var interpreters = map[string][]string{
	"node": {"-e", "--eval", "-p", "--print"}, "nodejs": {"-e", "--eval", "-p", "--print"}, "bun": {"-e", "--eval", "-p", "--print"},
	"deno": {"eval"}, "python": {"-c", "-m"}, "python3": {"-c", "-m"}, "ruby": {"-e"}, "perl": {"-e", "-E"},
	"sh": {"-c"}, "bash": {"-c"}, "dash": {"-c"},
}

// programName is the program an argv runs: the basename of argv[0], or,
// for an interpreter, of its script: its first argument that is not an
// option ("" when it has none; code on the command line, or a REPL, is
// the interpreter itself).
func programName(argv []string) string {
	if len(argv) == 0 || argv[0] == "" {
		return ""
	}
	name := filepath.Base(argv[0])
	inline, ok := interpreters[name]
	if !ok {
		return name
	}
	for _, a := range argv[1:] {
		switch {
		case slices.Contains(inline, a):
			return name
		case strings.HasPrefix(a, "-"):
			continue
		default:
			base := filepath.Base(a)
			for _, ext := range []string{".js", ".mjs", ".cjs"} {
				base = strings.TrimSuffix(base, ext)
			}
			return base
		}
	}
	return name
}

// Relay forwards JSON-RPC lines as frames.
type Relay struct {
	Dial Dialer
	Name string
	// TraceID is the trace the relay's caller runs under (a command the
	// host ran with one passes it on in the environment): the gateway's
	// rows of this relay's calls carry it.
	TraceID string
	Out     io.Writer

	outMu sync.Mutex // one line at a time on stdout

	mu     sync.Mutex
	conn   *relayConn
	nextID uint32

	unsent *relayConn // the connection holding frames Run queued (Run's goroutine only)
}

type pendingCall struct {
	id     json.RawMessage
	method string
}

type relayConn struct {
	c       net.Conn
	r       io.Reader // c, through raw system calls where it can
	w       io.Writer
	wmu     sync.Mutex
	queued  []byte // frames not yet written (guarded by wmu)
	mu      sync.Mutex
	pending map[uint32]pendingCall
	dead    bool
	done    chan struct{}
}

// maxLine bounds a stdin line we will even try to read whole; longer lines
// are consumed and answered with an error.
const maxLine = mcpframe.MaxPayloadLen + 1

// Run reads lines from in until EOF.
func (r *Relay) Run(ctx context.Context, in io.Reader) error {
	br := bufio.NewReaderSize(in, 64<<10)
	for {
		line, tooLong, err := readLine(br, maxLine)
		if len(line) > 0 || tooLong {
			r.handleLine(ctx, line, tooLong)
		}
		if err != nil || !lineBuffered(br) {
			r.flushFrames()
		}
		if err != nil {
			r.finish()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("reading stdin: %w", err)
		}
	}
}

// readLine returns one line without its line ending. The limit applies to
// the content, not to the "\n" or "\r\n" that ends it. If the content
// exceeds limit, its first limit bytes are returned with tooLong set and the
// rest of the line is discarded.
func readLine(br *bufio.Reader, limit int) ([]byte, bool, error) {
	var line []byte
	dropped := false
	for {
		chunk, err := br.ReadSlice('\n')
		// Keep at most the content limit plus a "\r\n" ending.
		if room := limit + 2 - len(line); len(chunk) > room {
			line = append(line, chunk[:max(room, 0)]...)
			dropped = true
		} else {
			line = append(line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		content := line
		if !dropped { // the ending is only in view when nothing was dropped
			content = bytes.TrimSuffix(content, []byte("\n"))
			content = bytes.TrimSuffix(content, []byte("\r"))
		}
		tooLong := dropped || len(content) > limit
		if tooLong {
			content = content[:limit]
		}
		return bytes.TrimRight(content, "\r\n"), tooLong, err
	}
}

// classify sniffs the id and method: a JSON object without an id is a
// notification; anything else (including invalid JSON, which the endpoint
// answers with -32700) is a request.
func classify(line []byte) (id json.RawMessage, method string, notification bool) {
	var probe struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	trimmed := strings.TrimSpace(string(line))
	if !strings.HasPrefix(trimmed, "{") || json.Unmarshal(line, &probe) != nil {
		return nil, "", false
	}
	if len(probe.ID) == 0 || string(probe.ID) == "null" {
		return nil, probe.Method, true
	}
	return probe.ID, probe.Method, false
}

func (r *Relay) handleLine(ctx context.Context, line []byte, tooLong bool) {
	if len(strings.TrimSpace(string(line))) == 0 && !tooLong {
		return
	}
	id, method, notification := classify(line)
	if tooLong || len(line)+len(r.Name) > mcpframe.MaxPayloadLen {
		if tooLong {
			id, method = sniffID(line)
		}
		if !notification || tooLong {
			r.writeLine(jsonrpc.ErrorResponse(id, jsonrpc.NewError(jsonrpc.CodeInvalidRequest,
				"request too large for an MCP frame (max %d bytes); not sent (method %q)", mcpframe.MaxPayloadLen-len(r.Name), method)))
		}
		return
	}
	rc, err := r.connection(ctx)
	if err != nil {
		if !notification {
			r.writeLine(jsonrpc.ErrorResponse(id, &jsonrpc.Error{Code: CodeTransport, Message: fmt.Sprintf("MCP endpoint unreachable before %s: %v", method, err)}))
		}
		return
	}
	f := mcpframe.Frame{Name: r.Name, Payload: line}
	if notification {
		f.Flags = mcpframe.FlagNotification
	} else {
		r.mu.Lock()
		r.nextID++
		f.StreamID = r.nextID
		r.mu.Unlock()
		rc.mu.Lock()
		dead := rc.dead
		if !dead {
			rc.pending[f.StreamID] = pendingCall{id: id, method: method}
		}
		rc.mu.Unlock()
		if dead {
			r.writeLine(jsonrpc.ErrorResponse(id, &jsonrpc.Error{Code: CodeTransport,
				Message: fmt.Sprintf("MCP transport disconnected before %s response: connection closed", method)}))
			return
		}
	}
	if r.unsent != nil && r.unsent != rc {
		r.flushFrames()
	}
	rc.wmu.Lock()
	rc.queued, err = mcpframe.Append(rc.queued, &f)
	rc.wmu.Unlock()
	if err != nil {
		rc.c.Close() // the reader then fails every pending call, this one included
		return
	}
	r.unsent = rc
	if f.StreamID == ^uint32(0) {
		// Stream ids must keep increasing: start a fresh connection next time.
		r.flushFrames()
		r.retire(rc)
	}
}

// flushFrames writes the frames Run queued. Run calls it when no further
// line is already read (lines that came in one read go out in one write),
// so no frame waits on input that has not arrived.
func (r *Relay) flushFrames() {
	rc := r.unsent
	if rc == nil {
		return
	}
	r.unsent = nil
	rc.wmu.Lock()
	var err error
	if len(rc.queued) > 0 {
		_, err = rc.w.Write(rc.queued)
	}
	if cap(rc.queued) > 64<<10 {
		rc.queued = nil // do not pin a large buffer after a big request
	} else {
		rc.queued = rc.queued[:0]
	}
	rc.wmu.Unlock()
	if err != nil {
		rc.c.Close() // the reader then fails every pending call
	}
}

// lineBuffered reports whether br holds a whole line already.
func lineBuffered(br *bufio.Reader) bool {
	b, _ := br.Peek(br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// sniffID pulls an id out of a truncated line, best effort, so an oversized
// request can still be answered on its id.
func sniffID(line []byte) (json.RawMessage, string) {
	s := string(line)
	var id json.RawMessage
	if i := strings.Index(s, `"id"`); i >= 0 {
		rest := strings.TrimLeft(s[i+4:], " \t:")
		dec := json.NewDecoder(strings.NewReader(rest))
		var v json.RawMessage
		if dec.Decode(&v) == nil && len(v) > 0 && (v[0] == '"' || v[0] == '-' || (v[0] >= '0' && v[0] <= '9')) {
			id = v
		}
	}
	method := ""
	if i := strings.Index(s, `"method"`); i >= 0 {
		rest := strings.TrimLeft(s[i+8:], " \t:")
		_ = json.NewDecoder(strings.NewReader(rest)).Decode(&method)
	}
	return id, method
}

func (r *Relay) connection(ctx context.Context) (*relayConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rc := r.conn; rc != nil {
		rc.mu.Lock()
		dead := rc.dead
		rc.mu.Unlock()
		if !dead {
			return rc, nil
		}
	}
	c, err := r.Dial(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(mcpframe.AppendMetaLine(nil, mcpframe.Meta{Name: r.Name, TraceID: r.TraceID})); err != nil {
		c.Close()
		return nil, fmt.Errorf("sending metadata: %w", err)
	}
	rc := &relayConn{c: c, r: procs.RawReader(c), w: procs.RawWriter(c), pending: map[uint32]pendingCall{}, done: make(chan struct{})}
	r.conn = rc
	r.nextID = 0
	go r.readLoop(rc)
	return rc, nil
}

func (r *Relay) retire(rc *relayConn) {
	r.mu.Lock()
	if r.conn == rc {
		r.conn = nil
	}
	r.mu.Unlock()
	if cw, ok := rc.c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

func (r *Relay) readLoop(rc *relayConn) {
	defer close(rc.done)
	// Buffered: a frame's length and body come in one read.
	br := bufio.NewReaderSize(rc.r, 64<<10)
	fr := mcpframe.NewReader(br)
	var lines []byte
	flush := func() {
		if len(lines) > 0 {
			r.outMu.Lock()
			_, _ = r.Out.Write(lines)
			r.outMu.Unlock()
		}
		if cap(lines) > 64<<10 {
			lines = nil
		} else {
			lines = lines[:0]
		}
	}
	reason := "connection closed"
	for {
		f, err := fr.Read()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				reason = err.Error()
			}
			break
		}
		rc.mu.Lock()
		delete(rc.pending, f.StreamID)
		rc.mu.Unlock()
		if len(f.Payload) > 0 {
			lines = appendLine(lines, f.Payload)
		}
		// Answers that came in one read go out in one write; none waits on
		// a frame still arriving.
		if len(lines) > 64<<10 || !frameBuffered(br) {
			flush()
		}
	}
	flush()
	rc.c.Close()
	rc.mu.Lock()
	rc.dead = true
	pending := rc.pending
	rc.pending = map[uint32]pendingCall{}
	rc.mu.Unlock()
	// Requests are not replayed: tools/call is not idempotent.
	for _, p := range pending {
		r.writeLine(jsonrpc.ErrorResponse(p.id, &jsonrpc.Error{Code: CodeTransport,
			Message: fmt.Sprintf("MCP transport disconnected before %s response: %s", p.method, reason)}))
	}
}

func (r *Relay) writeLine(payload []byte) {
	buf := appendLine(make([]byte, 0, len(payload)+1), payload)
	r.outMu.Lock()
	defer r.outMu.Unlock()
	_, _ = r.Out.Write(buf)
}

// appendLine appends payload and, unless it ends in one, a newline.
func appendLine(b, payload []byte) []byte {
	b = append(b, payload...)
	if len(payload) == 0 || payload[len(payload)-1] != '\n' {
		b = append(b, '\n')
	}
	return b
}

// frameBuffered reports whether br holds a whole frame already.
func frameBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n < mcpframe.PrefixLen {
		return false
	}
	head, _ := br.Peek(mcpframe.PrefixLen)
	return n-mcpframe.PrefixLen >= int(binary.BigEndian.Uint32(head))
}

// finish half-closes the connection and waits for every answer.
func (r *Relay) finish() {
	r.mu.Lock()
	rc := r.conn
	r.mu.Unlock()
	if rc == nil {
		return
	}
	if cw, ok := rc.c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		rc.c.Close()
	}
	<-rc.done
}
