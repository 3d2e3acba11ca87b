package hostmcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	sdkjsonrpc "github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capsem/capsem/core/jsonrpc"
	"github.com/capsem/capsem/core/rawjson"
)

// MaxLineBytes bounds one message capsem mcp reads on stdio:
// MaxMessageBytes, as over HTTP (the SDK's stdio transport stops at
// mcp.DefaultMaxLineLength, 16 MiB, under a large capsem_write_file).
const MaxLineBytes = MaxMessageBytes

// StdioTransport is the MCP stdio transport of capsem mcp: one JSON-RPC
// message per line on In, answers on Out. The SDK's own transport decodes
// the stream as one JSON value after another and ends the session, and with
// it every call in flight, at the first it cannot take. This one reads line
// by line and answers a bad line in its place: -32700 (parse error) for
// text that is not JSON, -32600 (invalid request) for a batch, a value that
// is not an object, an object that is not a JSON-RPC message, or a line
// over MaxLine bytes (skipped without being held), each on id null unless
// the message's id could be read. The session goes on. Batches are refused
// because MCP removed them (2025-06-18).
type StdioTransport struct {
	In  io.Reader
	Out io.Writer
	// MaxLine bounds a line; 0 means MaxLineBytes.
	MaxLine int
	// Log, when not nil, tells each line refused.
	Log *slog.Logger
}

// Connect implements mcp.Transport.
func (t *StdioTransport) Connect(context.Context) (mcp.Connection, error) {
	limit := t.MaxLine
	if limit <= 0 {
		limit = MaxLineBytes
	}
	log := t.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &stdioConn{
		in:       t.In,
		out:      t.Out,
		log:      log,
		incoming: make(chan sdkjsonrpc.Message),
		done:     make(chan struct{}),
		ended:    make(chan struct{}),
	}
	go c.readLoop(limit)
	return c, nil
}

// stdioConn is a StdioTransport's connection.
type stdioConn struct {
	in  io.Reader
	out io.Writer
	log *slog.Logger

	writeMu sync.Mutex // one line at a time on out: answers and refusals never interleave

	incoming chan sdkjsonrpc.Message // messages read, for Read
	done     chan struct{}           // closed by Close

	ended   chan struct{} // closed when reading ended
	readErr error         // why (io.EOF at the end of In); set before ended closes

	closeOnce sync.Once
}

// readLoop reads In line by line until it ends or the connection closes,
// passing on each message and answering each bad line.
func (c *stdioConn) readLoop(limit int) {
	c.readErr = c.readLines(bufio.NewReaderSize(c.in, 64<<10), limit)
	close(c.ended)
}

func (c *stdioConn) readLines(br *bufio.Reader, limit int) error {
	for {
		line, over, err := readLine(br, limit)
		if over {
			c.refuse(nil, jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "message over %d bytes: refused and skipped", limit))
		} else if len(line) > 0 {
			msg, id, rpcErr := decodeLine(line)
			if rpcErr != nil {
				c.refuse(id, rpcErr)
			} else {
				select {
				case c.incoming <- msg:
				case <-c.done:
					return mcp.ErrConnectionClosed
				}
			}
		}
		if err != nil {
			return err
		}
	}
}

// readLine returns the next line without its end and surrounding blanks.
// A line over limit bytes is read to its end and dropped (over), holding
// no more than limit of it. err is the reader's (io.EOF once In ends), with
// the unterminated last line, if any.
func readLine(br *bufio.Reader, limit int) (line []byte, over bool, err error) {
	// A long line is kept in the reader's pieces and joined once at its
	// end: growing one buffer by doubling would hold up to three times
	// the line (the old array, the new one, and the collector's lag).
	var pieces [][]byte
	size := 0
	for {
		chunk, err := br.ReadSlice('\n')
		if !over {
			if size+len(chunk) > limit+2 { // room for "\r\n"
				over, pieces = true, nil
			} else {
				pieces = append(pieces, bytes.Clone(chunk))
				size += len(chunk)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if over {
			return nil, true, err
		}
		var buf []byte
		switch len(pieces) {
		case 0:
		case 1:
			buf = pieces[0]
		default:
			buf = make([]byte, 0, size)
			for _, p := range pieces {
				buf = append(buf, p...)
			}
		}
		trimmed := rawjson.TrimSpace(buf)
		if len(trimmed) > limit {
			return nil, true, err
		}
		return trimmed, false, err
	}
}

// decodeLine reads one line as the SDK would read a message, or returns
// the error to answer it with and, when it could be read, its id.
func decodeLine(line []byte) (sdkjsonrpc.Message, json.RawMessage, *jsonrpc.Error) {
	if !json.Valid(line) {
		var v json.RawMessage
		err := json.Unmarshal(line, &v)
		return nil, nil, jsonrpc.NewError(jsonrpc.CodeParseError, "parse error: %v", err)
	}
	switch line[0] {
	case '{':
	case '[':
		return nil, nil, jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "invalid request: batches are not supported")
	default:
		return nil, nil, jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "invalid request: a message is a JSON object")
	}
	msg, err := sdkjsonrpc.DecodeMessage(line)
	if err != nil {
		return nil, idOf(line), jsonrpc.NewError(jsonrpc.CodeInvalidRequest, "invalid request: %v", err)
	}
	return msg, nil, nil
}

// idOf returns the id of a JSON object when it is one a request may carry
// (a string or a number), else nil.
func idOf(obj []byte) json.RawMessage {
	raw, _, ok := rawjson.Member(obj, "id")
	if !ok {
		return nil
	}
	if _, isString := rawjson.String(raw); isString {
		return raw
	}
	var n json.Number
	if raw[0] != '"' && json.Unmarshal(raw, &n) == nil {
		return raw
	}
	return nil
}

// refuse answers a bad line with e.
func (c *stdioConn) refuse(id json.RawMessage, e *jsonrpc.Error) {
	c.log.Warn("capsem mcp refused a message", "code", e.Code, "err", e.Message)
	if err := c.writeLine(jsonrpc.ErrorResponse(id, e)); err != nil {
		c.log.Warn("answering a refused message", "err", err)
	}
}

func (c *stdioConn) writeLine(data []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	// One write per line, so that a reader of Out never sees half of one.
	_, err := c.out.Write(append(data, '\n'))
	return err
}

// Read implements mcp.Connection.
func (c *stdioConn) Read(ctx context.Context) (sdkjsonrpc.Message, error) {
	select {
	case msg := <-c.incoming:
		return msg, nil
	case <-c.done:
		return nil, io.EOF
	case <-c.ended:
		return nil, c.readErr
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Write implements mcp.Connection.
func (c *stdioConn) Write(ctx context.Context, msg sdkjsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case <-c.done:
		return mcp.ErrConnectionClosed
	default:
	}
	data, err := sdkjsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("encoding a message: %w", err)
	}
	return c.writeLine(data)
}

// Close implements mcp.Connection. It closes In when it can be closed: a
// read of it blocks the reading goroutine until it is (or In ends).
func (c *stdioConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.done)
		if cl, ok := c.in.(io.Closer); ok {
			err = cl.Close()
		}
	})
	return err
}

// SessionID implements mcp.Connection; stdio has no session.
func (c *stdioConn) SessionID() string { return "" }
