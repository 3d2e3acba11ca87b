package api

import (
	"net/http"
	"net/url"
	"strings"
)

// Verb is one JSON verb of the service API, declared once: its method, its
// route (naming at most one parameter, {vm} or {image}), the Go types of its
// request body (In; None: no body) and of its answer (Out; None: 204, no
// body). The service serves a verb with a handler of exactly those types
// and the client calls it with them (apiclient.Call), so the two sides
// cannot disagree on a verb's wire form, and a new verb is a declaration
// here, one handler and one call. Failures are Error bodies on both.
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
