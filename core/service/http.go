package service

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/capsem/capsem/core/api"
	"github.com/capsem/capsem/core/httpserve"
)

// maxRequestBody bounds the JSON bodies of the routes that are not verbs.
const maxRequestBody = api.MaxRequestBody

// Handler serves the service API. stop, when not nil, is what
// POST /v1/service/stop calls (after the answer is written).
func (s *Service) Handler(stop func()) http.Handler {
	mux := http.NewServeMux()
	s.serveVerbs(mux)
	mux.HandleFunc("POST "+api.RouteVMsLive, func(w http.ResponseWriter, r *http.Request) {
		var req api.CreateRequest
		if !decode(w, r, &req, maxRequestBody) {
			return
		}
		// As the run stream: the stream starts with the first stage.
		var stream *api.ExecStream
		vm, err := s.CreateStream(r.Context(), req, func(stage string) {
			if stream == nil {
				stream = api.NewExecStream(w)
			}
			stream.Stage(stage)
		})
		switch {
		case stream == nil && err != nil:
			writeError(w, err)
		case stream == nil:
			writeJSON(w, http.StatusCreated, api.ExecEvent{VM: &vm})
		case err != nil:
			stream.Final(failedEvent(err))
		default:
			stream.Ready(vm)
		}
	})
	mux.HandleFunc("POST "+api.RouteRunLive, func(w http.ResponseWriter, r *http.Request) {
		var req api.RunRequest
		if !decode(w, r, &req, maxRequestBody) {
			return
		}
		// The stream starts with the first stage of the VM's start: a
		// refusal before that (bad input, a name taken, no memory, a
		// process that could not start) keeps its own status.
		var stream *api.ExecStream
		begin := func() {
			if stream == nil {
				stream = api.NewExecStream(w)
			}
		}
		ev, err := s.RunStream(r.Context(), req, func(stage string) {
			begin()
			stream.Stage(stage)
		}, func(vm api.VM) (io.Writer, io.Writer) {
			begin()
			stream.Ready(vm)
			return stream.Stdout(), stream.Stderr()
		})
		switch {
		case stream == nil:
			writeError(w, err)
		case err != nil:
			stream.Final(failedEvent(err))
		default:
			stream.Final(*ev)
		}
	})
	mux.HandleFunc("GET "+api.RouteServiceLogs, func(w http.ResponseWriter, r *http.Request) {
		if tail, grep, ok := logQuery(w, r); ok {
			out, err := s.ServiceLogs(tail, grep)
			reply(w, http.StatusOK, out, err)
		}
	})
	// After its answer: the service ends.
	mux.HandleFunc(api.ServiceStopVerb.Pattern(), func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if stop != nil {
			go stop()
		}
	})
	mux.HandleFunc("POST "+api.RouteVMExecLive, func(w http.ResponseWriter, r *http.Request) {
		var req api.ExecRequest
		if !decode(w, r, &req, maxRequestBody) {
			return
		}
		run, err := s.ExecStream(r.PathValue("vm"), req)
		if err != nil {
			writeError(w, err)
			return
		}
		stream := api.NewExecStream(w)
		ev, err := run(r.Context(), stream.Stdout(), stream.Stderr())
		if err != nil {
			stream.Final(failedEvent(err))
			return
		}
		stream.Final(*ev)
	})
	mux.HandleFunc("POST "+api.RouteVMTerminal, s.handleTerminal)
	mux.HandleFunc("GET "+api.RouteVMFileContent, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		follow, max, err := fileReadQuery(q)
		body := api.NewFileStream(w)
		if err == nil {
			err = s.ReadFileTo(r.Context(), r.PathValue("vm"), q.Get("path"), follow, max, body)
		}
		if err != nil {
			body.Fail(StatusOf(err), CodeOf(err), err)
			return
		}
		body.Finish()
	})
	mux.HandleFunc("PUT "+api.RouteVMFileContent, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var mode uint64
		if m := q.Get("mode"); m != "" {
			var err error
			if mode, err = strconv.ParseUint(m, 8, 32); err != nil {
				writeError(w, badRequest("query parameter mode=%q: want octal permission bits such as 644", m))
				return
			}
		}
		httpserve.StreamBody(r) // the guest's disk sets the pace, not the client
		abandon := func() { http.NewResponseController(w).SetReadDeadline(time.Now()) }
		// Without its Close: the transport to the VM's process closes the
		// body it was given when the process answers early, and a closed
		// request body makes this server drop the connection under the
		// client before it reads the answer (see Linger).
		body := struct{ io.Reader }{r.Body}
		if err := s.WriteFileFrom(r.Context(), r.PathValue("vm"), q.Get("path"), uint32(mode), body, abandon); err != nil {
			writeError(w, err)
			httpserve.Linger(w, r)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+api.RouteVMLogs, func(w http.ResponseWriter, r *http.Request) {
		if tail, grep, ok := logQuery(w, r); ok {
			out, err := s.Logs(r.PathValue("vm"), tail, grep)
			reply(w, http.StatusOK, out, err)
		}
	})
	mux.HandleFunc("GET "+api.RouteVMTimeline, func(w http.ResponseWriter, r *http.Request) {
		req, err := api.ParseTimelineQuery(r.URL.Query(), time.Now())
		if err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
		out, err := s.Timeline(r.Context(), r.PathValue("vm"), req)
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("GET "+api.RouteTriage, func(w http.ResponseWriter, r *http.Request) {
		req, err := api.ParseTriageQuery(r.URL.Query(), time.Now())
		if err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
		out, err := s.Triage(r.Context(), req)
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("GET "+api.RoutePanics, func(w http.ResponseWriter, r *http.Request) {
		req, err := api.ParsePanicsQuery(r.URL.Query(), time.Now())
		if err != nil {
			writeError(w, badRequest("%v", err))
			return
		}
		out, err := s.Panics(r.Context(), req)
		reply(w, http.StatusOK, out, err)
	})
	return mux
}

// serveVerbs serves the service's JSON verbs (api.Verb), each by the
// method that does it.
func (s *Service) serveVerbs(mux *http.ServeMux) {
	serve(mux, api.VersionVerb, func(context.Context, string, api.None) (api.Version, error) { return s.Version(), nil })
	serve(mux, api.ListVerb, func(context.Context, string, api.None) ([]api.VM, error) { return s.List(), nil })
	serve(mux, api.CreateVerb, func(ctx context.Context, _ string, req api.CreateRequest) (api.VM, error) { return s.Create(ctx, req) })
	serve(mux, api.RunVerb, func(ctx context.Context, _ string, req api.RunRequest) (api.ExecResult, error) {
		return s.Run(ctx, req)
	})
	serve(mux, api.PurgeVerb, func(ctx context.Context, _ string, req api.PurgeRequest) (api.PurgeResult, error) {
		return s.Purge(ctx, req.All), nil
	})
	serve(mux, api.InfoVerb, func(ctx context.Context, vm string, _ api.None) (api.VM, error) { return s.Info(ctx, vm) })
	serve(mux, api.DeleteVerb, func(ctx context.Context, vm string, _ api.None) (api.None, error) {
		return api.None{}, s.Delete(ctx, vm)
	})
	serve(mux, api.ExecVerb, s.Exec)
	serve(mux, api.StopVerb, func(ctx context.Context, vm string, _ api.None) (api.VM, error) { return s.Stop(ctx, vm) })
	serve(mux, api.ResumeVerb, s.Resume)
	serve(mux, api.SuspendVerb, func(ctx context.Context, vm string, _ api.None) (api.VM, error) { return s.Suspend(ctx, vm) })
	serve(mux, api.PersistVerb, func(_ context.Context, vm string, req api.PersistRequest) (api.VM, error) {
		return s.Persist(vm, req.Name)
	})
	serve(mux, api.ForkVerb, s.Fork)
	serve(mux, api.ImagesVerb, func(context.Context, string, api.None) ([]api.Image, error) { return s.Images() })
	serve(mux, api.ImageVerb, func(_ context.Context, name string, _ api.None) (api.Image, error) { return s.Image(name) })
	serve(mux, api.DeleteImageVerb, func(_ context.Context, name string, _ api.None) (api.None, error) {
		return api.None{}, s.DeleteImage(name)
	})
	serve(mux, api.PublishVerb, s.Publish)
	serve(mux, api.ReadFileVerb, s.ReadFile)
	serve(mux, api.WriteFileVerb, func(ctx context.Context, vm string, req api.WriteFileRequest) (api.None, error) {
		return api.None{}, s.WriteFile(ctx, vm, req)
	})
	serve(mux, api.SchemaVerb, func(ctx context.Context, _ string, _ api.None) (api.SchemaResult, error) { return s.Schema(ctx, "") })
	serve(mux, api.VMSchemaVerb, func(ctx context.Context, vm string, _ api.None) (api.SchemaResult, error) { return s.Schema(ctx, vm) })
	serve(mux, api.InspectVerb, s.Inspect)
	serve(mux, api.MCPVerb, s.MCP)
	serve(mux, api.MCPServersVerb, func(ctx context.Context, vm string, _ api.None) (api.MCPServersResult, error) {
		return s.MCPServers(ctx, vm)
	})
}

// serve serves verb with handle, its failures answered as the service's
// errors.
func serve[In, Out any](mux *http.ServeMux, verb api.Verb[In, Out], handle func(ctx context.Context, ref string, in In) (Out, error)) {
	api.Handle(mux, verb, handle, writeError)
}

// reply writes out with status, or err with its own.
func reply[T any](w http.ResponseWriter, status int, out T, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, status, out)
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, StatusOf(err), api.Error{Error: err.Error(), Code: CodeOf(err)})
}

// fileReadQuery reads a streamed read's follow=0|1 (default 1, as the JSON
// read follows) and max=N.
func fileReadQuery(q url.Values) (follow bool, max int64, err error) {
	switch f := q.Get("follow"); f {
	case "", "1":
		follow = true
	case "0":
	default:
		return false, 0, badRequest("query parameter follow=%q: want 0 or 1", f)
	}
	if m := q.Get("max"); m != "" {
		if max, err = strconv.ParseInt(m, 10, 64); err != nil || max < 1 {
			return false, 0, badRequest("query parameter max=%q: want a positive byte count", m)
		}
	}
	return follow, max, nil
}

// decode reads one JSON object of at most limit bytes into into, refusing
// unknown fields and trailing data; on failure it answers and says false.
func decode(w http.ResponseWriter, r *http.Request, into any, limit int64) bool {
	if err := api.DecodeBody(w, r, into, limit); err != nil {
		writeError(w, err)
		return false
	}
	return true
}

// logQuery reads ?tail=N&grep=TEXT.
func logQuery(w http.ResponseWriter, r *http.Request) (int, string, bool) {
	tail := 0
	if s := r.URL.Query().Get("tail"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			writeError(w, badRequest("tail=%q: want a positive number of lines", s))
			return 0, "", false
		}
		tail = n
	}
	return tail, r.URL.Query().Get("grep"), true
}

// SlowRequest is how long a request may take before the log notes it
// (capsem_triage ranks what the log notes).
const SlowRequest = 500 * time.Millisecond

// longRoutes take as long as a guest's command or a transfer does, not
// the service: their time is not noted.
var longRoutes = []string{api.RouteVMExec, api.RouteVMExecLive, api.RouteRun, api.RouteRunLive, api.RouteVMTerminal,
	api.RouteVMFileContent, api.RouteVMReadFile, api.RouteVMWriteFile, api.RouteVMMCP}

// answered logs the requests worth a look afterwards: those that failed
// (5xx), were refused (4xx), or took SlowRequest or more.
func (s *Service) answered(r *http.Request, status int, took time.Duration) {
	_, route, _ := strings.Cut(r.Pattern, " ")
	args := []any{"method", r.Method, "route", route, "status", status, "took_ms", took.Milliseconds()}
	switch {
	case status >= 500:
		s.log.Warn("request failed", args...)
	case status >= 400:
		s.log.Info("request refused", args...)
	case took >= SlowRequest && !slices.Contains(longRoutes, route):
		s.log.Info("slow request", args...)
	}
}
