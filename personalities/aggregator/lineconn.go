package aggregator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	sdkjsonrpc "github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/jsonrpc"
	"github.com/capsem/capsem/core/procs"
	"github.com/capsem/capsem/core/rawjson"
)

// maxServerLine bounds one message from a stdio server, as the SDK's own
// stdio connection does (mcp.DefaultMaxLineLength).
const maxServerLine = mcp.DefaultMaxLineLength

// directIDPrefix starts the ids of the requests the aggregator sends itself
// (callDirect). The SDK session numbers its requests, so a string id with
// this prefix is never one of its own.
const directIDPrefix = "capsem-"

// lineConn is the connection to a stdio MCP server: newline-delimited
// JSON-RPC on its pipes (the MCP stdio transport). It is the SDK client
// session's mcp.Connection (the handshake, lists, notifications and the
// server's own requests stay with the SDK), and it also carries requests the
// aggregator sends itself (callDirect) and whose answers it takes out of the
// stream before the session would see them. A tool call then crosses the
// aggregator as the bytes the server sent (what policy reads is what the
// server said), with no decode into the SDK's types and encode again; the
// SDK's decoder allocates 32 KiB per value, three values per call.
type lineConn struct {
	pipes *serverPipes

	incoming chan sdkjsonrpc.Message // messages for the SDK session
	done     chan struct{}           // closed once the connection failed or was closed

	out *procs.GroupWriter // the server's stdin: lines ready together go out in one write

	mu      sync.Mutex
	pending map[string]chan directAnswer // callDirect waiters by id
	nextID  uint64
	failed  error // why the connection ended; set once, with done

	closeOnce sync.Once
	closeErr  error
}

type directAnswer struct {
	result json.RawMessage
	err    error
}

func newLineConn(p *serverPipes) *lineConn {
	c := &lineConn{
		pipes:    p,
		incoming: make(chan sdkjsonrpc.Message),
		done:     make(chan struct{}),
		pending:  map[string]chan directAnswer{},
		out:      procs.NewGroupWriter(p),
	}
	go c.readLoop()
	return c
}

func (c *lineConn) readLoop() {
	br := bufio.NewReaderSize(c.pipes.r, 64<<10)
	for {
		line, err := readServerLine(br, maxServerLine)
		if err != nil {
			c.fail(err)
			return
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if c.deliverDirect(line) {
			continue
		}
		msgs, err := decodeServerLine(line)
		if err != nil {
			c.fail(err)
			return
		}
		for _, m := range msgs {
			select {
			case c.incoming <- m:
			case <-c.done:
				return
			}
		}
	}
}

// readServerLine returns the next line without its ending; a line over limit
// is an error (the stream cannot be trusted to be in step after it).
func readServerLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > limit+2 {
			return nil, fmt.Errorf("stdio server sent a message too large to accept (over %d bytes)", limit)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, chunk...)
			continue
		}
		if err != nil {
			if err == io.EOF && len(line)+len(chunk) > 0 {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if line == nil {
			// The chunk is only valid until the next read: copy it, since
			// a direct answer's result outlives this loop.
			line = bytes.Clone(chunk)
		} else {
			line = append(line, chunk...)
		}
		return bytes.TrimRight(line, "\r\n"), nil
	}
}

