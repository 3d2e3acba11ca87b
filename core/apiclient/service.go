package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/logs"
	"github.com/capsem/capsem/core/unixsock"
)

// StatusError is a refusal from the service or a per-VM process: its HTTP
// status, its code (api.Error.Code) and message.
type StatusError struct {
	Status  int
	Code    string
	Message string
	// Err is the failure behind it, when the client has one (a streamed
	// read cut after its status: errors.Is finds api.ErrFileCut).
	Err error
}

func (e *StatusError) Unwrap() error { return e.Err }

// Error is the message, with what its code tells a person to do.
func (e *StatusError) Error() string {
	if hint := codeHints[e.Code]; hint != "" && !strings.Contains(e.Message, hint) {
		return e.Message + " (" + hint + ")"
	}
	return e.Message
}

// codeHints say what a refusal's code means for the caller, where the
// message alone could leave it unsure whether to retry or fix something.
var codeHints = map[string]string{
	api.CodeInterrupted: "the call was cut off by the VM's stop or removal, not refused: run it again once the VM runs",
	api.CodeUnavailable: "the VM cannot take calls now; capsem logs shows its last output",
	api.CodeNoSpace:     "the guest's file system is full",
}

// streamFailure is err, from a stream whose final event ev failed, as the
// StatusError ev's code makes it: the stream's 200 went before the
// failure, which says its kind in the event. An event without a code (a
// sender from before codes) stays the plain error.
func streamFailure(ev *api.ExecEvent, err error) error {
	if err == nil || ev == nil || ev.Error == "" || ev.Code == "" {
		return err
	}
	return &StatusError{Status: api.StatusOfCode(ev.Code), Code: ev.Code, Message: ev.Error}
}

// readFailure is err, a streamed read that did not end whole (msg says
// which), as a StatusError when the sender gave the failure's code in
// the trailers; else as msg wrapping err.
func readFailure(resp *http.Response, msg string, err error) error {
	code := resp.Trailer.Get(api.TrailerErrorCode)
	if code == "" {
		return fmt.Errorf("%s: %w", msg, err)
	}
	return &StatusError{Status: api.StatusOfCode(code), Code: code, Message: fmt.Sprintf("%s: %v", msg, err), Err: err}
}

// ServiceClient talks to the capsem service over its Unix socket.
type ServiceClient struct {
	http *http.Client
}

// NewServiceClient returns a client for the socket at path. When start is
// not nil, a connection that finds no service calls it (to start one and
// wait until it answers) and dials once more: the client then works
// whether or not a service ran before, or survived, its last call. It
// talks only to a service of this user's (unixsock.Dial): a socket that
// may be another user's is refused before anything is sent, and no
// service is started in its place.
func NewServiceClient(path string, start func(ctx context.Context) error) *ServiceClient {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		c, err := unixsock.Dial(ctx, path)
		if err == nil || start == nil || unixsock.IsNotPrivate(err) || ctx.Err() != nil {
			return c, err
		}
		if serr := start(ctx); serr != nil {
			return nil, fmt.Errorf("no capsem service answered on %s (%v), and starting one failed: %w", path, err, serr)
		}
		return unixsock.Dial(ctx, path)
	}}
	return &ServiceClient{http: &http.Client{Transport: tr}}
}

// transportError is err of a request that got no answer; a refusal to
// connect goes without the method and URL the HTTP client puts before it
// (the URL is not the socket, which the refusal names).
func transportError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && unixsock.IsNotPrivate(ue.Err) {
		return ue.Err
	}
	return err
}

// Call sends in to verb, its route's parameter set to ref (a VM's name or
// id, an image's name; "" for a verb without one), and returns the answer.
func Call[In, Out any](ctx context.Context, c *ServiceClient, verb api.Verb[In, Out], ref string, in In) (Out, error) {
	var out Out
	var body, answer any
	if verb.HasBody() {
		body = in
	}
	if verb.HasAnswer() {
		answer = &out
	}
	limit := int64(-1)
	if verb.MaxAnswer > 0 {
		limit = verb.MaxAnswer
	}
	return out, c.callBounded(ctx, verb.Method, verb.Path(ref), nil, body, answer, limit)
}

// call sends in (nil: no body) to route and decodes the answer into out
// (nil: none expected).
func (c *ServiceClient) call(ctx context.Context, method, route string, query url.Values, in, out any) error {
	return c.callBounded(ctx, method, route, query, in, out, -1)
}

