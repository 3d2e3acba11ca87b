package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Verb is one JSON verb of capsem's local APIs (the service's and a per-VM
// process's), declared once: its method, its route (naming at most one
// parameter, {vm} or {image}), the Go types of its request body (In; None:
// no body) and of its answer (Out; None: 204, no body). A server serves it
// with Handle and a handler of exactly those types, a client calls it with
// them (apiclient.Call, apiclient.CallProcess), so the two sides cannot
// disagree on a verb's wire form, and a new verb is a declaration here, one
// handler and one call. Failures are Error bodies.
//
// Verbs that stream (exec, run and create streams, file content, the
// terminal) or take a query (logs, timeline, triage, panics) are routes of
// their own, with their own readers.
type Verb[In, Out any] struct {
	Method string
	Route  string
	// Status is the answer's status on success: 0 means 200, or 204 when
	// Out is None.
	Status int
	// MaxBody bounds the request body; 0: MaxRequestBody.
	MaxBody int64
	// OptionalBody takes no body as a zero In.
	OptionalBody bool
	// MaxAnswer bounds what a client reads of the answer; 0: no bound.
	MaxAnswer int64
}

// None is the In of a verb without a body, the Out of one without an
// answer.
type None struct{}

// MaxRequestBody bounds a verb's request body unless it says otherwise.
const MaxRequestBody = 1 << 20

// maxWriteFileBody is WriteFileRequest's bound: a file of MaxJSONFileBytes
// in base64, and room for the rest.
const maxWriteFileBody = MaxJSONFileBytes/3*4 + 1<<20

// Param is the route's parameter name ("vm", "image"), "" when it has none.
func (v Verb[In, Out]) Param() string {
	i := strings.IndexByte(v.Route, '{')
	j := strings.IndexByte(v.Route, '}')
	if i < 0 || j < i {
		return ""
	}
	return v.Route[i+1 : j]
}

// Path is the route with its parameter set to ref.
func (v Verb[In, Out]) Path(ref string) string {
	p := v.Param()
	if p == "" {
		return v.Route
	}
	return strings.Replace(v.Route, "{"+p+"}", url.PathEscape(ref), 1)
}

// Pattern is the route as an http.ServeMux pattern.
func (v Verb[In, Out]) Pattern() string { return v.Method + " " + v.Route }

// Limit is the request body's bound.
func (v Verb[In, Out]) Limit() int64 {
	if v.MaxBody > 0 {
		return v.MaxBody
	}
	return MaxRequestBody
}

// HasBody says whether the verb sends a request body.
func (v Verb[In, Out]) HasBody() bool {
	var in any = new(In)
	_, none := in.(*None)
	return !none
}

// HasAnswer says whether the verb's answer has a body.
func (v Verb[In, Out]) HasAnswer() bool {
	var out any = new(Out)
	_, none := out.(*None)
	return !none
}

// SuccessStatus is the status of a successful answer.
func (v Verb[In, Out]) SuccessStatus() int {
	switch {
	case v.Status != 0:
		return v.Status
	case v.HasAnswer():
		return http.StatusOK
	default:
		return http.StatusNoContent
	}
}

// Handle registers verb's handler on mux: the body decoded as In
// (DecodeBody; a bad one goes to fail as a *BodyError), the route's
// parameter as ref, and the answer as Out with the verb's status, or the
// handler's error through fail, which writes it with the server's own
// status and code.
func Handle[In, Out any](mux *http.ServeMux, verb Verb[In, Out], handle func(ctx context.Context, ref string, in In) (Out, error),
	fail func(w http.ResponseWriter, err error)) {
	param := verb.Param()
	mux.HandleFunc(verb.Pattern(), func(w http.ResponseWriter, r *http.Request) {
		var in In
		if verb.HasBody() && !(verb.OptionalBody && r.ContentLength == 0) {
			if err := DecodeBody(w, r, &in, verb.Limit()); err != nil {
				fail(w, err)
				return
			}
		}
		ref := ""
		if param != "" {
			ref = r.PathValue(param)
		}
		out, err := handle(r.Context(), ref, in)
		switch {
		case err != nil:
			fail(w, err)
		case verb.HasAnswer():
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(verb.SuccessStatus())
			json.NewEncoder(w).Encode(out)
		default:
			w.WriteHeader(verb.SuccessStatus())
		}
	})
}

// BodyError is a request body a server could not take: Status is 400
// (not the JSON wanted) or 413 (over its bound).
type BodyError struct {
	Status int
	Err    error
}

func (e *BodyError) Error() string { return e.Err.Error() }
func (e *BodyError) Unwrap() error { return e.Err }

