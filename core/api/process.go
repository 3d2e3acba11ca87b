// Package api holds the HTTP types and clients of Capsem's local APIs. The
// per-VM process serves its API on a 0600 Unix socket in the session dir.
package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/capsem/capsem/core/guestwire"
)

// ExecRequest runs a command in the guest. Exactly one of Argv and Command is
// set; Command runs under /bin/sh -c.
type ExecRequest struct {
	Argv      []string          `json:"argv,omitempty"`
	Command   string            `json:"command,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // 0: no timeout
}

// ExecEvent is one line of the streamed /exec response: output chunks, then
// exactly one final event with Done set (or Error).
type ExecEvent struct {
	Stream string `json:"stream,omitempty"` // "stdout" | "stderr"
	Data   []byte `json:"data,omitempty"`   // base64 in JSON

	Done            bool   `json:"done,omitempty"`
	ExitCode        int    `json:"exit_code"`
	Signal          int    `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	StdoutBytes     int64  `json:"stdout_bytes,omitempty"`
	StderrBytes     int64  `json:"stderr_bytes,omitempty"`
	DurationMS      int64  `json:"duration_ms,omitempty"`
	ExecID          string `json:"exec_id,omitempty"`
	Error           string `json:"error,omitempty"`
}

// MaxFileBytes bounds one file read or write through the API: the guest
// protocol's limit.
const MaxFileBytes = guestwire.MaxFileSize

// FileRequest stats or creates a directory in the guest. File contents
// travel as raw bodies of GET and PUT /files/content instead: as JSON they
// would be base64, a third larger, and decoded through more copies.
type FileRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"`
}

// FileResponse answers a FileRequest.
type FileResponse struct {
	Size    int64  `json:"size,omitempty"`
	Mode    uint32 `json:"mode,omitempty"`
	IsDir   bool   `json:"is_dir,omitempty"`
	ModTime int64  `json:"mod_time_unix,omitempty"`
}

// Info describes a running VM.
type Info struct {
	Name       string `json:"name"`
	PID        int    `json:"pid"`
	QEMUPID    int    `json:"qemu_pid"`
	SessionDir string `json:"session_dir"`
	Accel      string `json:"accel"`
	// AccelReason says why the VM runs under Accel (the KVM proof's
	// verdict, or what forced it).
	AccelReason string `json:"accel_reason,omitempty"`
	// Start says how the VM started: "restored" (resumed from the saved
	// boot of its configuration), "booted_saved" (the first of its
	// configuration: a boot was saved, then the VM resumed from it) or
	// "booted".
	Start       string           `json:"start,omitempty"`
	BootTimings map[string]int64 `json:"boot_timings_ms,omitempty"`
	State       string           `json:"state"`
}

// Error is the body of a non-2xx response.
type Error struct {
	Error string `json:"error"`
}

// ProcessClient talks to one per-VM process over its Unix socket.
type ProcessClient struct {
	http *http.Client
}

// NewProcessClient returns a client for the socket at path.
func NewProcessClient(path string) *ProcessClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}
	return &ProcessClient{http: &http.Client{Transport: tr}}
}

func (c *ProcessClient) post(ctx context.Context, route string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	resp, err := c.do(ctx, http.MethodPost, route, nil, "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decode(route, resp, out)
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
		return nil, fmt.Errorf("%s: %w", route, err)
	}
	return resp, nil
}