// callBounded is call reading at most limit bytes of the answer (-1: no
// bound); a longer one is an error, read no further.
func (c *ServiceClient) callBounded(ctx context.Context, method, route string, query url.Values, in, out any, limit int64) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	target := "http://capsem" + route
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("the capsem service: %w", transportError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return statusError(route, resp)
	}
	if out == nil {
		return nil
	}
	var answer io.Reader = resp.Body
	if limit >= 0 {
		answer = &boundedReader{r: resp.Body, left: limit}
	}
	if err := json.NewDecoder(answer).Decode(out); err != nil {
		return fmt.Errorf("%s: decoding the answer: %w", route, err)
	}
	return nil
}

// ErrAnswerTooLarge: the service's answer is longer than the client reads.
var ErrAnswerTooLarge = errors.New("the service's answer is over the size this client reads")

// boundedReader reads at most left bytes of r, then fails.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, ErrAnswerTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// statusError is the refusal a non-2xx answer carries.
func statusError(route string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		code := e.Code
		if code == "" { // a service from before codes
			code = api.CodeOf(resp.StatusCode)
		}
		return &StatusError{Status: resp.StatusCode, Code: code, Message: e.Error}
	}
	return &StatusError{Status: resp.StatusCode, Code: api.CodeOf(resp.StatusCode),
		Message: fmt.Sprintf("%s: HTTP %d: %s", route, resp.StatusCode, bytes.TrimSpace(b))}
}

func logQuery(tail int, grep string) url.Values {
	q := url.Values{}
	if tail > 0 {
		q.Set("tail", strconv.Itoa(tail))
	}
	if grep != "" {
		q.Set("grep", grep)
	}
	return q
}

// Version is the service's build.
func (c *ServiceClient) Version(ctx context.Context) (api.Version, error) {
	return Call(ctx, c, api.VersionVerb, "", api.None{})
}

// List returns every VM.
func (c *ServiceClient) List(ctx context.Context) ([]api.VM, error) {
	return Call(ctx, c, api.ListVerb, "", api.None{})
}

// Create boots a VM.
func (c *ServiceClient) Create(ctx context.Context, req api.CreateRequest) (api.VM, error) {
	return Call(ctx, c, api.CreateVerb, "", req)
}

// Run runs one command in a fresh ephemeral VM.
func (c *ServiceClient) Run(ctx context.Context, req api.RunRequest) (api.ExecResult, error) {
	return Call(ctx, c, api.RunVerb, "", req)
}

// Info describes one VM.
func (c *ServiceClient) Info(ctx context.Context, vm string) (api.VM, error) {
	return Call(ctx, c, api.InfoVerb, vm, api.None{})
}

// Exec runs a command in a VM.
func (c *ServiceClient) Exec(ctx context.Context, vm string, req api.ExecRequest) (api.ExecResult, error) {
	return Call(ctx, c, api.ExecVerb, vm, req)
}

// ExecStream runs a command in a VM, writing its output to stdout and
// stderr as it comes, and returns the final event.
func (c *ServiceClient) ExecStream(ctx context.Context, vm string, req api.ExecRequest, stdout, stderr io.Writer) (*api.ExecEvent, error) {
	var ev *api.ExecEvent
	err := c.stream(ctx, api.VMPath(api.RouteVMExecLive, vm), req, func(body io.Reader) (err error) {
		ev, err = api.ReadExecStream(body, stdout, stderr)
		return streamFailure(ev, err)
	})
	return ev, err
}

// RunStream runs one command in a fresh ephemeral VM, telling events the
// stages of its start and the VM once it is ready, writing the command's
// output to stdout and stderr as it comes, and returns the final event,
// sent once the VM is removed. Cancelling ctx kills the command and
// removes the VM.
func (c *ServiceClient) RunStream(ctx context.Context, req api.RunRequest, events api.RunEvents, stdout, stderr io.Writer) (*api.ExecEvent, error) {
	var ev *api.ExecEvent
	answered := false
	err := c.stream(ctx, api.RouteRunLive, req, func(body io.Reader) (err error) {
		answered = true
		ev, err = api.ReadRunStream(body, events, stdout, stderr)
		return streamFailure(ev, err)
	})
	// Only the route's own 404 says the service is older: a stream's
	// failure (its VM gone meanwhile) must not run the command again.
	if !answered && olderService(err) {
		// A service from before the run stream: the output comes at the
		// end, and no stage or ready VM is told.
		r, err := c.Run(ctx, req)
		if err != nil {
			return nil, err
		}
		io.WriteString(stdout, r.Stdout)
		io.WriteString(stderr, r.Stderr)
		return &api.ExecEvent{Done: true, ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut,
			StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated, DurationMS: r.DurationMS}, nil
	}
	return ev, err
}