// decodeServerLine decodes one line for the SDK session: a message, or a
// batch (an array of messages, allowed before protocol 2025-06-18).
func decodeServerLine(line []byte) ([]sdkjsonrpc.Message, error) {
	trimmed := bytes.TrimSpace(line)
	if trimmed[0] != '[' {
		m, err := sdkjsonrpc.DecodeMessage(trimmed)
		if err != nil {
			return nil, fmt.Errorf("stdio server sent an invalid JSON-RPC message: %w", err)
		}
		return []sdkjsonrpc.Message{m}, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(trimmed, &batch); err != nil {
		return nil, fmt.Errorf("stdio server sent an invalid JSON-RPC batch: %w", err)
	}
	if len(batch) == 0 {
		return nil, errors.New("stdio server sent an empty JSON-RPC batch")
	}
	out := make([]sdkjsonrpc.Message, 0, len(batch))
	for _, raw := range batch {
		m, err := sdkjsonrpc.DecodeMessage(raw)
		if err != nil {
			return nil, fmt.Errorf("stdio server sent an invalid JSON-RPC message in a batch: %w", err)
		}
		out = append(out, m)
	}
	return out, nil
}

// directAnswerID returns the id of line when it answers one of our direct
// requests: a response (no method) whose id is a string with our prefix.
func directAnswerID(line []byte) (string, bool) {
	raw, _, ok := rawjson.Member(line, "id")
	if !ok || !bytes.HasPrefix(raw, []byte(`"`+directIDPrefix)) {
		return "", false
	}
	if _, _, isRequest := rawjson.Member(line, "method"); isRequest {
		return "", false
	}
	var id string
	if json.Unmarshal(raw, &id) != nil {
		return "", false
	}
	return id, true
}

// deliverDirect hands an answer to its callDirect waiter and reports whether
// line was one. A late answer (its caller gave up) is dropped.
func (c *lineConn) deliverDirect(line []byte) bool {
	id, ok := directAnswerID(line)
	if !ok {
		return false
	}
	c.mu.Lock()
	ch := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if ch == nil {
		return true
	}
	msg, err := jsonrpc.ParseResponse(line)
	switch {
	case err != nil:
		ch <- directAnswer{err: fmt.Errorf("stdio server: %w", err)}
	case msg.Error != nil:
		ch <- directAnswer{err: msg.Error}
	default:
		ch <- directAnswer{result: msg.Result}
	}
	return true
}

// fail ends the connection for its users: Read returns err (io.EOF when the
// server closed its output) and every direct call fails.
func (c *lineConn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failed != nil {
		return
	}
	c.failed = err
	for id, ch := range c.pending {
		ch <- directAnswer{err: fmt.Errorf("%w: %v", mcp.ErrConnectionClosed, err)}
		delete(c.pending, id)
	}
	close(c.done)
}

// Read implements mcp.Connection.
func (c *lineConn) Read(ctx context.Context) (sdkjsonrpc.Message, error) {
	select {
	case m := <-c.incoming:
		return m, nil
	case <-c.done:
		c.mu.Lock()
		err := c.failed
		c.mu.Unlock()
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Write implements mcp.Connection.
func (c *lineConn) Write(ctx context.Context, msg sdkjsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	data, err := sdkjsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return c.writeLine(data)
}

func (c *lineConn) writeLine(data []byte) error {
	select {
	case <-c.done:
		return mcp.ErrConnectionClosed
	default:
	}
	// One write per message: a line never interleaves with another.
	_, err := c.out.Write(append(data, '\n'))
	return err
}

// Close implements mcp.Connection: it shuts the server down (serverPipes).
func (c *lineConn) Close() error {
	c.closeOnce.Do(func() {
		c.fail(mcp.ErrConnectionClosed)
		c.closeErr = c.pipes.Close()
	})
	return c.closeErr
}

// SessionID implements mcp.Connection; stdio has no session id.
func (c *lineConn) SessionID() string { return "" }

// callDirect sends method with params (a JSON object, sent as is) and
// returns the server's result as it sent it. A server error is a
// *jsonrpc.Error. When ctx ends first the server is told the request was
// cancelled. Errors for a connection that had already ended, so that the
// request was never sent, say "client is closing" as the SDK's do.
func (c *lineConn) callDirect(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	ch := make(chan directAnswer, 1)
	c.mu.Lock()
	if c.failed != nil {
		err := c.failed
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: client is closing: %v", mcp.ErrConnectionClosed, err)
	}
	c.nextID++
	id := directIDPrefix + strconv.FormatUint(c.nextID, 10)
	c.pending[id] = ch
	c.mu.Unlock()

	line := make([]byte, 0, len(params)+len(id)+64)
	line = append(line, `{"jsonrpc":"2.0","id":"`...)
	line = append(line, id...)
	line = append(line, `","method":`...)
	line = appendJSONString(line, method)
	line = append(line, `,"params":`...)
	line = append(line, params...)
	line = append(line, '}')
	if err := c.writeLine(line); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		// A failed write means the server stopped reading: it did not run
		// the request (and a connection that had ended never sent it).
		return nil, fmt.Errorf("%w: client is closing: %v", mcp.ErrConnectionClosed, err)
	}
	select {
	case a := <-ch:
		return a.result, a.err
	case <-ctx.Done():
		c.mu.Lock()
		_, waiting := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if !waiting { // answered (or failed) just now
			a := <-ch
			return a.result, a.err
		}
		// Best effort, off the caller's path: a server that stopped reading
		// must not hold up the caller's error.
		go c.writeLine(cancelledNotification(id, context.Cause(ctx)))
		return nil, ctx.Err()
	}
}

// appendJSONString appends s as a JSON string (strconv's quoting is Go's,
// not JSON's, for control and invalid bytes).
func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always encodes
	return append(b, q...)
}

func cancelledNotification(id string, cause error) []byte {
	reason := "cancelled"
	if cause != nil {
		reason = cause.Error()
	}
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"method":  "notifications/cancelled",
		"params":  map[string]any{"requestId": id, "reason": reason},
	})
	return b
}