func decode(route string, resp *http.Response, out any) error {
	if resp.StatusCode/100 != 2 {
		var e Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s: %s", route, e.Error)
		}
		return fmt.Errorf("%s: HTTP %d: %s", route, resp.StatusCode, bytes.TrimSpace(b))
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
func (c *ProcessClient) Info(ctx context.Context) (*Info, error) {
	resp, err := c.do(ctx, http.MethodGet, "/info", nil, "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var info Info
	return &info, decode("/info", resp, &info)
}

// WaitReady polls /info until the process answers or ctx ends.
func (c *ProcessClient) WaitReady(ctx context.Context) (*Info, error) {
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

// ReadyLine is what `capsem process --ready-fd N` writes on N once its API
// accepts connections.
const ReadyLine = "ready\n"

// StartWithReadyPipe starts cmd, a `capsem process` command line, with a
// readiness pipe: the write end goes to the child as an extra file named by
// an added --ready-fd flag. The returned read end is for WaitReadyPipe.
func StartWithReadyPipe(cmd *exec.Cmd) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the readiness pipe: %w", err)
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, w)
	// ExtraFiles[i] is the child's descriptor 3+i.
	cmd.Args = append(cmd.Args, "--ready-fd", strconv.Itoa(2+len(cmd.ExtraFiles)))
	err = cmd.Start()
	w.Close() // the child holds its own copy
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// WaitReadyPipe waits for the process's readiness line on ready (the read
// end of the pipe whose write end the process got as --ready-fd), then
// returns its Info. No polling: it returns as soon as the API listens, and
// fails as soon as the process dies first (the pipe closes). It closes
// ready.
func (c *ProcessClient) WaitReadyPipe(ctx context.Context, ready *os.File) (*Info, error) {
	defer ready.Close()
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, len(ReadyLine))
		_, err := io.ReadFull(ready, buf)
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			err = errors.New("the VM process ended before its API was ready")
		case err == nil && string(buf) != ReadyLine:
			err = fmt.Errorf("the VM process wrote %q on its readiness pipe, want %q", buf, ReadyLine)
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			return nil, err
		}
	case <-ctx.Done():
		ready.Close() // ends the read
		return nil, fmt.Errorf("waiting for the VM process: %w", ctx.Err())
	}
	return c.Info(ctx)
}

// Exec runs a command, streaming output to stdout and stderr, and returns
// the final event.
func (c *ProcessClient) Exec(ctx context.Context, r *ExecRequest, stdout, stderr io.Writer) (*ExecEvent, error) {
	body, _ := json.Marshal(r)
	resp, err := c.do(ctx, http.MethodPost, "/exec", nil, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, decode("/exec", resp, nil)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("/exec: bad event: %w", err)
		}
		switch {
		case ev.Error != "":
			return &ev, errors.New(ev.Error)
		case ev.Done:
			return &ev, nil
		case ev.Stream == "stdout" && stdout != nil:
			stdout.Write(ev.Data)
		case ev.Stream == "stderr" && stderr != nil:
			stderr.Write(ev.Data)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/exec: %w", err)
	}
	return nil, errors.New("/exec: the VM process ended the stream without a result")
}

// ReadFile reads a guest file (GET /files/content, raw body).
func (c *ProcessClient) ReadFile(ctx context.Context, path string) ([]byte, error) {
	const route = "/files/content"
	resp, err := c.do(ctx, http.MethodGet, route, url.Values{"path": {path}}, "", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, decode(route, resp, nil)
	}
	if resp.ContentLength < 0 || resp.ContentLength > MaxFileBytes {
		return nil, fmt.Errorf("%s: answer of length %d, want 0..%d", route, resp.ContentLength, MaxFileBytes)
	}
	data := make([]byte, resp.ContentLength)
	if _, err := io.ReadFull(resp.Body, data); err != nil {
		return nil, fmt.Errorf("%s: reading %s: %w", route, path, err)
	}
	return data, nil
}

// WriteFile writes a guest file (PUT /files/content, raw body), creating
// missing parent directories; mode 0 means 0644.
func (c *ProcessClient) WriteFile(ctx context.Context, path string, data []byte, mode uint32) error {
	const route = "/files/content"
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	resp, err := c.do(ctx, http.MethodPut, route, q, "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decode(route, resp, nil)
}

// Stop shuts the VM down (cleanly if the guest answers).
func (c *ProcessClient) Stop(ctx context.Context) error {
	return c.post(ctx, "/stop", struct{}{}, nil)
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
	resp, err := c.do(ctx, http.MethodGet, "/logs", q, "", nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", decode("/logs", resp, nil)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 2<<20))
	return string(b), err
}