// olderService says err is the answer of a service that does not have
// the route asked for: one from before it (a per-user service may run an
// older build than its clients until it is restarted).
func olderService(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && (se.Status == http.StatusNotFound || se.Status == http.StatusMethodNotAllowed)
}

// CreateStream is Create, telling stage (when not nil) each stage of the
// VM's start as it comes.
func (c *ServiceClient) CreateStream(ctx context.Context, req api.CreateRequest, stage func(string)) (api.VM, error) {
	var vm api.VM
	err := c.stream(ctx, api.RouteVMsLive, req, func(body io.Reader) (err error) {
		vm, err = api.ReadCreateStream(body, stage)
		return err
	})
	if olderService(err) { // no stages from it
		return c.Create(ctx, req)
	}
	return vm, err
}

// stream posts in to route and reads the stream it answers with read.
func (c *ServiceClient) stream(ctx context.Context, route string, in any, read func(io.Reader) error) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://capsem"+route, bytes.NewReader(b))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return fmt.Errorf("the capsem service: %w", transportError(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return statusError(route, resp)
	}
	return read(resp.Body)
}

// Stop stops a VM.
func (c *ServiceClient) Stop(ctx context.Context, vm string) (api.VM, error) {
	return Call(ctx, c, api.StopVerb, vm, api.None{})
}

// Resume starts a stopped, defunct or suspended persistent VM again
// (req.Boot: a suspended one's state discarded, its disk booted).
func (c *ServiceClient) Resume(ctx context.Context, vm string, req api.ResumeRequest) (api.VM, error) {
	return Call(ctx, c, api.ResumeVerb, vm, req)
}

// Suspend saves a running persistent VM's whole state and stops it.
func (c *ServiceClient) Suspend(ctx context.Context, vm string) (api.VM, error) {
	return Call(ctx, c, api.SuspendVerb, vm, api.None{})
}

// Publish publishes one more port of a running VM, for as long as it
// runs, and returns it as published.
func (c *ServiceClient) Publish(ctx context.Context, vm string, m api.PortMapping) (api.PortMapping, error) {
	return Call(ctx, c, api.PublishVerb, vm, m)
}

// Persist names an ephemeral VM.
func (c *ServiceClient) Persist(ctx context.Context, vm, name string) (api.VM, error) {
	return Call(ctx, c, api.PersistVerb, vm, api.PersistRequest{Name: name})
}

// Delete destroys a VM and its state.
func (c *ServiceClient) Delete(ctx context.Context, vm string) error {
	_, err := Call(ctx, c, api.DeleteVerb, vm, api.None{})
	return err
}

// Purge removes every ephemeral VM (all: every VM).
func (c *ServiceClient) Purge(ctx context.Context, all bool) (api.PurgeResult, error) {
	return Call(ctx, c, api.PurgeVerb, "", api.PurgeRequest{All: all})
}

// ReadFile reads a guest file.
func (c *ServiceClient) ReadFile(ctx context.Context, vm string, req api.ReadFileRequest) (api.ReadFileResult, error) {
	return Call(ctx, c, api.ReadFileVerb, vm, req)
}

// ReadFileTo copies a guest file of any size into w as it streams
// (files/content; follow reads through a final symbolic link). A read that
// does not end whole is an error (api.ErrFileCut) even after w has had part
// of it. It returns the byte count and the SHA-256 (hex).
func (c *ServiceClient) ReadFileTo(ctx context.Context, vm, path string, follow bool, w io.Writer) (int64, string, error) {
	route := api.VMPath(api.RouteVMFileContent, vm)
	q := url.Values{"path": {path}, "follow": {"0"}}
	if follow {
		q.Set("follow", "1")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://capsem"+route+"?"+q.Encode(), nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("the capsem service: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return 0, "", statusError(route, resp)
	}
	n, digest, err := api.ReadFileStream(resp, w)
	if err != nil {
		return n, "", readFailure(resp, fmt.Sprintf("reading %s from VM %s", path, vm), err)
	}
	return n, digest, nil
}

// WriteFileFrom writes a guest file of any size from r as it streams
// (files/content), creating missing parent directories; mode 0 keeps an
// existing file's mode (0644 for a new one). The guest replaces the file
// only once all of r has arrived.
func (c *ServiceClient) WriteFileFrom(ctx context.Context, vm, path string, mode uint32, r io.Reader) error {
	route := api.VMPath(api.RouteVMFileContent, vm)
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://capsem"+route+"?"+q.Encode(), r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("the capsem service: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return statusError(route, resp)
	}
	return nil
}

// WriteFile writes a guest file.
func (c *ServiceClient) WriteFile(ctx context.Context, vm string, req api.WriteFileRequest) error {
	_, err := Call(ctx, c, api.WriteFileVerb, vm, req)
	return err
}