// DecodeBody decodes r's JSON body into into: at most limit bytes, unknown
// fields and trailing data refused, every failure a *BodyError.
func DecodeBody(w http.ResponseWriter, r *http.Request, into any, limit int64) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	err := dec.Decode(into)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return nil
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return &BodyError{Status: http.StatusRequestEntityTooLarge, Err: fmt.Errorf("request body over %d bytes", tooLarge.Limit)}
	}
	return &BodyError{Status: http.StatusBadRequest, Err: fmt.Errorf("invalid request body: %w", err)}
}

// The service API's JSON verbs.
var (
	VersionVerb     = Verb[None, Version]{Method: http.MethodGet, Route: RouteVersion}
	ListVerb        = Verb[None, []VM]{Method: http.MethodGet, Route: RouteVMs}
	CreateVerb      = Verb[CreateRequest, VM]{Method: http.MethodPost, Route: RouteVMs, Status: http.StatusCreated}
	RunVerb         = Verb[RunRequest, ExecResult]{Method: http.MethodPost, Route: RouteRun}
	PurgeVerb       = Verb[PurgeRequest, PurgeResult]{Method: http.MethodPost, Route: RoutePurge}
	ServiceStopVerb = Verb[None, None]{Method: http.MethodPost, Route: RouteServiceStop}
	InfoVerb        = Verb[None, VM]{Method: http.MethodGet, Route: RouteVM}
	DeleteVerb      = Verb[None, None]{Method: http.MethodDelete, Route: RouteVM}
	ExecVerb        = Verb[ExecRequest, ExecResult]{Method: http.MethodPost, Route: RouteVMExec}
	StopVerb        = Verb[None, VM]{Method: http.MethodPost, Route: RouteVMStop}
	// ResumeVerb's body is optional: none is a plain resume.
	ResumeVerb      = Verb[ResumeRequest, VM]{Method: http.MethodPost, Route: RouteVMResume, OptionalBody: true}
	SuspendVerb     = Verb[None, VM]{Method: http.MethodPost, Route: RouteVMSuspend}
	PersistVerb     = Verb[PersistRequest, VM]{Method: http.MethodPost, Route: RouteVMPersist}
	ForkVerb        = Verb[ForkRequest, Image]{Method: http.MethodPost, Route: RouteVMFork}
	ImagesVerb      = Verb[None, []Image]{Method: http.MethodGet, Route: RouteImages}
	ImageVerb       = Verb[None, Image]{Method: http.MethodGet, Route: RouteImage}
	DeleteImageVerb = Verb[None, None]{Method: http.MethodDelete, Route: RouteImage}
	PublishVerb     = Verb[PortMapping, PortMapping]{Method: http.MethodPost, Route: RouteVMPorts}
	ReadFileVerb    = Verb[ReadFileRequest, ReadFileResult]{Method: http.MethodPost, Route: RouteVMReadFile}
	WriteFileVerb   = Verb[WriteFileRequest, None]{Method: http.MethodPost, Route: RouteVMWriteFile, MaxBody: maxWriteFileBody}
	SchemaVerb      = Verb[None, SchemaResult]{Method: http.MethodGet, Route: RouteSchema}
	VMSchemaVerb    = Verb[None, SchemaResult]{Method: http.MethodGet, Route: RouteVMSchema}
	// InspectVerb's answer: its bound, and room for the column names and
	// the frame around the rows.
	InspectVerb    = Verb[InspectRequest, InspectResult]{Method: http.MethodPost, Route: RouteVMInspect, MaxAnswer: MaxInspectAnswerBytes + 1<<20}
	MCPVerb        = Verb[MCPCallRequest, MCPCallResult]{Method: http.MethodPost, Route: RouteVMMCP, MaxBody: MaxMCPCallBytes, MaxAnswer: MaxMCPCallBytes + 1<<20}
	MCPServersVerb = Verb[None, MCPServersResult]{Method: http.MethodGet, Route: RouteVMMCPServers}
)

// The JSON verbs of a per-VM process's API (routes without a parameter:
// the process is the VM's).
var (
	ProcessInfoVerb = Verb[None, Info]{Method: http.MethodGet, Route: RouteInfo}
	// ProcessStopVerb answers before the VM stops.
	ProcessStopVerb       = Verb[None, None]{Method: http.MethodPost, Route: RouteStop}
	ProcessPortsVerb      = Verb[PortMapping, PortMapping]{Method: http.MethodPost, Route: RoutePorts}
	ProcessMCPVerb        = Verb[MCPCallRequest, MCPCallResult]{Method: http.MethodPost, Route: RouteMCP, MaxBody: MaxMCPCallBytes, MaxAnswer: MaxMCPCallBytes + 1<<20}
	ProcessMCPServersVerb = Verb[None, MCPServersResult]{Method: http.MethodGet, Route: RouteMCPServers}
	ProcessForkVerb       = Verb[ForkCopyRequest, ForkCopy]{Method: http.MethodPost, Route: RouteFork}
	// ProcessSuspendVerb answers before the VM stops.
	ProcessSuspendVerb = Verb[None, SuspendResult]{Method: http.MethodPost, Route: RouteSuspend}
)
