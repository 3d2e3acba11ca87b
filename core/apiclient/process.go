// Package apiclient holds the clients of Capsem's local HTTP APIs, whose
// wire types and routes are in package api.
package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/unixsock"
)

// ProcessClient talks to one per-VM process over its Unix socket.
type ProcessClient struct {
	http *http.Client
}

// NewProcessClient returns a client for the socket at path. It talks only
// to a process of this user's (unixsock.Dial).
func NewProcessClient(path string) *ProcessClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return unixsock.Dial(ctx, path)
	}}
	return &ProcessClient{http: &http.Client{Transport: tr}}
}

// CallProcess sends in to the per-VM process's verb and returns the
// answer; errors name the route.
func CallProcess[In, Out any](ctx context.Context, c *ProcessClient, verb api.Verb[In, Out], in In) (Out, error) {
	var out Out
	var body io.Reader
	contentType := ""
	if verb.HasBody() {
		b, err := json.Marshal(in)
		if err != nil {
			return out, err
		}
		body, contentType = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, verb.Method, verb.Path(""), nil, contentType, body)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	if verb.MaxAnswer > 0 {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.LimitReader(resp.Body, verb.MaxAnswer), resp.Body}
	}
	var answer any
	if verb.HasAnswer() {
		answer = &out
	}
	return out, decode(verb.Route, resp, answer)
}

// do sends one request to route (with query, if any); the caller closes the
// response body. Errors name the route.
func (c *ProcessClient) do(ctx context.Context, method, route string, query url.Values, contentType string, body io.Reader) (*http.Response, error) {
	target := "http://capsem" + route
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", route, transportError(err))
	}
	return resp, nil
}

func decode(route string, resp *http.Response, out any) error {
	if resp.StatusCode/100 != 2 {
		err := statusError(route, resp).(*StatusError)
		err.Message = route + ": " + strings.TrimPrefix(err.Message, route+": ")
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s: decoding response: %w", route, err)
	}
	return nil
}

// Info returns the VM's description.
func (c *ProcessClient) Info(ctx context.Context) (*api.Info, error) {
	info, err := CallProcess(ctx, c, api.ProcessInfoVerb, api.None{})
	if err != nil {
		return nil, err
	}
	return &info, nil
}

// WaitReady polls /info until the process answers or ctx ends.
func (c *ProcessClient) WaitReady(ctx context.Context) (*api.Info, error) {
	for {
		info, err := c.Info(ctx)
		if err == nil && info.State == "running" {
			return info, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("state %q", info.State)
			}
			return nil, fmt.Errorf("waiting for the VM process: %w (last: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Exec runs a command, streaming output to stdout and stderr, and returns
// the final event.
func (c *ProcessClient) Exec(ctx context.Context, r *api.ExecRequest, stdout, stderr io.Writer) (*api.ExecEvent, error) {
	body, _ := json.Marshal(r)
	resp, err := c.do(ctx, http.MethodPost, api.RouteExec, nil, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, decode(api.RouteExec, resp, nil)
	}
	ev, err := api.ReadExecStream(resp.Body, stdout, stderr)
	return ev, streamFailure(ev, err)
}

// ReadFileTo copies a guest file into w as it streams (GET files/content).
// follow reads through a symbolic link in the last path component, which
// is refused otherwise; max (when > 0) refuses a larger file. A read that
// does not end whole is an error (api.ErrFileCut) even after w has had
// part of it. It returns the byte count and the SHA-256 (hex).
func (c *ProcessClient) ReadFileTo(ctx context.Context, path string, follow bool, max int64, w io.Writer) (int64, string, error) {
	const route = api.RouteFileContent
	q := url.Values{"path": {path}}
	if follow {
		q.Set("follow", "1")
	}
	if max > 0 {
		q.Set("max", strconv.FormatInt(max, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, route, q, "", nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return 0, "", decode(route, resp, nil)
	}
	n, digest, err := api.ReadFileStream(resp, w)
	if err != nil {
		return n, "", readFailure(resp, fmt.Sprintf("%s: reading %s", route, path), err)
	}
	return n, digest, nil
}

// ReadFile reads a whole guest file of at most max bytes into memory.
func (c *ProcessClient) ReadFile(ctx context.Context, path string, follow bool, max int64) ([]byte, error) {
	buf := bytes.NewBuffer([]byte{}) // an empty file is empty, not nil
	if _, _, err := c.ReadFileTo(ctx, path, follow, max, buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteFileFrom writes a guest file from r as it streams (PUT
// files/content), creating missing parent directories; mode 0 keeps an
// existing file's mode (0644 for a new one). The guest replaces the file
// only once all of r has arrived. It returns the SHA-256 (hex) of what the
// VM's process sent on.
func (c *ProcessClient) WriteFileFrom(ctx context.Context, path string, mode uint32, r io.Reader) (string, error) {
	const route = api.RouteFileContent
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	resp, err := c.do(ctx, http.MethodPut, route, q, "application/octet-stream", r)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if err := decode(route, resp, nil); err != nil {
		return "", err
	}
	return resp.Header.Get(api.TrailerDigest), nil
}

// WriteFile writes data as a guest file (WriteFileFrom).
func (c *ProcessClient) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	_, err := c.WriteFileFrom(ctx, path, mode, bytes.NewReader(data))
	return err
}

// Publish publishes one more port of the running VM and returns it as
// published.
func (c *ProcessClient) Publish(ctx context.Context, m api.PortMapping) (api.PortMapping, error) {
	return CallProcess(ctx, c, api.ProcessPortsVerb, m)
}

// MCP sends one MCP request through the VM's gateway as the host. The
// answer is read up to its bound (api.MaxMCPCallBytes, with room for the
// JSON around it).
func (c *ProcessClient) MCP(ctx context.Context, req api.MCPCallRequest) (api.MCPCallResult, error) {
	return CallProcess(ctx, c, api.ProcessMCPVerb, req)
}

// MCPServers lists the VM's gateway's servers.
func (c *ProcessClient) MCPServers(ctx context.Context) (api.MCPServersResult, error) {
	return CallProcess(ctx, c, api.ProcessMCPServersVerb, api.None{})
}

// Stop shuts the VM down (cleanly if the guest answers).
func (c *ProcessClient) Stop(ctx context.Context) error {
	_, err := CallProcess(ctx, c, api.ProcessStopVerb, api.None{})
	return err
}

// Logs returns the tail of the guest's serial console log (tail lines,
// optionally only those containing grep).
func (c *ProcessClient) Logs(ctx context.Context, tail int, grep string) (string, error) {
	q := url.Values{}
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	if grep != "" {
		q.Set("grep", grep)
	}
	resp, err := c.do(ctx, http.MethodGet, api.RouteLogs, q, "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", decode(api.RouteLogs, resp, nil)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 2<<20))
	return string(b), err
}

// ForkCopy has the running VM copy its disk and workspace into dir, a
// staging directory of the image store, paused meanwhile.
func (c *ProcessClient) ForkCopy(ctx context.Context, dir string) (api.ForkCopy, error) {
	return CallProcess(ctx, c, api.ProcessForkVerb, api.ForkCopyRequest{Dir: dir})
}

// Suspend has the VM park its guest, save its whole state and stop.
func (c *ProcessClient) Suspend(ctx context.Context) (api.SuspendResult, error) {
	return CallProcess(ctx, c, api.ProcessSuspendVerb, api.None{})
}