// Logs returns the tail of a VM's logs.
func (c *ServiceClient) Logs(ctx context.Context, vm string, tail int, grep string) (api.LogsResult, error) {
	var v api.LogsResult
	return v, c.call(ctx, http.MethodGet, api.VMPath(api.RouteVMLogs, vm), logQuery(tail, grep), nil, &v)
}

// ServiceLogs returns the tail of the service's log.
func (c *ServiceClient) ServiceLogs(ctx context.Context, tail int, grep string) (api.LogsResult, error) {
	var v api.LogsResult
	return v, c.call(ctx, http.MethodGet, api.RouteServiceLogs, logQuery(tail, grep), nil, &v)
}

// Schema returns a VM's session ledger schema; with vm "", the schema of
// a new VM's.
func (c *ServiceClient) Schema(ctx context.Context, vm string) (api.SchemaResult, error) {
	if vm == "" {
		return Call(ctx, c, api.SchemaVerb, "", api.None{})
	}
	return Call(ctx, c, api.VMSchemaVerb, vm, api.None{})
}

// Inspect runs read-only SQL on a VM's session ledger. It reads a bounded
// answer (ErrAnswerTooLarge past it), whatever the service sends.
func (c *ServiceClient) Inspect(ctx context.Context, vm string, req api.InspectRequest) (api.InspectResult, error) {
	return Call(ctx, c, api.InspectVerb, vm, req)
}

// Timeline returns a VM's ledger as one stream of events in time order.
func (c *ServiceClient) Timeline(ctx context.Context, vm string, req api.TimelineRequest) (api.TimelineResult, error) {
	var v api.TimelineResult
	return v, c.callBounded(ctx, http.MethodGet, api.VMPath(api.RouteVMTimeline, vm), req.Query(), nil, &v, maxTimelineAnswer)
}

// Panics lists the Go panics and fatal errors in capsem's logs on this
// host, the latest first.
func (c *ServiceClient) Panics(ctx context.Context, req api.PanicsRequest) (api.PanicsResult, error) {
	var v api.PanicsResult
	return v, c.callBounded(ctx, http.MethodGet, api.RoutePanics, req.Query(), nil, &v, maxPanicsAnswer)
}

// Triage ranks what went wrong lately on this host (and in one VM).
func (c *ServiceClient) Triage(ctx context.Context, req api.TriageRequest) (api.TriageResult, error) {
	var v api.TriageResult
	return v, c.callBounded(ctx, http.MethodGet, api.RouteTriage, req.Query(), nil, &v, api.MaxTriageFindings*8192+4096)
}

// maxPanicsAnswer bounds a panics answer: its reports at their longest.
const maxPanicsAnswer = api.MaxPanics * (logs.MaxPanicMessage + logs.MaxPanicFrames*1024 + 4096)

// MCP sends one MCP request through a running VM's gateway as the host.
func (c *ServiceClient) MCP(ctx context.Context, vm string, req api.MCPCallRequest) (api.MCPCallResult, error) {
	return Call(ctx, c, api.MCPVerb, vm, req)
}

// MCPServers lists a running VM's gateway's servers.
func (c *ServiceClient) MCPServers(ctx context.Context, vm string) (api.MCPServersResult, error) {
	return Call(ctx, c, api.MCPServersVerb, vm, api.None{})
}

// maxTimelineAnswer bounds a timeline answer: its events at their longest,
// with room for the JSON around each.
const maxTimelineAnswer = api.MaxTimelineEvents * (4*api.MaxTimelineSummary + 512)

// StopService asks the service to exit (its VMs keep running).
func (c *ServiceClient) StopService(ctx context.Context) error {
	_, err := Call(ctx, c, api.ServiceStopVerb, "", api.None{})
	return err
}

// Fork makes the image req.Name of a running or stopped VM.
func (c *ServiceClient) Fork(ctx context.Context, vm string, req api.ForkRequest) (api.Image, error) {
	return Call(ctx, c, api.ForkVerb, vm, req)
}

// Images lists the images.
func (c *ServiceClient) Images(ctx context.Context) ([]api.Image, error) {
	return Call(ctx, c, api.ImagesVerb, "", api.None{})
}

// Image describes one image.
func (c *ServiceClient) Image(ctx context.Context, name string) (api.Image, error) {
	return Call(ctx, c, api.ImageVerb, name, api.None{})
}

// DeleteImage deletes an image no VM uses.
func (c *ServiceClient) DeleteImage(ctx context.Context, name string) error {
	_, err := Call(ctx, c, api.DeleteImageVerb, name, api.None{})
	return err
}
