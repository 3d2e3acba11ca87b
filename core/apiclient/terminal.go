package apiclient

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/unixsock"
)

// TermConn is a terminal connection after its upgrade: reads come through
// the reader that read the answer (it may hold the stream's first bytes).
type TermConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *TermConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite ends the client's half of the stream, when the transport can.
func (c *TermConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// DialTerminal opens a terminal on the API at socket (route, a per-VM
// process's api.RouteTerminal or the service's VM terminal route) and
// returns the connection once it carries the terminal stream.
func DialTerminal(ctx context.Context, socket, route string, req api.TermRequest) (*TermConn, error) {
	conn, err := unixsock.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequest(http.MethodPost, "http://capsem"+route, strings.NewReader(string(body)))
	if err != nil {
		conn.Close()
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", api.TermUpgrade)
	if err := hreq.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", route, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, hreq)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", route, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		defer resp.Body.Close()
		return nil, statusError(route, resp)
	}
	conn.SetDeadline(time.Time{})
	return &TermConn{Conn: conn, r: br}, nil
}
